"""The sim fleet's Docker engine: Debian's docker.io, started by hand when systemd is not
PID 1, with every piece of state under the sim home. An engine we did not start (the
machine's own, another user's) is never touched: ours has its own socket, data-root,
exec-root, pidfile and default bridge."""

import os
import shutil
import signal
import subprocess
import time

from .config import (
    DOCKER_API_VERSION,
    DOCKER_DATA_ROOT,
    DOCKER_EXEC_ROOT,
    DOCKER_HOST,
    DOCKER_LOG,
    DOCKER_PIDFILE,
    DOCKER_SOCK,
    ENGINE_BRIDGE,
    ENGINE_BRIDGE_CIDR,
    SIM_HOME,
    SimError,
    ensure_home,
    log,
    run,
)

# Machine packages the sim tooling needs (Debian names) and a command proving each.
MACHINE_PACKAGES = {
    "docker.io": "/usr/sbin/dockerd",
    "debootstrap": "/usr/sbin/debootstrap",
    "xfsprogs": "/usr/sbin/mkfs.xfs",
    "iptables": "/usr/sbin/iptables",
    "e2fsprogs": "/usr/sbin/mkfs.ext4",
    "openssh-client": "/usr/bin/ssh-keygen",
}


def docker_cli():
    """Debian's own CLI matches the engine; a newer one is pinned to the engine's API."""
    for path in ("/usr/bin/docker", shutil.which("docker")):
        if path and os.access(path, os.X_OK):
            return path
    raise SimError("no docker CLI found; run `sim-up` to install Debian's docker.io")


def docker_env():
    env = dict(os.environ)
    env["DOCKER_HOST"] = DOCKER_HOST
    env["DOCKER_API_VERSION"] = DOCKER_API_VERSION
    env.pop("DOCKER_CONTEXT", None)
    env.pop("DOCKER_TLS_VERIFY", None)
    return env


def docker(*args, check=True, input=None, timeout=None, capture=True):
    cmd = [docker_cli(), "-H", DOCKER_HOST] + list(args)
    proc = subprocess.run(
        cmd,
        input=input,
        env=docker_env(),
        text=not isinstance(input, bytes),
        timeout=timeout,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and proc.returncode != 0:
        raise SimError(
            "docker %s failed (rc=%d): %s%s"
            % (" ".join(args[:3]), proc.returncode, proc.stdout or "", proc.stderr or "")
        )
    return proc


def ensure_packages():
    """apt-get install what is missing (apt-get update once first)."""
    missing = [pkg for pkg, probe in MACHINE_PACKAGES.items() if not os.path.exists(probe)]
    if not missing:
        return
    if not shutil.which("apt-get"):
        raise SimError("missing %s and no apt-get here: install them by hand" % " ".join(missing))
    log("installing machine packages: %s" % " ".join(missing))
    start = time.time()
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env, timeout=600)
    # No service may be started by a maintainer script: the engine is started by us.
    policy = "/usr/sbin/policy-rc.d"
    made_policy = False
    if not os.path.exists(policy):
        with open(policy, "w") as fh:
            fh.write("#!/bin/sh\n# kunlun-sim: no service starts during package install\nexit 101\n")
        os.chmod(policy, 0o755)
        made_policy = True
    try:
        run(["apt-get", "install", "-y", "-q", "--no-install-recommends"] + missing, env=env, timeout=1200)
    finally:
        if made_policy:
            os.unlink(policy)
    log("packages installed in %.0f s" % (time.time() - start))


def _pid_from_file():
    try:
        with open(DOCKER_PIDFILE) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _is_our_dockerd(pid):
    if pid <= 0:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return bool(argv) and os.path.basename(argv[0]) == b"dockerd" and DOCKER_SOCK.encode() in b" ".join(argv)


def engine_answers():
    if not os.path.exists(DOCKER_SOCK):
        return False
    try:
        return docker("version", "--format", "{{.Server.Version}}", check=False, timeout=10).returncode == 0
    except (subprocess.TimeoutExpired, SimError):
        return False


def _mounts_under(prefix):
    mounts = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            target = line.split()[4].replace("\\040", " ")
            if target == prefix or target.startswith(prefix.rstrip("/") + "/"):
                mounts.append(target)
    return mounts


def unmount_under(prefix):
    """Lazily unmount everything under prefix, deepest first (stale netns, overlay, shm)."""
    for target in sorted(set(_mounts_under(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _ensure_engine_bridge():
    if os.path.isdir("/sys/class/net/" + ENGINE_BRIDGE):
        return
    run(["ip", "link", "add", "name", ENGINE_BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", ENGINE_BRIDGE_CIDR, "dev", ENGINE_BRIDGE])
    run(["ip", "link", "set", ENGINE_BRIDGE, "up"])


def _iptables_works():
    return run(["iptables", "-w", "-L", "FORWARD", "-n"], check=False).returncode == 0


def ensure_engine():
    """Start our dockerd unless it already answers; recover from a killed one."""
    ensure_packages()
    ensure_home()
    if engine_answers():
        return False
    pid = _pid_from_file()
    if _is_our_dockerd(pid):
        log("our dockerd (pid %d) is running but not answering yet; waiting" % pid)
        if _wait_engine(60):
            return False
        raise SimError("dockerd pid %d does not answer on %s; see %s" % (pid, DOCKER_SOCK, DOCKER_LOG))
    if os.path.exists("/run/systemd/system") and os.path.exists("/lib/systemd/system/docker.service"):
        log("note: systemd is PID 1 here, but the sim engine still runs apart from docker.service")
    # Stale state from a dockerd that was killed: pidfile, socket, exec-root mounts.
    for stale in (DOCKER_PIDFILE, DOCKER_SOCK):
        if os.path.lexists(stale):
            log("removing stale %s" % stale)
            os.unlink(stale)
    unmount_under(DOCKER_EXEC_ROOT)
    shutil.rmtree(DOCKER_EXEC_ROOT, ignore_errors=True)
    # Stale container mounts in the data-root (overlay, shm) would keep the old layers busy.
    unmount_under(os.path.join(DOCKER_DATA_ROOT, "overlay2"))
    unmount_under(os.path.join(DOCKER_DATA_ROOT, "containers"))
    if not _iptables_works() and os.path.exists("/usr/sbin/iptables-legacy"):
        log("iptables (nft) does not work on this kernel; switching to iptables-legacy")
        run(["update-alternatives", "--set", "iptables", "/usr/sbin/iptables-legacy"])
        run(["update-alternatives", "--set", "ip6tables", "/usr/sbin/ip6tables-legacy"], check=False)
    _ensure_engine_bridge()
    cmd = [
        "/usr/sbin/dockerd",
        "--host",
        DOCKER_HOST,
        "--data-root",
        DOCKER_DATA_ROOT,
        "--exec-root",
        DOCKER_EXEC_ROOT,
        "--pidfile",
        DOCKER_PIDFILE,
        "--bridge",
        ENGINE_BRIDGE,
        "--log-level",
        "warn",
    ]
    log("starting dockerd: %s" % " ".join(cmd))
    logfh = open(DOCKER_LOG, "ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=logfh, stderr=logfh, start_new_session=True, close_fds=True, env=env
    )
    logfh.close()
    if not _wait_engine(90):
        raise SimError("dockerd did not answer on %s within 90 s; see %s" % (DOCKER_SOCK, DOCKER_LOG))
    log("engine up: %s" % docker("version", "--format", "{{.Server.Version}}").stdout.strip())
    return True


def _wait_engine(seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if engine_answers():
            return True
        time.sleep(0.5)
    return False


def stop_engine():
    """Stop our dockerd (only ours, by its pidfile) and unmount what it left."""
    pid = _pid_from_file()
    if _is_our_dockerd(pid):
        log("stopping our dockerd (pid %d)" % pid)
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + 60
        while time.time() < deadline and os.path.exists("/proc/%d" % pid):
            time.sleep(0.5)
        if os.path.exists("/proc/%d" % pid):
            os.kill(pid, signal.SIGKILL)
    unmount_under(DOCKER_EXEC_ROOT)
    unmount_under(DOCKER_DATA_ROOT)
    if os.path.isdir("/sys/class/net/" + ENGINE_BRIDGE):
        run(["ip", "link", "del", ENGINE_BRIDGE], check=False)


def purge_engine_data():
    unmount_under(SIM_HOME)
    for path in (DOCKER_DATA_ROOT, DOCKER_EXEC_ROOT):
        run(["rm", "-rf", "--one-file-system", path], check=False)
