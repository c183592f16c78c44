"""Preflight's host checks on real block devices of this machine (read-only).

The example inventory's hosts are reached with the local connection, so every "host" is
this machine: the checks run the real wipefs/blkid/lsblk against real loop devices.
"""

import os
import shutil
import subprocess

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("losetup"), reason="needs root and losetup"),
]


@pytest.fixture
def loop_disk(tmp_path):
    """A 2 GiB sparse loop device; yields its path and detaches it afterwards."""
    backing = tmp_path / "disk.img"
    subprocess.run(["truncate", "-s", "2G", str(backing)], check=True)
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()
    yield dev
    subprocess.run(["losetup", "-d", dev], check=False)


def point_disks(inventory, disks, **extra):
    for host in ("p800-a01", "p800-a02", "p800-a03"):
        inventory.save("host_vars/%s.yml" % host, {"storage_data_disks": disks, **extra})
    inventory.update("group_vars/all/preflight.yml", storage_min_size_gib=1)


def test_data_disk_that_does_not_exist(inventory, run_preflight):
    inventory.local_connection()
    point_disks(inventory, ["/dev/disk/by-id/no-such-disk"])
    rc, out = run_preflight(inventory)
    assert rc != 0
    assert "data disk /dev/disk/by-id/no-such-disk does not exist" in out, out[-3000:]
    assert "correct storage_data_disks in host_vars/p800-a0" in out
    assert "changed=0" in out and "changed=1" not in out


def test_data_disk_holding_a_filesystem_is_refused_and_untouched(inventory, run_preflight, loop_disk):
    subprocess.run(["mkfs.ext4", "-q", "-F", loop_disk], check=True)
    before = subprocess.run(["blkid", "-p", "-o", "export", loop_disk], capture_output=True, text=True).stdout
    inventory.local_connection()
    point_disks(inventory, [loop_disk])
    rc, out = run_preflight(inventory)
    assert rc != 0
    assert "%s holds ext4" % loop_disk in out, out[-3000:]
    assert "list the disk in storage_take_disks" in out
    after = subprocess.run(["blkid", "-p", "-o", "export", loop_disk], capture_output=True, text=True).stdout
    assert before == after and "TYPE=ext4" in after


def test_consent_lets_a_used_disk_through_to_the_next_check(inventory, run_preflight, loop_disk):
    subprocess.run(["mkfs.ext4", "-q", "-F", loop_disk], check=True)
    inventory.local_connection()
    point_disks(inventory, [loop_disk], storage_take_disks=[loop_disk])
    rc, out = run_preflight(inventory)
    # The disk check passes; this machine has no P800, so the accelerator check stops it.
    assert rc != 0
    assert "Report the data disks" in out, out[-3000:]
    assert "%s: holds ext4" % loop_disk in out
    assert "P800 PCI functions" in out, out[-3000:]


def test_empty_disk_is_reported_empty(inventory, run_preflight, loop_disk):
    inventory.local_connection()
    point_disks(inventory, [loop_disk])
    rc, out = run_preflight(inventory)
    assert "%s: empty" % loop_disk in out, out[-3000:]


@pytest.mark.parametrize(
    "setting, needle",
    [
        ({"preflight_supported_os": {"Ubuntu": ["22.04"]}}, "kunlun-fleet supports"),
        ({"preflight_min_python": "3.99"}, "the modules need 3.99 or newer"),
        ({"preflight_min_root_free_gib": 10000000}, "10000000 GiB are needed"),
        ({"storage_min_size_gib": 100000}, "at least 100000 GiB are needed; nothing was changed. Fix: add disks"),
    ],
)
def test_host_limits(inventory, run_preflight, loop_disk, setting, needle):
    inventory.local_connection()
    point_disks(inventory, [loop_disk])
    inventory.update("group_vars/all/preflight.yml", **setting)
    rc, out = run_preflight(inventory, "--limit", "p800-a01")
    assert rc != 0
    assert needle in out, out[-3000:]
