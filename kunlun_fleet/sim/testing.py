"""Pytest fixtures and helpers for suites that use the simulated fleet.

Fixtures: ``sim_fleet`` (ONE 3-host fleet per session: `sim-up 3` once, kept after the
session unless KF_SIM_TEARDOWN=1) and ``fresh_host`` (reset a host, optionally with fault
switches; the session resets it again when it ends). Load them everywhere with
``pytest_plugins = ["kunlun_fleet.sim.testing"]`` in the top-level tests/conftest.py.
Helpers reach hosts the way the product does: ansible / ssh with checked host keys.

A scratch lane (tests/suites.py) gives a suite a host of its own instead of one of the
shared fleet's: KF_SIM_INVENTORY names that host's own inventory (a one-host fleet) and
KF_LANE_HOST the host (kf-node-N). A suite written for "its host" asks ``lane_host(N)``:
the scratch host when it has one, else kf-node-N of the shared fleet."""

import contextlib
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from . import config
from .config import REPO_ROOT as REPO

# The inventory of the fleet this session tests: a scratch lane's own, or the shared one.
INVENTORY = os.environ.get("KF_SIM_INVENTORY") or config.INVENTORY_DIR
LANE_HOST = os.environ.get("KF_LANE_HOST") or None

VENV_BIN = os.path.dirname(sys.executable)
PLAYBOOKS = os.path.join(REPO, "tests", "sim", "playbooks")


def sim(*args, check=True):
    """Run a sim CLI command; return CompletedProcess with combined output."""
    proc = subprocess.run(
        [sys.executable, "-m", "kunlun_fleet.sim"] + list(args),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError("sim %s failed (rc=%d):\n%s" % (" ".join(args), proc.returncode, proc.stdout))
    return proc


def lane_host(default_index):
    """(index, host name) of the host this suite owns: the scratch lane's (KF_LANE_HOST),
    or kf-node-<default_index> of the shared fleet."""
    if LANE_HOST:
        index = config.index_of(LANE_HOST)
        if index is None:
            raise ValueError("KF_LANE_HOST=%r is not a sim host name (kf-node-N)" % LANE_HOST)
        return index, config.host_name(index)
    return default_index, config.host_name(default_index)


def closing_resets():
    """Whether a suite resets the hosts it used when it ends. Not in a scratch lane: there
    every suite resets its host first (tests/suites.py), so a closing reset would only be
    undone by the next suite's opening one."""
    return not LANE_HOST


def _env():
    from kunlun_fleet import vault

    return dict(
        vault.vault_env(INVENTORY),
        ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
        ANSIBLE_DEPRECATION_WARNINGS="False",
        ANSIBLE_NOCOLOR="1",
    )


def ansible(*args, check=True):
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "ansible"), "-i", INVENTORY] + list(args),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError("ansible %s failed:\n%s" % (" ".join(args), proc.stdout))
    return proc


def playbook(name, *args, check=True):
    """Run tests/sim/playbooks/<name>; return (proc, {host: recap dict})."""
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, os.path.join(PLAYBOOKS, name)] + list(args),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError("ansible-playbook %s failed:\n%s" % (name, proc.stdout))
    return proc, recap(proc.stdout)


def recap(text):
    """{host: {ok, changed, unreachable, failed, ...}} from the last PLAY RECAP in text.

    Host lines only: the task-timing summary after the recap has "role : task" lines."""
    hosts = {}
    for line in text.split("PLAY RECAP")[-1].splitlines():
        m = re.match(r"^(\S+)\s+:\s+(ok=.*)$", line.strip())
        if m:
            hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return hosts


def ssh(host_index, command, check=True, timeout=120):
    """Run a shell command on a sim host over SSH, host key checked. `timeout` only guards
    against a hang: a scratch lane's host runs at a low CPU weight beside the whole run."""
    from kunlun_fleet.sim import fleet

    proc = subprocess.run(
        fleet.ssh_cmd(host_index, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            "ssh kf-node-%d %r failed (rc=%d): %s%s" % (host_index, command, proc.returncode, proc.stdout, proc.stderr)
        )
    return proc


@contextlib.contextmanager
def tunnel(host_index, remote_port, remote_host="127.0.0.1", timeout=60):
    """An SSH tunnel from this machine to a port a sim host serves on its own loopback,
    the way an operator reaches Prometheus (docs/monitoring.md, "Reaching Prometheus"):
    `ssh -N -L 127.0.0.1:LOCAL:remote_host:remote_port`, host key checked. Yields LOCAL
    once it accepts connections; the tunnel ends with the block."""
    from . import fleet

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local = probe.getsockname()[1]
    argv = fleet.ssh_cmd(host_index)
    forward = "127.0.0.1:%d:%s:%d" % (local, remote_host, remote_port)
    argv = argv[:1] + ["-N", "-o", "ExitOnForwardFailure=yes", "-L", forward] + argv[1:]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError("ssh -L %s to kf-node-%d ended: %s" % (forward, host_index, proc.stderr.read()))
            try:
                socket.create_connection(("127.0.0.1", local), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("ssh -L %s to kf-node-%d never listened" % (forward, host_index)) from None
                time.sleep(0.2)
        yield local
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@contextlib.contextmanager
def admitted(*host_indexes):
    """This machine (the controller) admitted to vLLM's port of these sim hosts for the block,
    then taken out, the way the product admits it while it measures a host directly
    (roles/firewall, entry point admit, through tests/sim/playbooks/admit.yml): the host
    firewall opens that port to the gateways and the monitoring hosts only."""
    hosts = ",".join(config.host_name(i) for i in host_indexes)
    playbook("admit.yml", "-e", "admit_hosts=%s" % hosts, "-e", "admit_state=present")
    try:
        yield
    finally:
        playbook("admit.yml", "-e", "admit_hosts=%s" % hosts, "-e", "admit_state=absent")


def refuse_port(host_index, port, on, chain="INPUT", silent=False):
    """A dead link for one TCP port of a sim host, open connections included: a REJECT
    (tcp-reset) rule inside the host, or with silent a DROP (no answer at all: a network
    fault), set through the sim engine, not over the SSH it may cut. INPUT 22 loses the
    host for Ansible; OUTPUT <port> cuts its own connections out. Needs iptables in the
    host (the engine stage installs it with docker.io)."""
    from . import config, engine

    target = ["DROP"] if silent else ["REJECT", "--reject-with", "tcp-reset"]
    rule = [chain, "-p", "tcp", "--dport", str(port), "-j"] + target
    engine.docker("exec", config.container_name(host_index), "iptables", "-I" if on else "-D", *rule, check=on)


def loaded_driver(host_index):
    """The XRE driver version xpu-smi prints on a sim host (the loaded module's)."""
    out = ssh(host_index, "xpu-smi").stdout
    found = re.search(r"Driver Version:\s*(\S+)", out)
    return found.group(1) if found else None


@pytest.fixture(scope="session")
def sim_fleet():
    """The session's fleet: the shared 3-host fleet, or a scratch lane's one host (brought up
    once; torn down only with KF_SIM_TEARDOWN=1)."""
    if os.geteuid() != 0:
        pytest.skip("the sim fleet needs root (loop devices, its own dockerd)")
    if LANE_HOST:
        # A scratch lane: its one host in an inventory of its own (the fleet beside the
        # shared one yields the CPU to it). A host that answers is left as the last suite
        # left it (sim-up would recreate one whose fault switches differ from none: every
        # suite of the lane resets its host first anyway).
        from . import fleet

        index, _ = lane_host(0)
        if os.path.exists(os.path.join(INVENTORY, "hosts.yml")) and fleet.ssh_ok(index):
            yield None
        else:
            yield sim("sim-up", "1", "--first", str(index), "--inventory", INVENTORY)
    elif os.environ.get("KF_SIM_FLEET_UP") == "1":
        # tests/suites.py's phase 2: phase 1 brought the fleet up (sim-up --refresh) and
        # each lane now owns one host. A sim-up here would check the other lanes' hosts too,
        # and fail on one that a test of its lane is rebooting.
        yield None
    else:
        # --refresh: the session tests the current kit, not hosts made from an older image.
        yield sim("sim-up", "3", "--refresh")
    if os.environ.get("KF_SIM_TEARDOWN") == "1":
        sim(*(["sim-down", "--inventory", INVENTORY] if LANE_HOST else ["sim-down"]))


@pytest.fixture(scope="session")
def _hosts_to_reset(sim_fleet):
    """The hosts fresh_host handed out in this session, reset once when it ends so the next
    session finds them fresh. Not after each test: every fresh_host call resets its host
    first anyway, so a reset between two tests of the same host was done twice (about 15 s
    each, five or more times per fault suite)."""
    used = set()
    yield used
    if used and closing_resets():
        sim("sim-reset", *[str(index) for index in sorted(used)], check=False)


@pytest.fixture
def fresh_host(_hosts_to_reset):
    """Factory: reset a host (fresh container and disk, optional faults) for a test. The
    session resets it again at its end (_hosts_to_reset)."""

    def make(index, *faults):
        args = ["sim-reset", str(index)]
        for fault in faults:
            args += ["--fault", fault]
        sim(*args)
        _hosts_to_reset.add(index)
        return index

    yield make


def router_venv(venv):
    """The pinned vllm-router (kunlun_stack_gateway_router) from the sim's wheelhouse
    (downloaded once into the sim cache when absent, as the sim bundle's build does), in a
    venv of the tests' own Python at `venv`; returns its vllm-router executable."""
    import yaml

    from . import bundle

    pins = yaml.safe_load(open(os.path.join(REPO, "roles/kunlun_stack/defaults/main.yml")))
    pin = pins["kunlun_stack_gateway_router"]
    assert "%d.%d" % sys.version_info[:2] == str(pin["python"]), (
        "the router's wheelhouse is for CPython %s; these tests run on %s" % (pin["python"], sys.version.split()[0])
    )
    wheelhouse = bundle.fetch_wheelhouse(pins)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [os.path.join(str(venv), "bin/pip"), "install", "-q", "--no-index", "--find-links", wheelhouse,
         "%s==%s" % (pin["package"], pin["version"])],
        check=True,
    )  # fmt: skip
    return os.path.join(str(venv), "bin", "vllm-router")


# The workers serve TLS with certificates of the inventory's fleet CA (docs/gateway.md,
# "Workers over TLS"): its certificate on the controller (kunlun_stack_fleet_pki_dir, which
# sim-up's group_vars/all/pki.yml names) and on every host (kunlun_stack_fleet_ca_host_path).
FLEET_CA = os.path.join(INVENTORY, ".image-registry-pki", "ca.crt")
HOST_CA = "/etc/kunlun-fleet/ca.crt"
SERVING_PORT = 8000


def worker_url(host_index, port=SERVING_PORT):
    """A serving host's vllm as the gateways list it: https://<address>:<port>."""
    return "https://%s:%d" % (config.host_address(host_index), port)


def worker_open(url, data=None, headers=None, timeout=10):
    """urllib's urlopen for a worker: no proxy, its certificate verified with FLEET_CA alone."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=FLEET_CA)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    return opener.open(urllib.request.Request(url, data=data, headers=headers or {}), timeout=timeout)


def host_curl(path="/health", port=SERVING_PORT):
    """The curl a sim host runs to ask its own vllm (over TLS, verified with the host's copy
    of the fleet CA's certificate): `host_curl('/health')` in an ssh command."""
    return "curl --cacert %s https://127.0.0.1:%d%s" % (HOST_CA, port, path)
