"""The simulated fleet: sim-up / sim-status / sim-down / sim-reset.

One sim engine can hold more than one fleet: a fleet is an inventory directory and the
range of host indexes it owns (`sim-up N --first K --inventory DIR`). The default fleet
is hosts 1..N in the repository's inventories/sim; another fleet (the large test lane's
twelve hosts, say) lives beside it without either one's sim-up, sim-reset or sim-down
touching the other's hosts.

A sim host is a container booting systemd (not --privileged: the machine's bounding set
lacks CAP_SYS_RESOURCE) on the project bridge network with a fixed address, reached over
SSH with a generated key and checked host keys, with a sparse 14T data disk (a file
attached as a loop device) at /dev/vdb.
"""

import json
import os
import secrets
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import yaml

from . import base_python, cpu_groups, engine, image, loopdev
from .config import (
    BUNDLE_DIR,
    CONTAINER_PREFIX,
    KIT_DIR,
    DISK_DEVICE,
    DISK_SIZE,
    DISKS_DIR,
    GATEWAY,
    INVENTORY_DIR,
    IPTABLES_COMMENT,
    LABEL,
    NETWORK,
    NETWORK_BRIDGE,
    OLD_DRIVERS_DIR,
    ENGINE_BRIDGE,
    SIM_HOME,
    SSH_KEY,
    STATE_FILE,
    SUBNET,
    SimError,
    container_name,
    ensure_home,
    host_address,
    host_name,
    index_of,
    locked,
    log,
    run,
)
from .engine import docker

# Fault switches. The kit reads /etc/kunlun-kit/faults inside the host; the ones marked
# "machine" are applied by this module when it makes the host.
KNOWN_FAULTS = {
    "xpu_devices": "XPU kit: number of P800 devices visible (default 8), e.g. 7",
    "xpu_error_device": "XPU kit: index of a device reported in error",
    "xpu_card_variant": "XPU kit: card variant (VD, or mixed)",
    "xpu_firmware": "XPU kit: firmware version reported by the devices",
    "xpu_power_cap": "XPU kit: power cap in W (P800 full 400, low-power mode 120) of every card (120), "
    "or of some (3:120 or 3:120,5:120); N/A for an unreadable cap",
    "xpu_smi_build": "XPU kit: an xpu-smi build whose header (table and -q) prints this Driver Version and "
    "XPU-RT Version N/A, e.g. 515.58",
    "xpu_old_driver": "machine: install and load this older XRE version in the host after boot",
    "no_kernel_headers": "kit: /usr/src/linux-headers-$(uname -r) and /lib/modules/*/build removed",
    "disk_has_fs": "machine: the data disk already holds an ext4 filesystem (label olddata)",
    "home_content": "kit: /home seeded with users' files (sparse file, hardlinks, odd names, ACL)",
    "home_lvm": "kit: /home is an existing LVM volume (vg0/lv_home on the data disk, fstab by /dev/mapper path) "
    "holding users' files: xfs, ext4, or xfs_ftype0 (XFS that overlay2 cannot use)",
    "home_lvm_free": "kit: percent of vg0 home_lvm leaves free (room to grow), e.g. 20",
    "docker_content": "kit: /var/lib/docker seeded with a named volume holding data",
    "password_only": "machine: a server before first contact: root logs in with the password SIM_ROOT_PASSWORD "
    "(sshd allows it), the controller's key is not in root's authorized_keys",
}
# The root password of a password_only host: a fixed test password of the sim fleet (its
# hosts live on this machine's private bridge), documented in kunlun_fleet/sim/README.md.
SIM_ROOT_PASSWORD = "kunlun-sim-root"
PASSWORD_ONLY_SSHD = (
    "# Sim kit, fault password_only: a server before first contact (root logs in with a\n"
    "# password; `kunlun-fleet bootstrap` installs the controller's key).\n"
    "PermitRootLogin yes\nPasswordAuthentication yes\n"
)
BOOT_TIMEOUT = 180
# Host addresses are 172.31.250.(10 + index) in a /24.
MAX_INDEX = 240
# Hosts created at once by sim-up (docker create/cp/start and a disk file each).
CREATE_WORKERS = 6


# ---------------------------------------------------------------- state
def load_state():
    try:
        with open(STATE_FILE) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"hosts": {}}


def save_state(state):
    tmp = STATE_FILE + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=2, sort_keys=True)
    os.rename(tmp, STATE_FILE)


def parse_fault(text, default_host=None):
    """'HOST:NAME=VALUE' (or 'NAME=VALUE' with default_host) -> (index, name, value)."""
    host = default_host
    spec = text
    if ":" in text.split("=", 1)[0]:
        host, spec = text.split(":", 1)
    if "=" not in spec:
        spec += "=1"
    name, value = spec.split("=", 1)
    index = index_of(str(host)) if host is not None else None
    if index is None or not name or not name.replace("_", "").isalnum():
        raise SimError(
            "bad fault %r: write HOST:NAME=VALUE, e.g. kf-node-2:xpu_devices=7 "
            "(names: %s)" % (text, ", ".join(sorted(KNOWN_FAULTS)))
        )
    if name not in KNOWN_FAULTS:
        log("note: fault %s is not one sim-up knows; passed to the kit as is" % name)
    return index, name, value


# ---------------------------------------------------------------- which fleet a host is in
def fleet_key(inventory):
    """ "" for the repository's sim inventory (whichever checkout runs the command: a CI
    clone takes over the hosts a developer's checkout made), else the inventory's path."""
    path = os.path.abspath(inventory)
    return "" if path == INVENTORY_DIR else path


def inventory_dir(key):
    return key or INVENTORY_DIR


def owner(index, existing=None, state=None):
    """The fleet key of host ``index``: its container's label, else the state file's record."""
    item = (existing or {}).get(index)
    if item is not None:
        return (item["Config"]["Labels"] or {}).get(LABEL + ".fleet", "")
    record = (state if state is not None else load_state()).get("hosts", {}).get(str(index)) or {}
    return record.get("fleet", "")


def override_faults(index, inventory=INVENTORY_DIR):
    """sim_faults from <inventory>/host_vars/<host>/faults.yml (kept by sim-up)."""
    path = os.path.join(inventory, "host_vars", host_name(index), "faults.yml")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    faults = data.get("sim_faults") or {}
    if not isinstance(faults, dict):
        raise SimError("%s: sim_faults must be a mapping NAME: VALUE" % path)
    return {str(k): str(v) for k, v in faults.items()}


# ---------------------------------------------------------------- machine pieces
def ensure_key():
    ensure_home()
    if not os.path.exists(SSH_KEY):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kunlun-sim", "-f", SSH_KEY])
    with open(SSH_KEY + ".pub") as fh:
        return fh.read().strip()


def _iptables_rules():
    return [
        ["FORWARD", "-i", NETWORK_BRIDGE, "-m", "comment", "--comment", IPTABLES_COMMENT, "-j", "ACCEPT"],
        ["FORWARD", "-o", NETWORK_BRIDGE, "-m", "comment", "--comment", IPTABLES_COMMENT, "-j", "ACCEPT"],
    ]


def ensure_network():
    if docker("network", "inspect", NETWORK, check=False).returncode != 0:
        log("creating network %s (%s) on bridge %s" % (NETWORK, SUBNET, NETWORK_BRIDGE))
        docker(
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            SUBNET,
            "--gateway",
            GATEWAY,
            "-o",
            "com.docker.network.bridge.name=" + NETWORK_BRIDGE,
            "--label",
            LABEL + "=1",
            NETWORK,
        )
    # dockerd sets the FORWARD policy to DROP; our bridge's traffic is accepted explicitly.
    for rule in _iptables_rules():
        if run(["iptables", "-w", "-C"] + rule, check=False).returncode != 0:
            run(["iptables", "-w", "-I"] + rule[:1] + ["1"] + rule[1:])


def remove_iptables():
    """Delete our rules and any rule dockerd made for our bridges or subnets."""
    for rule in _iptables_rules():
        while run(["iptables", "-w", "-C"] + rule, check=False).returncode == 0:
            run(["iptables", "-w", "-D"] + rule, check=False)
    marks = (NETWORK_BRIDGE + " ", ENGINE_BRIDGE + " ", "172.31.250.", "172.31.251.")
    for table in ("filter", "nat"):
        out = run(["iptables", "-w", "-t", table, "-S"], check=False).stdout or ""
        for line in out.splitlines():
            if line.startswith("-A ") and any(m in line + " " for m in marks):
                run(["iptables", "-w", "-t", table, "-D"] + line[3:].split(), check=False)


def disk_path(index):
    return os.path.join(DISKS_DIR, "%s.img" % container_name(index))


def release_host_disk(index):
    loopdev.release_disk(disk_path(index), container_name(index))


def make_disk(index, faults):
    """A fresh sparse 14T file attached as a loop device; returns /dev/loopN."""
    path = disk_path(index)
    release_host_disk(index)
    if os.path.exists(path):
        os.unlink(path)
    run(["truncate", "-s", DISK_SIZE, path])
    dev = loopdev.attach_file(path)
    if faults.get("disk_has_fs") not in (None, "", "0"):
        log("fault disk_has_fs: ext4 (label olddata) on %s's data disk" % host_name(index))
        run(["mkfs.ext4", "-q", "-F", "-L", "olddata", "-E", "lazy_itable_init=1,lazy_journal_init=1", dev, "1G"])
    return dev


# ---------------------------------------------------------------- containers
def containers():
    """{index: inspect dict} of every sim container (running or not)."""
    ids = docker("ps", "-aq", "--filter", "label=" + LABEL, check=False).stdout.split()
    found = {}
    if not ids:
        return found
    # Another lane may remove a container between the listing and the inspect (a scratch
    # host's reset, the large fleet's sim-down): docker then prints the others and fails
    # with "No such object" for that one, which is simply gone.
    proc = docker("inspect", *ids, check=False)
    if proc.returncode != 0 and "no such object" not in (proc.stderr or "").lower():
        raise SimError("docker inspect of the sim containers failed (rc=%d): %s" % (proc.returncode, proc.stderr))
    data = json.loads(proc.stdout or "[]")
    for item in data:
        index = index_of(item["Name"].lstrip("/"))
        if index is not None:
            found[index] = item
    return found


def remove_container(index):
    name = container_name(index)
    if docker("inspect", name, check=False).returncode == 0:
        docker("rm", "-f", "-v", name, check=False, timeout=120)


# The hosts of a fleet beside the shared one (the test runner's scratch and large lanes) run
# in a CPU group of their own beside docker's (cgroup v1 or v2, the engine's cgroupfs driver:
# `docker create --cgroup-parent`), at an eighth of its weight: on a busy machine the
# shared fleet's hosts, whose suites make a test run's critical path, get the cores first;
# idle cores still go to whoever wants them. Inside docker's own group, a low --cpu-shares
# alone did not do that: whenever the shared hosts were idle, the beside hosts took the
# whole of docker's weight, as much as the critical path's controller.
BESIDE_CGROUP = "/kunlun-sim-beside"
BESIDE_CPU_SHARES = 128


def beside_cgroup(root=cpu_groups.ROOT):
    """The cgroup parent for a beside fleet's hosts, made with its CPU weight, or None where
    this machine has no CPU hierarchy to write (the hosts then get the weight as their own
    --cpu-shares inside docker's group)."""
    made = cpu_groups.make(BESIDE_CGROUP.lstrip("/"), BESIDE_CPU_SHARES, root)
    return made[0] if made else None


def create_host(index, tag, faults, pubkey, fleet=""):
    name = container_name(index)
    remove_container(index)
    dev = make_disk(index, faults)
    token = "%s.%s" % (name, secrets.token_hex(3))
    fault_text = "".join("%s=%s\n" % kv for kv in sorted(faults.items()))
    files = {
        "etc/kunlun-kit/faults": (fault_text.encode(), 0o644),
        "etc/kunlun-kit/host.conf": (("disk_token=%s\nhost=%s\n" % (token, host_name(index))).encode(), 0o644),
    }
    if password_only(faults):
        log("fault password_only: %s has a root password and not the controller's key" % host_name(index))
        files["etc/ssh/sshd_config.d/kunlun-kit-password-only.conf"] = (PASSWORD_ONLY_SSHD.encode(), 0o644)
    else:
        files["root/.ssh/authorized_keys"] = ((pubkey + "\n").encode(), 0o600)
    args = [
        "create",
        "--name",
        name,
        "--hostname",
        host_name(index),
        "--network",
        NETWORK,
        "--ip",
        host_address(index),
        "--network-alias",
        host_name(index),
        "--label",
        LABEL + "=1",
        "--label",
        LABEL + ".token=" + token,
        "--label",
        LABEL + ".faults=" + json.dumps(faults, sort_keys=True),
        "--label",
        LABEL + ".disk=" + disk_path(index),
        "--label",
        LABEL + ".fleet=" + fleet,
        "--cap-add",
        "ALL",
        "--cap-drop",
        "SYS_RESOURCE",
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "--security-opt",
        "systempaths=unconfined",
        "--device-cgroup-rule",
        "a *:* rwm",
        "--cgroupns",
        "host",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/run/lock",
        "--stop-signal",
        "SIGRTMIN+3",
        "--stop-timeout",
        "60",
        "--device",
        "%s:%s" % (dev, DISK_DEVICE),
        "-e",
        "container=docker",
    ]
    if fleet:
        # A fleet beside the shared one (the tests' scratch and large lanes) yields the CPU to it.
        parent = beside_cgroup()
        args += ["--cgroup-parent", parent] if parent else ["--cpu-shares", str(BESIDE_CPU_SHARES)]
    args += [tag, "/sbin/init"]
    docker(*args)
    payload = image.tar_bytes(files, dirs=[("root/.ssh", 0o700)])
    docker("cp", "-", name + ":/", input=payload)
    docker("start", name)
    return {
        "index": index,
        "token": token,
        "faults": faults,
        "image": tag,
        "fleet": fleet,
        "disk": disk_path(index),
        "loop": dev,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def create_side_by_side(todo, tag, pubkey, fleet_of, state):
    """Create the hosts of todo ([(index, faults)]) side by side (each is a few docker
    calls and a disk file; their boots overlap): a 12-host lane starts in about the time of
    a few hosts, not twelve. fleet_of: {index: fleet key}. Records every host created in
    state (saved), also when another failed; returns the failures' messages."""
    with ThreadPoolExecutor(max_workers=CREATE_WORKERS) as pool:
        futures = [
            (index, pool.submit(create_host, index, tag, faults, pubkey, fleet_of[index])) for index, faults in todo
        ]
    errors = []
    for index, future in futures:
        if future.exception():
            errors.append("%s: %s" % (host_name(index), future.exception()))
        else:
            state["hosts"][str(index)] = future.result()
    save_state(state)
    return errors


def systemd_state(index):
    proc = docker("exec", container_name(index), "systemctl", "is-system-running", check=False, timeout=30)
    return (proc.stdout or "").strip() or "unknown"


def _port_open(addr, port=22):
    try:
        with socket.create_connection((addr, port), timeout=2) as sock:
            sock.settimeout(2)
            return sock.recv(4).startswith(b"SSH")
    except OSError:
        return False


def wait_ready(index):
    """Wait for systemd running/degraded and sshd answering; return systemd's state."""
    deadline = time.time() + BOOT_TIMEOUT
    state = "unknown"
    while time.time() < deadline:
        state = systemd_state(index)
        if state in ("running", "degraded") and _port_open(host_address(index)):
            if state == "degraded":
                failed = docker(
                    "exec", container_name(index), "systemctl", "--failed", "--no-legend", "--plain", check=False
                ).stdout.strip()
                log("%s is degraded; failed units: %s" % (host_name(index), failed.replace("\n", "; ")))
            return state
        if state in ("maintenance", "stopping"):
            break
        time.sleep(0.5)
    logs = docker("logs", "--tail", "40", container_name(index), check=False)
    raise SimError(
        "%s did not boot (systemd: %s); last console lines:\n%s%s" % (host_name(index), state, logs.stdout, logs.stderr)
    )


def host_keys(index):
    out = docker("exec", container_name(index), "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub").stdout
    return [" ".join(line.split()[:2]) for line in out.splitlines() if line.strip()]


def ssh_cmd(index, *command):
    known_hosts = known_hosts_path(inventory_dir(owner(index)))
    return [
        "ssh",
        "-i",
        SSH_KEY,
        "-o",
        "UserKnownHostsFile=" + known_hosts,
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        # A beside fleet's host runs at a low CPU weight: its sshd may take seconds to
        # answer on a busy machine. A dead host still fails at once (refused, no route).
        "ConnectTimeout=20",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "root@" + host_address(index),
    ] + list(command)


def ssh_ok(index):
    return run(ssh_cmd(index, "true"), check=False, timeout=30).returncode == 0


def password_only(faults):
    return (faults or {}).get("password_only") not in (None, "", "0")


def apply_password_only(index):
    """Fault password_only, after boot: root's password (through chpasswd's stdin)."""
    docker("exec", "-i", container_name(index), "chpasswd", input="root:%s\n" % SIM_ROOT_PASSWORD, timeout=60)


def password_only_problem(index):
    """None when a password_only host is as meant: root logs in with SIM_ROOT_PASSWORD
    and not with the sim key, the host key checked against its fleet's known_hosts."""
    import paramiko

    known = known_hosts_path(inventory_dir(owner(index)))

    def login(**auth):
        client = paramiko.SSHClient()
        client.load_host_keys(known)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                host_address(index),
                username="root",
                look_for_keys=False,
                allow_agent=False,
                timeout=10,
                banner_timeout=10,
                auth_timeout=10,
                **auth,
            )
            return True
        except paramiko.AuthenticationException:
            return False
        finally:
            client.close()

    try:
        if not login(password=SIM_ROOT_PASSWORD):
            return "root's password login fails"
        if login(key_filename=SSH_KEY):
            return "the sim key still logs in"
    except Exception as exc:  # host key refused, no answer
        return "%s: %s" % (type(exc).__name__, exc)
    return None


def ssh_as_meant(index, faults):
    """SSH to the host works as its faults mean: with the key and checked host keys, or
    (password_only) with the password and not the key."""
    if password_only(faults):
        problem = password_only_problem(index)
        if problem:
            log("%s (password_only): %s" % (host_name(index), problem))
        return problem is None
    return ssh_ok(index)


def drop_control_masters(indexes):
    """Persistent SSH connections (Ansible's ControlPersist) to a recreated host are dead
    ends: close them. Ansible names them sha1("<host>-<port>-<user>")[:10] (port None when
    unset); "%h-%p-%r" is the other common ControlPath."""
    import hashlib

    cpdir = os.path.expanduser("~/.ansible/cp")
    if not os.path.isdir(cpdir):
        return
    for index in indexes:
        addr = host_address(index)
        names = ["%s-22-root" % addr]
        for port in ("None", "22"):
            names.append(hashlib.sha1(("%s-%s-root" % (addr, port)).encode()).hexdigest()[:10])
        for name in names:
            path = os.path.join(cpdir, name)
            if os.path.exists(path):
                subprocess.run(
                    ["ssh", "-O", "exit", "-o", "ControlPath=" + path, "root@" + addr],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=10,
                )
                if os.path.exists(path):
                    os.unlink(path)


def _old_installer(version):
    """xre-Linux-x86_64-<version>.run: from the old-drivers dir or the bundle, else built
    with the kit's XRE builder (kit/xre.py) into the old-drivers dir."""
    name = "xre-Linux-x86_64-%s.run" % version
    for path in (os.path.join(OLD_DRIVERS_DIR, name), os.path.join(BUNDLE_DIR, "drivers", name)):
        if os.path.exists(path):
            return path
    builder = os.path.join(KIT_DIR, "xre.py")
    if not os.path.exists(builder):
        raise SimError(
            "fault xpu_old_driver=%s: no installer %s in %s and no builder %s"
            % (version, name, OLD_DRIVERS_DIR, builder)
        )
    import importlib.util

    spec = importlib.util.spec_from_file_location("kunlun_kit_xre", builder)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.makedirs(OLD_DRIVERS_DIR, exist_ok=True)
    try:
        return str(mod.build_xre_run(version, os.path.join(OLD_DRIVERS_DIR, name)))
    except ValueError as exc:
        raise SimError("fault xpu_old_driver=%s: %s" % (version, exc)) from exc


def apply_old_driver(index, version):
    """Fault xpu_old_driver=VERSION: install that older XRE in the host and load it, as
    on a server that runs an old driver."""
    path = _old_installer(version)
    name = os.path.basename(path)
    with open(path, "rb") as fh:
        payload = image.tar_bytes({"tmp/" + name: (fh.read(), 0o755)})
    docker("cp", "-", container_name(index) + ":/", input=payload)
    proc = docker(
        "exec",
        container_name(index),
        "sh",
        "-c",
        "KERNELDIR=/usr/src/linux-headers-$(uname -r) sh /tmp/%s --silent --accept-license "
        "&& rm -f /tmp/%s && modprobe kunlun" % (name, name),
        check=False,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SimError(
            "fault xpu_old_driver=%s on %s: installer failed:\n%s%s"
            % (version, host_name(index), proc.stdout, proc.stderr)
        )
    log("fault xpu_old_driver: XRE %s installed and loaded on %s" % (version, host_name(index)))


# ---------------------------------------------------------------- inventory
def known_hosts_path(inventory=INVENTORY_DIR):
    # In a hidden directory: Ansible would try to parse a plain file of an inventory
    # directory as an inventory source, but always skips hidden entries.
    return os.path.join(inventory, ".ssh", "known_hosts")


def _atomic_write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), ".%s.tmp" % os.path.basename(path))
    with open(tmp, "w") as fh:
        fh.write(text)
    os.rename(tmp, path)


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key (the project's yamllint style)."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _yaml(data):
    return yaml.dump(data, Dumper=_Dumper, default_flow_style=False, sort_keys=False)


GENERATED = "# Generated by `kunlun-fleet sim-up`; rewritten on every run. Do not edit.\n"


STATIC_VARS = (
    """---
# Static settings of the simulated fleet (committed). `kunlun-fleet sim-up N` writes the
# rest of this inventory: hosts.yml, host_vars/<host>.yml, .ssh/known_hosts,
# group_vars/all/connection.yml (how to reach the hosts) and group_vars/all/machine.yml
# (this machine's extra CA certificates, as ca_trust_certificates).

# The offline bundle on the controller: the sim artifacts (stand-in XRE installer,
# wheels, base image, model files) are built there, through `kunlun-fleet bundle build`.
kunlun_stack_bundle_dir: %s

# The package index's sha256 of its files, without vllm's: the sim bundle's vllm is a
# stand-in wheel (kunlun_fleet/sim/artifacts/vllm_src) under the index's name and version,
# so it cannot have the index's digest. transformers and vllm-router are the index's own
# files and keep theirs.
kunlun_stack_index_sha256:
  transformers: 9ecaf243dc45bee11a7d93f8caf03746accc0cb069181bbf4ad8566c53e854b4
  gateway_router: 85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d

# The gateway's router (vllm-router) and its dependencies come from the bundle's
# wheelhouse/ (sim-up downloads them into it), as on an offline site.
gateway_install_from: bundle
"""
    % BUNDLE_DIR
)


def write_inventory(indexes, keys, inventory=INVENTORY_DIR):
    """hosts.yml, host_vars/<host>.yml, known_hosts and group_vars/all/connection.yml
    (and the static group_vars/all/sim.yml: kept in the repository's inventory, where it is
    committed; copied from it every time into another fleet's, which would otherwise keep
    the settings of the sim-up that first made it)."""
    static = os.path.join(inventory, "group_vars", "all", "sim.yml")
    committed = os.path.join(INVENTORY_DIR, "group_vars", "all", "sim.yml")
    if os.path.realpath(inventory) != os.path.realpath(INVENTORY_DIR) and os.path.exists(committed):
        with open(committed) as fh:
            _atomic_write(static, fh.read())
    elif not os.path.exists(static):
        _atomic_write(static, STATIC_VARS)
    indexes = sorted(indexes)
    count = len(indexes)
    names = [host_name(i) for i in indexes]
    # One host builds the image and runs the gateway (and Prometheus: the monitoring
    # group); from 5 hosts on, the last host is a dedicated gateway (not an XPU server), as
    # a production site would have it.
    if count >= 5:
        xpu, gateways = names[:-1], names[-1:]
    else:
        xpu, gateways = names, names[:1]
    groups = {
        "all": {
            "children": {
                "xpu_servers": {"hosts": {n: None for n in xpu}},
                "image_builders": {"hosts": {names[0]: None}} if names else {"hosts": {}},
                "gateways": {"hosts": {n: None for n in gateways}},
                "monitoring": {"hosts": {n: None for n in gateways}},
            }
        }
    }
    _atomic_write(
        os.path.join(inventory, "hosts.yml"),
        GENERATED
        + "# The simulated fleet: %d host(s). Static settings: group_vars/all/sim.yml.\n---\n" % count
        + _yaml(groups).replace(": null", ":"),
    )
    hv_dir = os.path.join(inventory, "host_vars")
    os.makedirs(hv_dir, exist_ok=True)
    for name in os.listdir(hv_dir):
        if name.endswith(".yml") and name.startswith(host_name(0)[:-1]) and name[:-4] not in names:
            os.unlink(os.path.join(hv_dir, name))
    for index in indexes:
        data = {"ansible_host": host_address(index), "storage_data_disks": [DISK_DEVICE]}
        _atomic_write(
            os.path.join(hv_dir, host_name(index) + ".yml"),
            GENERATED + "# Overrides go in host_vars/%s/*.yml (kept); fault switches in\n"
            "# host_vars/%s/faults.yml as `sim_faults: {NAME: VALUE}`.\n---\n"
            % (host_name(index), host_name(index))
            + _yaml(data),
        )
    lines = []
    for index in indexes:
        for key in keys.get(index, []):
            lines.append("%s,%s %s" % (host_address(index), host_name(index), key))
    _atomic_write(known_hosts_path(inventory), "".join(line + "\n" for line in lines))
    cas = (
        sorted(
            os.path.join("/usr/local/share/ca-certificates", n)
            for n in os.listdir("/usr/local/share/ca-certificates")
            if n.endswith(".crt")
        )
        if os.path.isdir("/usr/local/share/ca-certificates")
        else []
    )
    connection = {
        "ansible_user": "root",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": SSH_KEY,
        "ansible_ssh_common_args": "-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes"
        % known_hosts_path(inventory),
    }
    _atomic_write(
        os.path.join(inventory, "group_vars", "all", "connection.yml"),
        GENERATED + "# How Ansible reaches the sim hosts: the key in the sim home, host keys\n"
        "# checked against the known_hosts sim-up wrote from the hosts' own keys.\n---\n" + _yaml(connection),
    )
    _atomic_write(
        os.path.join(inventory, "group_vars", "all", "machine.yml"),
        GENERATED + "# This machine's extra CA certificates (its egress proxy's), trusted on\n"
        "# the sim hosts the way the product trusts any extra CA (ca_trust_ role), and\n"
        "# its address on the sim network, the bridge's, from which it runs kunlun-fleet:\n"
        "# the controller's address of the host firewall (roles/firewall). The Python\n"
        "# the image proof expects when the stand-in base image is not on this machine's\n"
        "# CPython 3.10 (empty: the pin's; kunlun_fleet/sim/base_python.py).\n---\n"
        + _yaml(
            {
                "ca_trust_certificates": cas,
                "firewall_admin_sources": [GATEWAY + "/32"],
                "image_proof_python_version": base_python.resolve()["proof_python_version"],
            }
        ),
    )
    _atomic_write(
        os.path.join(inventory, "group_vars", "all", "pki.yml"),
        GENERATED + "# This inventory's fleet CA, by its absolute path: molecule's scenarios read the\n"
        "# inventory through links from a directory of their own, and must use the CA site.yml's\n"
        "# runs use (the hosts' certificates and their clients' trust come from it).\n---\n"
        + _yaml({"kunlun_stack_fleet_pki_dir": os.path.join(os.path.abspath(inventory), ".image-registry-pki")}),
    )
    # The fleet's API key, made once and kept (ansible-vault) across sim-up runs.
    from kunlun_fleet import vault

    vault.ensure_api_key(inventory)


def remove_inventory(inventory=INVENTORY_DIR):
    for rel in (
        "hosts.yml",
        ".ssh/known_hosts",
        "known_hosts",
        "group_vars/all/connection.yml",
        "group_vars/all/machine.yml",
        "group_vars/all/pki.yml",
    ):
        path = os.path.join(inventory, rel)
        if os.path.exists(path):
            os.unlink(path)
    hv_dir = os.path.join(inventory, "host_vars")
    if os.path.isdir(hv_dir):
        for name in os.listdir(hv_dir):
            if name.startswith(host_name(0)[:-1]) and name.endswith(".yml"):
                os.unlink(os.path.join(hv_dir, name))


# ---------------------------------------------------------------- commands
def _healthy(index, item, tag, faults, refresh):
    """None when host ``index`` is fine as it is, else the reason to recreate it."""
    if item is None:
        return "missing"
    if not item["State"]["Running"]:
        return "not running (%s)" % item["State"]["Status"]
    labels = item["Config"]["Labels"] or {}
    if refresh and item["Config"]["Image"] != tag:
        return "image changed (%s -> %s)" % (item["Config"]["Image"], tag)
    if json.loads(labels.get(LABEL + ".faults", "{}")) != faults:
        return "fault switches changed"
    net = (item.get("NetworkSettings", {}).get("Networks") or {}).get(NETWORK) or {}
    if net.get("IPAddress") != host_address(index):
        return "not on network %s at %s" % (NETWORK, host_address(index))
    devices = item["HostConfig"].get("Devices") or []
    loop = next((d["PathOnHost"] for d in devices if d["PathInContainer"] == DISK_DEVICE), None)
    if not loop or loopdev.backing_file(os.path.basename(loop)) not in (
        disk_path(index),
        os.path.realpath(disk_path(index)),
    ):
        return "data disk loop %s is gone" % loop
    state = systemd_state(index)
    if state not in ("running", "degraded", "starting"):
        return "systemd is %s" % state
    return None


def _current_faults(item):
    if item is None:
        return {}
    return json.loads((item["Config"]["Labels"] or {}).get(LABEL + ".faults", "{}"))


def _remove_host(index, state):
    remove_container(index)
    release_host_disk(index)
    if os.path.exists(disk_path(index)):
        os.unlink(disk_path(index))
    state["hosts"].pop(str(index), None)


def up(count, fault_args=(), rebuild=False, refresh=False, first=1, inventory=INVENTORY_DIR):
    """Hosts first..first+count-1 as the fleet of ``inventory``: made or kept, and the
    fleet's hosts outside that range removed. Hosts of other fleets are left alone; a
    range that takes one of theirs is refused before anything changes."""
    if count < 1 or count > 50:
        raise SimError("sim-up N: N must be 1..50 (each host takes ~45 MiB and ~3 GiB of disk)")
    if first < 1 or first + count - 1 > MAX_INDEX:
        raise SimError(
            "sim-up N --first K: hosts K..K+N-1 must lie in 1..%d (their addresses are "
            "172.31.250.(10+index)); got %d..%d" % (MAX_INDEX, first, first + count - 1)
        )
    wanted = list(range(first, first + count))
    key = fleet_key(inventory)
    inventory = inventory_dir(key)
    start = time.time()
    cli_faults = {}
    for text in fault_args:
        index, name, value = parse_fault(text)
        if index not in wanted:
            raise SimError(
                "fault %r names %s, which is not in this fleet (%s..%s)"
                % (text, host_name(index), host_name(wanted[0]), host_name(wanted[-1]))
            )
        cli_faults.setdefault(index, {})[name] = value
    with locked():
        engine.ensure_engine()
        tag = image.build_image(force=rebuild)
        ensure_network()
        pubkey = ensure_key()
        state = load_state()
        existing = containers()
        known = set(existing) | {int(k) for k in state.get("hosts", {})}
        taken = [i for i in wanted if i in known and owner(i, existing, state) != key]
        if taken:
            other = inventory_dir(owner(taken[0], existing, state))
            raise SimError(
                "%s belong(s) to the sim fleet of inventory %s. Pick another range "
                "(--first) or remove that fleet first: sim-down --inventory %s"
                % (", ".join(host_name(i) for i in taken), other, other)
            )
        # This fleet's hosts outside the range go first (their loops are global).
        for index in sorted(known):
            if index not in wanted and owner(index, existing, state) == key:
                log(
                    "removing %s (the fleet is now %s..%s)"
                    % (host_name(index), host_name(wanted[0]), host_name(wanted[-1]))
                )
                _remove_host(index, state)
        todo, outdated = [], []
        for index in wanted:
            item = existing.get(index)
            faults = cli_faults.get(index)
            if faults is None:
                faults = override_faults(index, inventory)
            if faults is None:
                faults = _current_faults(item)
            reason = _healthy(index, item, tag, faults, refresh)
            if reason:
                log("%s: %s -> (re)creating" % (host_name(index), reason))
                todo.append((index, faults))
            elif item["Config"]["Image"] != tag:
                outdated.append(host_name(index))
        errors = create_side_by_side(todo, tag, pubkey, {index: key for index, _ in todo}, state)
        if errors:
            raise SimError("creating hosts failed:\n" + "\n".join(errors))
        for index in wanted:
            if str(index) not in state["hosts"] and index in existing:
                item = existing[index]
                state["hosts"][str(index)] = {
                    "index": index,
                    "faults": _current_faults(item),
                    "image": tag,
                    "disk": disk_path(index),
                    "fleet": key,
                    "token": item["Config"]["Labels"].get(LABEL + ".token"),
                }
        save_state(state)
        indexes = wanted
        with ThreadPoolExecutor(max_workers=max(8, count)) as pool:
            states = dict(zip(indexes, pool.map(wait_ready, indexes), strict=True))
        keys = {i: host_keys(i) for i in indexes}
        write_inventory(indexes, keys, inventory)
        drop_control_masters([i for i, _ in todo])
        for index, faults in todo:
            version = faults.get("xpu_old_driver")
            if version:
                apply_old_driver(index, version)
            if password_only(faults):
                apply_password_only(index)
        bad = [host_name(i) for i in indexes if not ssh_as_meant(i, state["hosts"].get(str(i), {}).get("faults"))]
        if bad:
            raise SimError("SSH with checked host keys fails for %s; see `sim-status`" % ", ".join(bad))
        image.prune_old_images(tag)
    if outdated:
        log(
            "note: %s run(s) an older sim-host image (the kit changed since); they are kept. "
            "Use `sim-up %d --refresh` or `sim-reset HOST` to recreate them." % (", ".join(outdated), count)
        )
    log(
        "fleet of %d up in %.1f s (%d (re)created)%s: %s"
        % (
            count,
            time.time() - start,
            len(todo),
            "" if not key else ", inventory " + inventory,
            ", ".join("%s=%s" % (host_name(i), states[i]) for i in indexes),
        )
    )
    return {"created": [i for i, _ in todo], "hosts": indexes}


def reset(hosts, fault_args=()):
    """Recreate hosts (a name or a list) with fresh disks, side by side. A fault
    NAME=VALUE applies to every host named; HOST:NAME=VALUE to that host only."""
    hosts = [hosts] if isinstance(hosts, str) else list(hosts)
    wanted = []
    for host in hosts:
        index = index_of(host)
        if index is None:
            raise SimError("sim-reset HOST...: HOST is kf-node-N, kf-sim-N or N; got %r" % host)
        if index not in wanted:
            wanted.append(index)
    faults = dict((index, {}) for index in wanted)
    for text in fault_args:
        if ":" in text.split("=", 1)[0]:
            targets = [parse_fault(text)]
        else:
            targets = [parse_fault(text, default_host=index) for index in wanted]
        for index, name, value in targets:
            if index not in faults:
                raise SimError(
                    "fault %r names %s, which sim-reset was not asked to reset (%s)"
                    % (text, host_name(index), ", ".join(host_name(i) for i in wanted))
                )
            faults[index][name] = value
    start = time.time()
    with locked():
        existing = containers()
        missing = [host_name(i) for i in wanted if i not in existing]
        if missing:
            raise SimError("%s not in the fleet; run `sim-up N` first" % ", ".join(missing))
        engine.ensure_engine()
        tag = image.build_image()
        ensure_network()
        pubkey = ensure_key()
        state = load_state()
        keys_of = dict((index, owner(index, existing, state)) for index in wanted)
        for index in wanted:
            log(
                "resetting %s with a fresh disk%s"
                % (
                    host_name(index),
                    (" and faults " + ",".join("%s=%s" % kv for kv in sorted(faults[index].items())))
                    if faults[index]
                    else "",
                )
            )
        errors = create_side_by_side([(index, faults[index]) for index in wanted], tag, pubkey, keys_of, state)
        if errors:
            raise SimError("resetting hosts failed:\n" + "\n".join(errors))
        with ThreadPoolExecutor(max_workers=max(8, len(wanted))) as pool:
            list(pool.map(wait_ready, wanted))
        for key in sorted(set(keys_of.values())):
            indexes = sorted(
                {i for i in existing if owner(i, existing, state) == key} | {i for i in wanted if keys_of[i] == key}
            )
            keys = {}
            for i in indexes:
                try:
                    keys[i] = host_keys(i)
                except SimError:
                    keys[i] = []
            write_inventory(indexes, keys, inventory_dir(key))
        drop_control_masters(wanted)
        for index in wanted:
            if faults[index].get("xpu_old_driver"):
                apply_old_driver(index, faults[index]["xpu_old_driver"])
            if password_only(faults[index]):
                apply_password_only(index)
        bad = [host_name(i) for i in wanted if not ssh_as_meant(i, faults[i])]
        if bad:
            raise SimError("SSH to %s with checked host keys fails after reset" % ", ".join(bad))
        image.prune_old_images(tag)
    log("%s reset in %.1f s" % (", ".join(host_name(i) for i in wanted), time.time() - start))


def down_fleet(inventory):
    """Remove one fleet (its hosts, their disks and kit loops, its inventory's generated
    files); the engine, the network and every other fleet stay."""
    key = fleet_key(inventory)
    with locked():
        state = load_state()
        existing = containers() if engine.engine_answers() else {}
        mine = sorted(
            i for i in set(existing) | {int(k) for k in state.get("hosts", {})} if owner(i, existing, state) == key
        )
        for name in loopdev.kit_loops([container_name(i) for i in mine]) if mine else []:
            loopdev.detach(name)
        for index in mine:
            log("removing %s" % host_name(index))
            _remove_host(index, state)
        remove_inventory(inventory_dir(key))
        save_state(state)
    log("sim fleet of %s removed (%d host(s)); other fleets and the engine kept" % (inventory_dir(key), len(mine)))


def down(purge=False):
    with locked():
        state = load_state()
        fleets = {""} | {h.get("fleet", "") for h in state.get("hosts", {}).values()}
        answering = engine.engine_answers()
        indexes = set(int(k) for k in state.get("hosts", {}))
        if answering:
            existing = containers()
            indexes |= set(existing)
            fleets |= {owner(i, existing) for i in existing}
            for index in sorted(existing):
                log("removing %s" % container_name(index))
                remove_container(index)
            if docker("network", "inspect", NETWORK, check=False).returncode == 0:
                docker("network", "rm", NETWORK, check=False)
        if os.path.isdir(DISKS_DIR):
            for name in os.listdir(DISKS_DIR):
                idx = index_of(name[:-4]) if name.endswith(".img") else None
                if idx:
                    indexes.add(idx)
        # Every loop the kit attached in any sim host, then the disks' own loops.
        for name in loopdev.kit_loops([container_name(i) for i in indexes] or None):
            loopdev.detach(name)
        for name in loopdev.kit_loops():
            if (loopdev.loop_file_name(name) or "").split(":")[1].startswith(CONTAINER_PREFIX):
                loopdev.detach(name)
        for index in sorted(indexes):
            release_host_disk(index)
            if os.path.exists(disk_path(index)):
                os.unlink(disk_path(index))
        for key in sorted(fleets):
            remove_inventory(inventory_dir(key))
        save_state({"hosts": {}})
        others = docker("ps", "-q", check=False).stdout.split() if answering else []
        if purge:
            if answering:
                image.remove_images()
            engine.stop_engine()
            engine.purge_engine_data()
            run(["rm", "-rf", "--one-file-system", os.path.join(SIM_HOME, "build")], check=False)
        elif not others:
            engine.stop_engine()
        else:
            log("engine left running: it runs %d container(s) that are not sim hosts" % len(others))
        remove_iptables()
    log("sim fleet removed%s" % (" (images and engine data purged)" if purge else ""))


def status():
    """Rows describing the fleet (also printed by sim-status)."""
    rows = []
    if not engine.engine_answers():
        return {"engine": "stopped", "hosts": rows}
    state = load_state()
    tag = image.image_tag()
    existing = containers()
    for index, item in sorted(existing.items()):
        inventory = inventory_dir(owner(index, existing))
        running = item["State"]["Running"]
        devices = item["HostConfig"].get("Devices") or []
        loop = next((d["PathOnHost"] for d in devices if d["PathInContainer"] == DISK_DEVICE), "-")
        disk = disk_path(index)
        used = os.stat(disk).st_blocks * 512 if os.path.exists(disk) else 0
        kit = loopdev.kit_loops([container_name(index)])
        rows.append(
            {
                "host": host_name(index),
                "container": container_name(index),
                "address": host_address(index),
                "state": item["State"]["Status"],
                "systemd": systemd_state(index) if running else "-",
                "ssh": (
                    "pw"
                    if password_only(_current_faults(item)) and password_only_problem(index) is None
                    else "ok"
                    if ssh_ok(index)
                    else "FAIL"
                )
                if running and os.path.exists(known_hosts_path(inventory))
                else "-",
                "inventory": inventory,
                "disk": "%s=%s (%s file, %.1f GiB used)" % (DISK_DEVICE, loop, DISK_SIZE, used / 2.0**30),
                "kit_loops": ["/dev/" + k for k in kit],
                "faults": _current_faults(item),
                "image": "current" if item["Config"]["Image"] == tag else "outdated (%s)" % item["Config"]["Image"],
                "created": state.get("hosts", {}).get(str(index), {}).get("created", "?"),
            }
        )
    return {"engine": "running (%s)" % engine.DOCKER_HOST, "image": tag, "hosts": rows}
