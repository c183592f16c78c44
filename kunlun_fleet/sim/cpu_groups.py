"""CPU groups of lower weight for the work that must yield the cores to the test run's
critical path: the test runner's background lanes (tests/suites.py) and the sim hosts of a
fleet beside the shared one (fleet.py). Made on cgroup v1 (the cpu controller's
cpu.shares, default 1024) and on cgroup v2 (cpu.weight, default 100; Debian 12's default
hierarchy), at the same share of the default weight on both.

Sources: the kernel's Documentation/admin-guide/cgroup-v1/cgroups.rst and cpu.shares in
Documentation/scheduler/sched-design-CFS.rst; cgroup-v2.rst ("cpu.weight", "the root cgroup
is exempt from the no-internal-process constraint", "cgroup.subtree_control" enabling a
controller for the children)."""

import os

ROOT = "/sys/fs/cgroup"
V1_DEFAULT_SHARES = 1024
V2_DEFAULT_WEIGHT = 100


def version(root=ROOT):
    """1, 2, or None: the hierarchy under root (v2: a cgroup.controllers file at the top;
    v1: the cpu controller mounted at root/cpu)."""
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        return 2
    if os.path.exists(os.path.join(root, "cpu", "cpu.shares")):
        return 1
    return None


def weight_v2(shares):
    """cgroup v1 shares as the same fraction of cgroup v2's default weight (1..10000)."""
    return max(1, min(10000, round(shares * V2_DEFAULT_WEIGHT / V1_DEFAULT_SHARES)))


def make(name, shares, root=ROOT):
    """Make (once) the group `name` at the top of the CPU hierarchy with the weight that
    `shares` is on v1; return (its path relative to the hierarchy's root, e.g. "/name",
    which is what `docker create --cgroup-parent` takes under the cgroupfs driver, and its
    cgroup.procs file), or None where this machine has no hierarchy to write (not root, no
    cpu controller, a read-only /sys/fs/cgroup)."""
    try:
        kind = version(root)
        if kind == 1:
            group = os.path.join(root, "cpu", name)
            os.makedirs(group, exist_ok=True)
            with open(os.path.join(group, "cpu.shares"), "w") as fh:
                fh.write(str(shares))
        elif kind == 2:
            with open(os.path.join(root, "cgroup.controllers")) as fh:
                if "cpu" not in fh.read().split():
                    return None
            # The top's children get the cpu controller (a no-op when it already is).
            with open(os.path.join(root, "cgroup.subtree_control")) as fh:
                enabled = fh.read().split()
            if "cpu" not in enabled:
                with open(os.path.join(root, "cgroup.subtree_control"), "w") as fh:
                    fh.write("+cpu")
            group = os.path.join(root, name)
            os.makedirs(group, exist_ok=True)
            with open(os.path.join(group, "cpu.weight"), "w") as fh:
                fh.write(str(weight_v2(shares)))
        else:
            return None
    except OSError:
        return None
    return "/" + name, os.path.join(group, "cgroup.procs")
