"""Bad input on a sim host: storage refuses with a message naming the item and the fix,
and changes NOTHING (snapshot of LVM, disks, mounts, fstab, the /home tree with
checksums, daemon.json, data-roots, drop-ins, packages before == after).

The engine's refusals (a data-root outside the volume, an invalid daemon.json, images of
another storage driver) run on the host the check-mode test converges, which has the
volume and an installed engine they need: tests/storage/test_check_mode_sim.py::
test_engine_refuses_outside_root_and_invalid_daemon_json.

Covered elsewhere and not repeated here: the data disk holding a filesystem (preflight,
tests/preflight/test_host_checks_sim.py), the module's own refusals on loop devices
(tests/integration/test_carry_over_local.py), data_disk_info's classification (unit)."""

import os
import subprocess

import pytest

from storage_helpers import HOST, refused_run as refused, sh, stage, upload_tool, wait_seeded

pytestmark = [pytest.mark.sim, pytest.mark.slow]


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


def test_storage_refuses_bad_disks_mounts_and_room(fresh_host, small_disk):
    fresh_host(HOST, "home_content=1")
    wait_seeded("/var/lib/kunlun-kit/home.manifest")
    upload_tool()
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

    # and the same host with good input still converges (the refusals left it usable)
    proc, rec = stage("storage.yml")
    assert proc.returncode == 0 and rec["changed"] > 0, proc.stdout[-3000:]
