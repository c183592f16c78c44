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
    text = json.dumps(
        {
            "filesystems": [
                {"source": "/dev/sda3", "fstype": "ext4", "options": "rw,relatime"},
                {
                    "source": "/dev/mapper/data-home",
                    "fstype": "xfs",
                    "options": "rw,noatime,inode64",
                    "maj:min": "253:2",
                },
            ]
        }
    )
    assert volume_info.parse_findmnt_json(text) == {
        "source": "/dev/mapper/data-home",
        "fstype": "xfs",
        "options": "rw,noatime,inode64",
        "devno": "253:2",
    }
    assert volume_info.parse_findmnt_json("") == {}
    assert volume_info.parse_findmnt_json("not json") == {}


@pytest.mark.parametrize(
    "text, ftype",
    [
        (
            "meta-data=/dev/mapper/data-home isize=512 agcount=14\n"
            "naming   =version 2 bsize=4096 ascii-ci=0, ftype=1\n",
            1,
        ),
        ("naming   =version 2              bsize=4096   ascii-ci=0, ftype=0\n", 0),
        ("xfs_info: /home is not a mounted XFS filesystem\n", None),
    ],
)
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

    def get_bin_path(self, name):
        # The LVM and XFS tools are installed unless a test says otherwise.
        return None if name in getattr(self, "missing", ()) else "/usr/sbin/" + name


def test_nothing_mounted_no_volume_group(tmp_path):
    module = FakeModule({})
    found = volume_info.read(module, "/home", "data/home", str(tmp_path / "no-fstab"))
    assert found == {
        "mount": {},
        "vg_exists": False,
        "xfs_ftype": None,
        "mounted_lv": {},
        "fstab": {},
        "lv": {"path": "/dev/data/home", "exists": False, "uuid": "", "fstype": "", "size_bytes": 0},
    }


LVS_ALL = (
    "lvs",
    "--noheadings",
    "--nosuffix",
    "--units",
    "b",
    "--separator",
    "|",
    "--options",
    "vg_name,lv_name,lv_path,lv_size,vg_size,vg_free",
)
FINDMNT = ("findmnt", "-J", "--output", "SOURCE,FSTYPE,OPTIONS,MAJ:MIN", "--mountpoint", "/home")


def test_no_lvm_tools_no_volume_group(tmp_path):
    """A bare host before the storage stage installs lvm2 (preflight reads it too)."""
    mnt = json.dumps({"filesystems": [{"source": "/dev/sdb1", "fstype": "xfs", "options": "rw", "maj:min": "8:17"}]})
    module = FakeModule({FINDMNT: (0, mnt, "")})
    module.missing = ("vgs", "lvs", "pvs", "xfs_info")
    found = volume_info.read(module, "/home", "data/home", str(tmp_path / "none"))
    assert not found["vg_exists"] and not found["lv"]["exists"] and found["mounted_lv"] == {}
    assert found["xfs_ftype"] is None and found["mount"]["source"] == "/dev/sdb1"
    assert not any(argv[0] in module.missing for argv in module.calls), module.calls


def test_mounted_xfs_with_ftype(monkeypatch, tmp_path):
    monkeypatch.setattr(volume_info.os.path, "exists", lambda p: p == "/dev/data/home")
    monkeypatch.setattr(volume_info, "same_device", lambda path, devno: path == "/dev/data/home" and devno == "253:2")
    mnt = json.dumps(
        {"filesystems": [{"source": "/dev/mapper/data-home", "fstype": "xfs", "options": "rw", "maj:min": "253:2"}]}
    )
    fstab = tmp_path / "fstab"
    fstab.write_text("# static\nUUID=u-1 /home xfs defaults 0 0\n")
    module = FakeModule(
        {
            FINDMNT: (0, mnt, ""),
            LVS_ALL: (0, "  data|home|/dev/data/home|1073741824|1073741824|0\n", ""),
            ("pvs", "--noheadings", "--options", "pv_name", "--select", "vg_name=data"): (0, "  /dev/vdb\n", ""),
            ("blkid", "-p", "-o", "value", "-s", "UUID", "/dev/mapper/data-home"): (0, "u-1\n", ""),
            ("vgs", "--noheadings", "--options", "vg_name", "data"): (0, "  data\n", ""),
            ("lvs", "--noheadings", "--nosuffix", "--units", "b", "--options", "lv_size", "data/home"): (
                0,
                " 1073741824\n",
                "",
            ),
            ("blkid", "-p", "-o", "export", "/dev/data/home"): (0, "UUID=u-1\nTYPE=xfs\n", ""),
            ("xfs_info", "/home"): (0, "naming =version 2 bsize=4096 ascii-ci=0, ftype=1\n", ""),
        }
    )
    found = volume_info.read(module, "/home", "data/home", str(fstab))
    assert found["mount"] == {
        "source": "/dev/mapper/data-home",
        "fstype": "xfs",
        "options": "rw",
        "uuid": "u-1",
        "devno": "253:2",
    }
    assert found["lv"] == {
        "path": "/dev/data/home",
        "exists": True,
        "uuid": "u-1",
        "fstype": "xfs",
        "size_bytes": 1073741824,
    }
    assert found["vg_exists"] and found["xfs_ftype"] == 1
    assert found["mounted_lv"] == {
        "vg": "data",
        "lv": "home",
        "path": "/dev/data/home",
        "size_bytes": 1073741824,
        "vg_size_bytes": 1073741824,
        "vg_free_bytes": 0,
        "pvs": ["/dev/vdb"],
    }
    assert found["fstab"]["by"] == "uuid" and found["fstab"]["spec"] == "UUID=u-1"


def test_any_logical_volume_mounted_is_found_by_device_number(monkeypatch, tmp_path):
    """A volume of names the inventory does not know (the delivered server's vg0/lv_home),
    mounted by its /dev/mapper path: found by device number among every LV, with its VG's
    free space and PVs; the fstab line by path is reported as such."""
    monkeypatch.setattr(volume_info, "same_device", lambda path, devno: path == "/dev/vg0/lv_home" and devno == "7:12")
    mnt = json.dumps(
        {"filesystems": [{"source": "/dev/loop12", "fstype": "ext4", "options": "rw,relatime", "maj:min": "7:12"}]}
    )
    fstab = tmp_path / "fstab"
    fstab.write_text("/dev/sda1 / ext4 defaults 0 1\n/dev/mapper/vg0-lv_home /home ext4 defaults 0 2\n")
    module = FakeModule(
        {
            FINDMNT: (0, mnt, ""),
            LVS_ALL: (
                0,
                "  vg0|swap|/dev/vg0/swap|1073741824|15393162788864|3078632557772\n"
                "  vg0|lv_home|/dev/vg0/lv_home|12313456230092|15393162788864|3078632557772\n",
                "",
            ),
            ("pvs", "--noheadings", "--options", "pv_name", "--select", "vg_name=vg0"): (
                0,
                "  /dev/vdc\n  /dev/vdb\n",
                "",
            ),
        }
    )
    found = volume_info.read(module, "/home", "data/home", str(fstab))
    assert found["mounted_lv"]["vg"] == "vg0" and found["mounted_lv"]["lv"] == "lv_home"
    assert found["mounted_lv"]["vg_free_bytes"] == 3078632557772 and found["mounted_lv"]["pvs"] == [
        "/dev/vdb",
        "/dev/vdc",
    ]
    assert found["fstab"] == {
        "spec": "/dev/mapper/vg0-lv_home",
        "fstype": "ext4",
        "options": "defaults",
        "by": "path",
        "dump": "0",
        "passno": "2",
        "line": "/dev/mapper/vg0-lv_home /home ext4 defaults 0 2",
    }
    assert not found["vg_exists"] and not found["lv"]["exists"]


def test_a_mount_not_from_a_logical_volume_is_not_adopted(monkeypatch, tmp_path):
    monkeypatch.setattr(volume_info, "same_device", lambda path, devno: False)
    mnt = json.dumps(
        {"filesystems": [{"source": "kf-other-home", "fstype": "tmpfs", "options": "rw", "maj:min": "0:52"}]}
    )
    module = FakeModule(
        {FINDMNT: (0, mnt, ""), LVS_ALL: (0, "  vg0|lv_home|/dev/vg0/lv_home|1073741824|1073741824|0\n", "")}
    )
    assert volume_info.read(module, "/home", "data/home", str(tmp_path / "none"))["mounted_lv"] == {}


@pytest.mark.parametrize(
    "line, by",
    [
        ("UUID=0b9c /home xfs defaults 0 0", "uuid"),
        ('LABEL="home" /home xfs defaults 0 0', "label"),
        ("/dev/vg0/lv_home /home/ xfs defaults", "path"),
        ("tmpfs /home tmpfs size=1g 0 0", "other"),
    ],
)
def test_fstab_line_and_how_it_names_the_device(line, by):
    found = volume_info.parse_fstab("# a comment /home\n/dev/sda1 / ext4 defaults 0 1\n" + line + "\n", "/home")
    assert found["by"] == by and found["fstype"] == line.split()[2]
    assert volume_info.parse_fstab("/dev/sda1 / ext4 defaults 0 1\n/dev/sdb1 /home2 xfs defaults\n", "/home") == {}
    assert volume_info.parse_fstab("/dev/sdb1 /srv/my\\040data xfs defaults\n", "/srv/my data")["spec"] == "/dev/sdb1"
