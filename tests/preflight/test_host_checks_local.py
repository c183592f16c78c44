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


def _loop(tmp_path, name):
    """A 2 GiB sparse loop device over tmp_path/name; its path."""
    backing = tmp_path / name
    subprocess.run(["truncate", "-s", "2G", str(backing)], check=True)
    return subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def loop_disk(tmp_path):
    """A 2 GiB sparse loop device; yields its path and detaches it afterwards."""
    dev = _loop(tmp_path, "disk.img")
    yield dev
    subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def second_loop_disk(tmp_path, loop_disk):
    """Another one, beside loop_disk."""
    dev = _loop(tmp_path, "disk2.img")
    yield dev
    subprocess.run(["losetup", "-d", dev], check=False)


# One host is enough for what these tests read: every host of the copy is this machine,
# and each more host is another run of every task.
ONE = ("--limit", "p800-a01")


def point_disks(inventory, disks, **extra):
    inventory.save("host_vars/p800-a01.yml", {"storage_data_disks": disks, **extra})
    inventory.update("group_vars/all/preflight.yml", storage_min_size_gib=1)


def test_data_disk_that_does_not_exist(inventory, run_preflight):
    inventory.local_connection()
    point_disks(inventory, ["/dev/disk/by-id/no-such-disk"])
    rc, out = run_preflight(inventory, *ONE)
    assert rc != 0
    assert "data disk /dev/disk/by-id/no-such-disk does not exist" in out, out[-3000:]
    assert "correct storage_data_disks in host_vars/p800-a01.yml" in out
    assert "changed=0" in out and "changed=1" not in out


# A data disk holding a filesystem, refused and left untouched: on a sim host, through the
# same tasks (tests/preflight/test_host_checks_sim.py::test_data_disk_holding_a_filesystem).


def test_consent_lets_a_used_disk_through_and_an_empty_disk_is_reported_empty(
    inventory, run_preflight, loop_disk, second_loop_disk
):
    subprocess.run(["mkfs.ext4", "-q", "-F", loop_disk], check=True)
    inventory.local_connection()
    point_disks(inventory, [loop_disk, second_loop_disk], storage_take_disks=[loop_disk])
    rc, out = run_preflight(inventory, *ONE)
    # The disk check passes; this machine has no P800, so the accelerator check stops it.
    assert rc != 0
    assert "Report the data disks" in out, out[-3000:]
    assert "%s: holds ext4" % loop_disk in out
    assert "%s: empty" % second_loop_disk in out, out[-3000:]
    assert "P800 PCI functions" in out, out[-3000:]


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
    rc, out = run_preflight(inventory, *ONE)
    assert rc != 0
    assert needle in out, out[-3000:]
