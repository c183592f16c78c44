"""One fresh host with content (home_content and docker_content: /home and
/var/lib/docker seeded), one reset for three proofs in the order a host meets them:

Bad input first: storage refuses with a message naming the item and the fix, and changes
NOTHING (snapshot of LVM, disks, mounts, fstab, the /home tree with checksums,
daemon.json, data-roots, drop-ins, packages before == after). Covered elsewhere and not
repeated here: the data disk holding a filesystem (preflight,
tests/preflight/test_host_checks_sim.py), the module's own refusals on loop devices
(tests/integration/test_carry_over_local.py), data_disk_info's classification (unit).

Then --check --diff of storage + engine on that host (the refusals left it as the reset
made it: their snapshots prove it) changes nothing, and announces the changes the real run
then makes; the real run converging that same host is also the proof that the refusals
left it usable. That a second real run on such a host changes nothing is the idempotence
step of molecule/storage (home_content) and of molecule/engine (an old data-root with
content carried), not repeated here. Snapshot (pvs/vgs/lvs, disks, findmnt, /etc/fstab,
daemon.json, a checksum list of /home, a listing of /var/lib/docker, images, units,
packages) before and after the check run must be identical. Per-task results come from
the ansible.posix.json callback.

Then, on the host the real run leaves (the volume mounted, the engine running on
/home/docker), the engine stage's refusals of bad input: each refused before any change,
with a message naming the item and the fix (the snapshot before == after).

The suite's host: kf-node-2, or a scratch lane's."""

import json
import os
import subprocess

import pytest

from kunlun_fleet.sim.testing import sim
from storage_helpers import (
    HOST,
    NAME,
    SEED_TIMEOUT,
    refused_run as refused,
    sh,
    snapshot,
    stage,
    upload_tool,
    wait_seeded,
)

pytestmark = [pytest.mark.sim, pytest.mark.slow]

JSON = {"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"}

# Tasks the check run cannot announce, each with the reason check mode cannot remove.
# Handlers are not listed: a handler that the check run NOTIFIED counts as announced (its
# notifying task reported the change; the handler itself may be skipped in check mode,
# e.g. the engine's restart before its package is installed, or update-ca-certificates,
# a command). (The JSON callback names tasks "<role> : <name>".)
UNPREDICTABLE = {}


def changed_tasks(proc):
    """(changed task names, failed task names, names of the handlers that ran or were
    skipped: every handler in the results was notified, names of the tasks that ran and
    never reported a change)."""
    start = proc.stdout.find("{")
    assert start >= 0, proc.stdout[-3000:]
    result, _ = json.JSONDecoder().raw_decode(proc.stdout[start:])
    changed, failed, notified, ran = set(), set(), set(), set()
    for play in result["plays"]:
        for task in play["tasks"]:
            res = task["hosts"].get(NAME)
            if res is None:
                continue
            if res.get("changed"):
                changed.add(task["task"]["name"])
            if res.get("failed"):
                failed.add(task["task"]["name"])
            if not res.get("skipped"):
                ran.add(task["task"]["name"])
            if "/handlers/" in task["task"]["path"]:
                notified.add(task["task"]["name"])
    return changed, failed, notified, ran - changed


# Whether the module's host is as its reset made it: a refusal changes nothing and the
# bad-input test puts back what it injected, unless it failed half-way.
_HOST = {"fresh": False}


def content_host():
    """The module's host with content, reset (again) unless it is still as a reset made it."""
    if not _HOST["fresh"]:
        sim("sim-reset", str(HOST), "--fault", "home_content=1", "--fault", "docker_content=1")
        wait_seeded("/var/lib/kunlun-kit/home.manifest", "/var/lib/kunlun-kit/docker.manifest")
        upload_tool()
        _HOST["fresh"] = True


@pytest.fixture
def small_disk(tmp_path):
    """A 600 MiB loop disk on the machine; attach() gives it to the suite's host as /dev/vdc
    (device nodes of any loop are allowed in the sim hosts). Call attach() after the host
    is reset (a reset makes a new container). Detached afterwards."""
    img = tmp_path / "small.img"
    subprocess.run(["truncate", "-s", "600M", str(img)], check=True)
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(img)], check=True, capture_output=True, text=True
    ).stdout.strip()
    rdev = os.stat(dev).st_rdev

    def attach():
        sh("rm -f /dev/vdc && mknod -m 0660 /dev/vdc b %d %d" % (os.major(rdev), os.minor(rdev)))
        return "/dev/vdc"

    yield attach
    sh("rm -f /dev/vdc", check=False)
    subprocess.run(["losetup", "-d", dev], check=False)


def test_storage_refuses_bad_disks_mounts_and_room(_hosts_to_reset, small_disk):
    content_host()
    _hosts_to_reset.add(HOST)
    _HOST["fresh"] = False
    small_disk()
    # the tool's packages are installed and the package index known: a refused run has
    # then nothing to install, so "nothing changed" covers every task
    sh(
        "apt-cache show lvm2 >/dev/null 2>&1 || apt-get update -qq; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lvm2 xfsprogs rsync acl >/dev/null"
    )

    # 1. the data disk is a PV of another volume group
    sh("pvcreate -q /dev/vdb && vgcreate -q othervg /dev/vdb")
    refused("storage.yml", ["/dev/vdb", "another volume group othervg", "storage_take_disks"])
    sh("vgremove -q -f othervg && pvremove -q /dev/vdb && wipefs -q -a /dev/vdb")

    # 2. the data disk holds a partition table (an MBR with one partition)
    sh(r"""python3 - <<'EOF'
import struct
mbr = bytearray(512)
mbr[446:462] = struct.pack('<B3sB3sII', 0, b'\0\x02\0', 0x83, b'\0\0\0', 2048, 204800)
mbr[510:512] = b'\x55\xaa'
with open('/dev/vdb', 'r+b') as f:
    f.write(mbr)
EOF
blkid -p -o value -s PTTYPE /dev/vdb""")
    refused("storage.yml", ["/dev/vdb", "dos", "storage_take_disks"])
    sh("wipefs -q -a /dev/vdb")

    # 3. /home is already mounted from another device
    sh("mount -t tmpfs -o size=64m kf-other-home /home")
    try:
        refused("storage.yml", ["/home is already mounted from kf-other-home", "unmount"])
    finally:
        sh("umount /home")

    # 4. the content of /home does not fit the volume the disks will make
    sh("fallocate -l 700M /home/alice/big-allocated.bin")
    refused(
        "storage.yml",
        ["/dev/vdc", "nothing was changed", "add data disks to storage_data_disks"],
        "-e",
        '{"storage_data_disks": ["/dev/vdc"], "storage_min_size_gib": 0}',
    )
    sh("rm /home/alice/big-allocated.bin")
    # That the same host with good input still converges (the refusals left it usable) is
    # the real run of checked_then_run, on this host, next.
    sh("rm -f /dev/vdc")
    _HOST["fresh"] = True


@pytest.fixture(scope="module")
def checked_then_run(_hosts_to_reset):
    """The host with content (as the bad-input test leaves it, or reset): storage and engine
    in --check --diff between two snapshots, then both for real (per-task results of each run)."""
    content_host()
    _hosts_to_reset.add(HOST)
    _HOST["fresh"] = False
    found = {"before": snapshot(), "check": {}, "real": {}}
    for name in ("storage.yml", "engine.yml"):
        found["check"][name] = stage(name, "--check", "--diff", env=JSON)[0]
    found["after"] = snapshot()
    for name in ("storage.yml", "engine.yml"):
        found["real"][name] = stage(name, env=JSON)[0]
    return found


def test_check_diff_changes_nothing_and_predicts_the_real_run(checked_then_run):
    predicted, handlers = set(), set()
    for name, proc in checked_then_run["check"].items():
        changed, failed, notified, _ = changed_tasks(proc)
        assert proc.returncode == 0 and not failed, (name, failed, proc.stdout[-3000:])
        assert changed, "check mode of %s announced no change on a fresh host" % name
        predicted |= changed | notified
        handlers |= notified
    before, after = checked_then_run["before"], checked_then_run["after"]
    assert after == before, "check mode changed the host:\n%s" % "\n".join(
        sorted(set(before.splitlines()) ^ set(after.splitlines()))
    )

    made, unchanged = set(), set()
    for name, proc in checked_then_run["real"].items():
        changed, failed, _, ran_unchanged = changed_tasks(proc)
        assert proc.returncode == 0 and not failed, (name, failed, proc.stdout[-3000:])
        made |= changed
        unchanged |= ran_unchanged
    print("check mode announced: %s" % sorted(predicted))
    print("real run changed:     %s" % sorted(made))
    unannounced = made - predicted - set(UNPREDICTABLE)
    assert not unannounced, "the real run changed tasks check mode did not announce: %s" % sorted(unannounced)
    # the carry-overs, the volume and the engine's configuration are among them
    for task in (
        "storage : Build | Carry the content of the mount point onto the volume, verify, then mount it there",
        "storage : Build | Volume group on the data disks (PVs are only ever added)",
        "engine : Engine | Copy the old data-root to the new one and verify it (the old one is kept)",
        "engine : Engine | daemon.json with the project's keys merged in (the operator's keys kept)",
    ):
        assert task in predicted and task in made, task
    # What check mode announced and the real run did not change may only be what a real run
    # never runs as such (check mode's own "(check mode)" stand-ins) or a handler (notified by
    # a task that changed; what the handler reports itself, a daemon reload no change, is not
    # an announcement): a task that ran for real and found nothing to change, but was
    # announced as a change, is a lie.
    over = predicted - made
    print("announced but not changed: %s" % sorted(over))
    lies = (over - handlers) & (unchanged - made)
    assert not lies, "check mode announced changes the real run found already made: %s" % sorted(lies)


def test_engine_refuses_outside_root_and_invalid_daemon_json(checked_then_run):
    for name, proc in checked_then_run["real"].items():
        assert proc.returncode == 0, "the real run of %s failed: the host is not converged\n%s" % (
            name,
            proc.stdout[-3000:],
        )
    # 5. a data-root outside the data volume (the first check, before anything else)
    for root in ("/srv/docker", "/home", "/home2/docker"):
        refused(
            "engine.yml",
            ["engine_data_root %s is outside the data volume /home" % root, "Fix"],
            "-e",
            "engine_data_root=%s" % root,
        )

    # 6. an invalid daemon.json is refused, not overwritten (byte-identical)
    bad = '{\n  "registry-mirrors": ["https://mirror.example"],\n  "debug": true,\n'
    sh("printf '%%s' '%s' > /etc/docker/daemon.json" % bad)
    digest = sh("sha256sum /etc/docker/daemon.json").stdout
    msg = refused(
        "engine.yml", ["/etc/docker/daemon.json is not valid JSON", "refusing to overwrite it", "python3 -m json.tool"]
    )
    assert sh("sha256sum /etc/docker/daemon.json").stdout == digest
    assert sh("cat /etc/docker/daemon.json").stdout == bad, msg[-2000:]
    sh("printf '%s' '[1, 2]' > /etc/docker/daemon.json")
    refused("engine.yml", ["valid JSON but not an object"])

    # 7. a data-root in use whose images are on another storage driver (vfs) than the one the
    # role configures (overlay2): moving it would lose them from view; refused, whether the
    # running engine or only the data-root on disk tells the driver. The engine the real run
    # installed, restarted on vfs with the default data-root (/var/lib/docker, which holds the
    # kit's volume, carried and left as it was).
    sh("printf '%s' '{\"storage-driver\": \"vfs\"}' > /etc/docker/daemon.json")
    driver = sh(
        "systemctl restart docker.service && "
        "rm -rf /tmp/kf-img && mkdir -p /tmp/kf-img && echo hi > /tmp/kf-img/hello && "
        "tar -C /tmp/kf-img -c . | docker import - kf-seed/tiny:1 >/dev/null && "
        "docker info --format '{{.Driver}} {{.DockerRootDir}}'",
        timeout=SEED_TIMEOUT,
    ).stdout.split()
    assert driver == ["vfs", "/var/lib/docker"], driver
    refused(
        "engine.yml",
        [
            "data-root /var/lib/docker holds images or containers of the storage driver vfs",
            "the running engine uses vfs",
            "configured for overlay2",
            "storage-driver",
            "docker save",
        ],
    )
    sh("systemctl stop docker.socket docker.service && printf '%s' '{}' > /etc/docker/daemon.json")
    refused(
        "engine.yml",
        ["data-root /var/lib/docker holds images or containers of the storage driver vfs", "configured for overlay2"],
    )
