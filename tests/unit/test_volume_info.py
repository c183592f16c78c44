"""library/volume_info.py: the data volume and its mount point, read in one call."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "library"))

import volume_info  # noqa: E402


def test_blkid_export():
    text = "DEVNAME=/dev/data/home\nUUID=0b9c3a52-1d2e-4f7a-9a0b-5c6d7e8f9a0b\nBLOCK_SIZE=512\nTYPE=xfs\n"
    found = volume_info.parse_blkid_export(text)
    assert found["UUID"] == "0b9c3a52-1d2e-4f7a-9a0b-5c6d7e8f9a0b" and found["TYPE"] == "xfs"
    assert volume_info.parse_blkid_export("") == {}


def test_findmnt_takes_the_top_of_stacked_mounts():
    text = json.dumps({"filesystems": [
        {"source": "/dev/sda3", "fstype": "ext4", "options": "rw,relatime"},
        {"source": "/dev/mapper/data-home", "fstype": "xfs", "options": "rw,noatime,inode64"}]})
    assert volume_info.parse_findmnt_json(text) == {
        "source": "/dev/mapper/data-home", "fstype": "xfs", "options": "rw,noatime,inode64"}
    assert volume_info.parse_findmnt_json("") == {}
    assert volume_info.parse_findmnt_json("not json") == {}


@pytest.mark.parametrize("text, ftype", [
    ("meta-data=/dev/mapper/data-home isize=512 agcount=14\nnaming   =version 2 bsize=4096 ascii-ci=0, ftype=1\n", 1),
    ("naming   =version 2              bsize=4096   ascii-ci=0, ftype=0\n", 0),
    ("xfs_info: /home is not a mounted XFS filesystem\n", None),
])
def test_xfs_ftype(text, ftype):
    assert volume_info.parse_xfs_ftype(text) == ftype


def test_lvs_size():
    assert volume_info.parse_lvs_size("  15393162788864 \n") == 15393162788864
    assert volume_info.parse_lvs_size("") == 0


class FakeModule:
    """run_command answers from a table of argv -> (rc, out, err)."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def run_command(self, argv, environ_update=None):
        self.calls.append(argv)
        return self.answers.get(tuple(argv), (1, "", "not found"))

    def fail_json(self, **kw):
        raise AssertionError(kw["msg"])


def test_nothing_mounted_no_volume_group(tmp_path):
    module = FakeModule({})
    found = volume_info.read(module, "/home", "data/home")
    assert found == {"mount": {}, "vg_exists": False, "xfs_ftype": None,
                     "lv": {"path": "/dev/data/home", "exists": False, "uuid": "", "fstype": "", "size_bytes": 0}}


def test_mounted_xfs_with_ftype(monkeypatch):
    monkeypatch.setattr(volume_info.os.path, "exists", lambda p: p == "/dev/data/home")
    mnt = json.dumps({"filesystems": [{"source": "/dev/mapper/data-home", "fstype": "xfs", "options": "rw"}]})
    module = FakeModule({
        ("findmnt", "-J", "--output", "SOURCE,FSTYPE,OPTIONS", "--mountpoint", "/home"): (0, mnt, ""),
        ("blkid", "-p", "-o", "value", "-s", "UUID", "/dev/mapper/data-home"): (0, "u-1\n", ""),
        ("vgs", "--noheadings", "--options", "vg_name", "data"): (0, "  data\n", ""),
        ("lvs", "--noheadings", "--nosuffix", "--units", "b", "--options", "lv_size", "data/home"): (0, " 1073741824\n", ""),
        ("blkid", "-p", "-o", "export", "/dev/data/home"): (0, "UUID=u-1\nTYPE=xfs\n", ""),
        ("xfs_info", "/home"): (0, "naming =version 2 bsize=4096 ascii-ci=0, ftype=1\n", ""),
    })
    found = volume_info.read(module, "/home", "data/home")
    assert found["mount"] == {"source": "/dev/mapper/data-home", "fstype": "xfs", "options": "rw", "uuid": "u-1"}
    assert found["lv"] == {"path": "/dev/data/home", "exists": True, "uuid": "u-1", "fstype": "xfs",
                           "size_bytes": 1073741824}
    assert found["vg_exists"] and found["xfs_ftype"] == 1
