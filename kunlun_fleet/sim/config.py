"""Paths, names and small process helpers shared by the simulated-fleet tooling.

Everything the sim fleet owns lives under one directory, ``KUNLUN_SIM_HOME``
(default ``/var/lib/kunlun-sim``): the engine's data-root, exec-root, socket and
pidfile, the data-disk files, the SSH key, the build scratch and the bundle.

What the test fleet builds or downloads from unchanged inputs is kept in one cache
directory, ``KUNLUN_FLEET_CACHE`` (default ``$KUNLUN_SIM_HOME/cache``), each artifact under
a key that hashes its inputs (docs/testing.md, "Caches"): it outlives a clone, `sim-down`
and `sim-down --purge`; removing it rebuilds everything.
"""

import fcntl
import os
import subprocess
import sys
import time
from contextlib import contextmanager

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM_HOME = os.path.abspath(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"))

# Engine (our own dockerd; any other engine on the machine is left alone).
DOCKER_SOCK = os.path.join(SIM_HOME, "docker.sock")
DOCKER_HOST = "unix://" + DOCKER_SOCK
DOCKER_DATA_ROOT = os.path.join(SIM_HOME, "docker")
DOCKER_EXEC_ROOT = os.path.join(SIM_HOME, "exec")
DOCKER_PIDFILE = os.path.join(SIM_HOME, "dockerd.pid")
DOCKER_LOG = os.path.join(SIM_HOME, "dockerd.log")
# The engine's default bridge: our own, so a second engine never touches docker0.
ENGINE_BRIDGE = "kfsim-docker0"
ENGINE_BRIDGE_CIDR = "172.31.251.1/24"
# Debian 12's engine speaks API 1.41; a newer CLI earlier on PATH is pinned to it.
DOCKER_API_VERSION = "1.41"

# The sim hosts' network.
NETWORK = "kunlun-sim"
NETWORK_BRIDGE = "kfsim0"
SUBNET = "172.31.250.0/24"
GATEWAY = "172.31.250.1"
IPTABLES_COMMENT = "kunlun-sim"

# Hosts.
CONTAINER_PREFIX = "kf-sim-"
HOSTNAME_PREFIX = "kf-node-"
LABEL = "org.kunlun-fleet.sim"
DISK_SIZE = "14T"
DISK_DEVICE = "/dev/vdb"
DISKS_DIR = os.path.join(SIM_HOME, "disks")
SSH_DIR = os.path.join(SIM_HOME, "ssh")
SSH_KEY = os.path.join(SSH_DIR, "id_ed25519")
STATE_FILE = os.path.join(SIM_HOME, "state.json")
LOCK_FILE = os.path.join(SIM_HOME, "lock")
BUILD_DIR = os.path.join(SIM_HOME, "build")
CACHE_DIR = os.path.abspath(os.environ.get("KUNLUN_FLEET_CACHE") or os.path.join(SIM_HOME, "cache"))
BUNDLE_DIR = os.path.join(SIM_HOME, "bundle")
OLD_DRIVERS_DIR = os.path.join(SIM_HOME, "old-drivers")
# Tag written into the lo_file_name of every loop device the in-host LVM kit attaches.
KIT_LOOP_TAG = "kunlun-kit:"

INVENTORY_DIR = os.path.join(REPO_ROOT, "inventories", "sim")
KIT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kit")
KIT_ROOTFS = os.path.join(KIT_DIR, "rootfs")


def host_address(index):
    """Fixed address of sim host ``index`` (1-based)."""
    return "172.31.250.%d" % (10 + index)


def container_name(index):
    return "%s%d" % (CONTAINER_PREFIX, index)


def host_name(index):
    return "%s%d" % (HOSTNAME_PREFIX, index)


def index_of(name):
    """1-based index from a container name, host name or bare number; None if neither."""
    for prefix in (CONTAINER_PREFIX, HOSTNAME_PREFIX, ""):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            value = int(name[len(prefix) :])
            return value if value > 0 else None
    return None


class SimError(Exception):
    """A failure with a message that names the thing and the fix."""


def log(msg):
    sys.stderr.write("[sim %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def run(cmd, check=True, capture=True, input=None, env=None, timeout=None):
    """Run a command; return CompletedProcess (text). Raise SimError on failure if check."""
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.run(
            cmd,
            input=input,
            env=full_env,
            timeout=timeout,
            text=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        )
    except FileNotFoundError as exc:
        raise SimError("command not found: %s (%s)" % (cmd[0], exc)) from exc
    if check and proc.returncode != 0:
        raise SimError(
            "command failed (rc=%d): %s\n%s%s" % (proc.returncode, " ".join(cmd), proc.stdout or "", proc.stderr or "")
        )
    return proc


def ensure_home():
    for path in (SIM_HOME, DISKS_DIR, SSH_DIR, BUILD_DIR):
        os.makedirs(path, exist_ok=True)
    os.chmod(SSH_DIR, 0o700)


@contextmanager
def locked():
    """Serialise every command that changes the fleet (several users share one fleet)."""
    ensure_home()
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another sim command holds %s; waiting for it" % LOCK_FILE)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
