"""library/data_disk_candidates.py: a host's whole disks as it sees them in /dev, the system's
left out, each of the others judged with data_disk_info's rules (module_utils/data_disks.py),
the volume at /home found, from fake command outputs and a fake /dev."""

import stat
import types

import data_disk_candidates as dc
import pytest
from ansible.module_utils import data_disks

from module_docs import documented_spec

TIB = 1024**4


class FakeModule:
    """run_command answers from a table of argv -> (rc, out, err); the tools exist unless missing."""

    def __init__(self, answers, missing=()):
        self.answers, self.missing, self.calls = answers, set(missing), []

    def run_command(self, argv, environ_update=None):
        self.calls.append(tuple(argv))
        return self.answers.get(tuple(argv), (1, "", "no answer for %s" % " ".join(argv)))

    def get_bin_path(self, name, required=False):
        if name in self.missing:
            if required:
                raise AssertionError("%s required" % name)
            return None
        return "/usr/sbin/" + name

    def fail_json(self, **kw):
        raise AssertionError(kw["msg"])


def disk_answers(path, size, wipefs="", blkid=(2, "", ""), pvs_vg=None, parts=""):
    """The answers DiskReader gets for one disk (size in bytes; wipefs's OFFSET TYPE lines)."""
    name = path.rsplit("/", 1)[1]
    return {
        ("/usr/sbin/blockdev", "--getsize64", path): (0, "%d\n" % size, ""),
        ("/usr/sbin/wipefs", "--no-act", "--noheadings", "--output", "OFFSET,TYPE", path): (0, wipefs, ""),
        ("/usr/sbin/blkid", "-p", "-o", "export", path): blkid,
        ("/usr/sbin/lsblk", "--noheadings", "--raw", "--output", "NAME,TYPE", path): (
            0,
            "%s disk\n%s" % (name, parts),
            "",
        ),
        ("/usr/sbin/pvs", "--noheadings", "--options", "vg_name", path): (0, "  %s\n" % pvs_vg, "")
        if pvs_vg
        else (5, "", "  Failed to find physical volume"),
    }


LVS = ("lvs", "--noheadings", "--nosuffix", "--units", "b", "--separator", "|", "--options", data_disks.LVS_COLUMNS)
PVS = ("pvs", "--noheadings", "--separator", "|", "--options", "pv_name,vg_name")


@pytest.fixture
def host(monkeypatch, tmp_path):
    """Sets up a fake host: host(nodes, links, mountinfo, swaps, fstab, lvs, answers, devices)."""

    def make(nodes, mountinfo="", swaps="", fstab="", links=None, lvs_devno=None, devno_of=None):
        monkeypatch.setattr(dc, "block_nodes", lambda dev_dir: dict(nodes))
        found = {}
        for link, target in (links or {}).items():
            found.setdefault(target, []).append(link)
        monkeypatch.setattr(dc, "by_id_links", lambda d: {t: sorted(v, key=dc.rank_by_id) for t, v in found.items()})
        for name, text in (("MOUNTINFO", mountinfo), ("SWAPS", "Filename Type Size Used Priority\n" + swaps)):
            path = tmp_path / name
            path.write_text(text)
            monkeypatch.setattr(dc, name, str(path))
        (tmp_path / "fstab").write_text(fstab)
        monkeypatch.setattr(dc, "FSTAB", str(tmp_path / "fstab"))
        # An LV's device number: {lv path: "MAJ:MIN"}.
        lvs_devno = lvs_devno or {}
        monkeypatch.setattr(dc, "same_device", lambda path, devno: lvs_devno.get(path) == devno)
        monkeypatch.setattr(dc, "devno_of", lambda path: (devno_of or {}).get(path))
        # The disks' nodes exist and are block devices (read_disk asks os).
        paths = {"/dev/%s" % n for n in nodes}
        fake_os = types.SimpleNamespace(
            path=types.SimpleNamespace(exists=lambda p: p in paths, realpath=lambda p: p),
            stat=lambda p: types.SimpleNamespace(st_mode=stat.S_IFBLK | 0o660),
        )
        monkeypatch.setattr(data_disks, "os", fake_os)

    return make


def mountinfo_line(devno, mount_point, fstype, source, n=[100]):  # noqa: B006 (a counter)
    n[0] += 1
    return "%d 1 %s / %s rw,relatime shared:1 - %s %s rw\n" % (n[0], devno, mount_point, fstype, source)


def read(module, mount_point="/home"):
    return dc.Discovery(module, mount_point, "data", "home").read()


def test_delivered_server(host):
    """sda the system's (/, /boot/efi), /home on vg0/lv_home over nvme0n1 (adopted, its disk
    ours against vg0), a blank NVMe disk named by model and serial, one with no by-id link, a
    disk holding ext4 (foreign); loop, sr, dm, zram devices and partitions are no disks."""
    nodes = {
        "dm-0": "253:0",
        "loop0": "7:0",
        "nvme0n1": "259:0",
        "nvme1n1": "259:1",
        "nvme1n1p1": "259:5",
        "nvme2n1": "259:2",
        "sda": "8:0",
        "sda1": "8:1",
        "sda2": "8:2",
        "sdb": "8:16",
        "sr0": "11:0",
        "zram0": "252:0",
    }
    links = {
        "nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100001": "nvme0n1",
        "nvme-eui.36344730529001230025384100000001": "nvme0n1",
        "nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100002": "nvme1n1",
        "nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100002_1": "nvme1n1",
        "nvme-eui.36344730529001230025384100000002": "nvme1n1",
        "ata-INTEL_SSDSC2KB480G8_PHYF000000480BGN": "sda",
        "wwn-0x55cd2e4150a4d3d1": "sda",
    }
    host(
        nodes,
        mountinfo=mountinfo_line("8:2", "/", "ext4", "/dev/sda2")
        + mountinfo_line("8:1", "/boot/efi", "vfat", "/dev/sda1")
        + mountinfo_line("0:25", "/run", "tmpfs", "tmpfs")
        + mountinfo_line("253:0", "/home", "ext4", "/dev/mapper/vg0-lv_home"),
        swaps="/dev/zram0 partition 8388604 0 100\n",
        fstab="/dev/sda2 / ext4 defaults 0 1\n/dev/mapper/vg0-lv_home /home ext4 defaults 0 2\n",
        links=links,
        lvs_devno={"/dev/vg0/lv_home": "253:0"},
        devno_of={"/dev/zram0": "252:0"},
    )
    answers = {
        LVS: (0, "  vg0|lv_home|/dev/vg0/lv_home|%d|%d|0\n" % (7 * TIB, 7 * TIB), ""),
        PVS: (0, "  /dev/nvme0n1|vg0\n", ""),
    }
    answers.update(disk_answers("/dev/nvme0n1", 7 * TIB, "0x218 LVM2_member\n", pvs_vg="vg0"))
    answers.update(disk_answers("/dev/nvme1n1", 7 * TIB))
    answers.update(disk_answers("/dev/nvme2n1", 7 * TIB))
    answers.update(disk_answers("/dev/sdb", 3 * TIB, "0x438 ext4\n"))
    module = FakeModule(answers)
    found = read(module)

    assert found["excluded"] == [
        {
            "path": "/dev/sda",
            "by_id": "/dev/disk/by-id/ata-INTEL_SSDSC2KB480G8_PHYF000000480BGN",
            "reason": "holds /, /boot/efi",
        }
    ]
    by_path = {d["path"]: d for d in found["disks"]}
    assert list(by_path) == ["/dev/nvme0n1", "/dev/nvme1n1", "/dev/nvme2n1", "/dev/sdb"]
    ours = by_path["/dev/nvme0n1"]
    assert (ours["state"], ours["summary"], ours["home"]) == ("ours", "physical volume of volume group vg0", True)
    assert ours["name"] == "/dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100001"
    blank = by_path["/dev/nvme1n1"]
    assert (blank["state"], blank["home"], blank["size_bytes"]) == ("empty", False, 7 * TIB)
    # The model and serial name, not the namespace's _1 twin or the EUI.
    assert blank["by_id"] == "/dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100002"
    assert len(blank["by_id_links"]) == 3
    assert by_path["/dev/nvme2n1"]["by_id"] is None and by_path["/dev/nvme2n1"]["name"] == "/dev/nvme2n1"
    assert (by_path["/dev/sdb"]["state"], by_path["/dev/sdb"]["summary"]) == ("foreign", "holds ext4")

    home = found["home_volume"]
    assert (home["vg"], home["lv"], home["fstype"], home["adopt"], home["own"]) == (
        "vg0",
        "lv_home",
        "ext4",
        True,
        False,
    )
    assert home["disks"] == ["/dev/nvme0n1"] and home["pvs"] == ["/dev/nvme0n1"]
    assert home["fstab"]["by"] == "path"
    assert found["vg_classified"] == "vg0" and found["mount_point"] == "/home"
    # Nothing was asked of the devices that are no disks, or of the system's disk.
    asked = {argv[-1] for argv in module.calls if argv[0].startswith("/usr/sbin/")}
    assert asked == {"/dev/nvme0n1", "/dev/nvme1n1", "/dev/nvme2n1", "/dev/sdb"}


def test_sim_host_after_a_deploy(host):
    """The sim's host: /dev/vdb (the machine's loop0, a loop major), /home on data/home whose
    device is the kit's loop3; / an overlay, /etc/hosts a bind of the machine's own disk."""
    host(
        {"loop3": "7:3", "vdb": "7:0"},
        mountinfo=mountinfo_line("0:40", "/", "overlay", "overlay")
        + mountinfo_line("254:0", "/etc/hosts", "ext4", "/dev/vda")
        + mountinfo_line("7:3", "/home", "xfs", "/dev/loop3"),
        fstab="UUID=2225d09e /home xfs defaults,nofail,x-systemd.device-timeout=20s 0 0\n",
        lvs_devno={"/dev/data/home": "7:3"},
    )
    answers = {
        LVS: (0, "  data|home|/dev/data/home|%d|%d|0\n" % (14 * TIB, 14 * TIB), ""),
        PVS: (0, "  /dev/vdb|data\n", ""),
    }
    answers.update(disk_answers("/dev/vdb", 14 * TIB, "0x218 LVM2_member\n", pvs_vg="data"))
    found = read(FakeModule(answers))
    assert found["excluded"] == []
    [vdb] = found["disks"]
    assert (vdb["path"], vdb["name"], vdb["state"], vdb["home"]) == ("/dev/vdb", "/dev/vdb", "ours", True)
    assert found["home_volume"]["own"] and not found["home_volume"]["adopt"]
    assert found["home_volume"]["fstab"]["by"] == "uuid"


def test_bare_host_without_lvm_tools(host):
    """No lvm2 yet, /home a plain directory on /: sda holds / and swap, sdb is blank, sdc
    holds no medium, nvme0n1's partition names its parent."""
    host(
        {
            "nvme0n1": "259:0",
            "nvme0n1p1": "259:1",
            "sda": "8:0",
            "sda1": "8:1",
            "sda3": "8:3",
            "sdb": "8:16",
            "sdc": "8:32",
        },
        mountinfo=mountinfo_line("8:1", "/", "ext4", "/dev/sda1")
        + mountinfo_line("259:1", "/srv/scratch", "xfs", "/dev/nvme0n1p1"),
        swaps="/dev/sda3 partition 8388604 0 -2\n",
        devno_of={"/dev/sda3": "8:3"},
    )
    answers = {("/usr/sbin/blockdev", "--getsize64", "/dev/sdc"): (0, "0\n", "")}
    answers.update(disk_answers("/dev/sdb", 4 * TIB))
    module = FakeModule(answers, missing=("lvs", "pvs"))
    found = read(module)
    assert found["excluded"] == [
        {"path": "/dev/nvme0n1", "by_id": None, "reason": "holds a filesystem mounted at /srv/scratch"},
        {"path": "/dev/sda", "by_id": None, "reason": "holds /, swap"},
        {"path": "/dev/sdc", "by_id": None, "reason": "size 0 (no medium)"},
    ]
    assert [(d["path"], d["state"]) for d in found["disks"]] == [("/dev/sdb", "empty")]
    assert found["home_volume"] == {} and found["home_mount"] == {} and found["vg_classified"] == "data"
    assert not any(argv[0] in ("lvs", "pvs") for argv in module.calls)


def test_home_not_on_lvm_is_the_systems(host):
    """/home a plain filesystem on sdb1: its disk is not taken (the storage stage carries the
    content over onto a new volume); the blank disk is the candidate."""
    host(
        {"sda": "8:0", "sda1": "8:1", "sdb": "8:16", "sdb1": "8:17", "sdc": "8:32"},
        mountinfo=mountinfo_line("8:1", "/", "ext4", "/dev/sda1") + mountinfo_line("8:17", "/home", "xfs", "/dev/sdb1"),
    )
    answers = {LVS: (0, "", ""), PVS: (0, "", "")}
    answers.update(disk_answers("/dev/sdc", 8 * TIB))
    found = read(FakeModule(answers))
    assert [e["path"] for e in found["excluded"]] == ["/dev/sda", "/dev/sdb"]
    assert found["excluded"][1]["reason"].startswith("holds /home (not an LVM volume")
    assert [d["path"] for d in found["disks"]] == ["/dev/sdc"]
    assert found["home_volume"] == {} and found["home_mount"]["source"] == "/dev/sdb1"


def test_root_on_lvm_leaves_out_its_volume_groups_disks(host):
    """/ and /home are both logical volumes of one volume group on sda3 (the installer's
    layout): sda is the system's; /home's volume is still reported, to adopt."""
    host(
        {"dm-0": "253:0", "dm-1": "253:1", "sda": "8:0", "sda1": "8:1", "sda3": "8:3", "sdb": "8:16"},
        mountinfo=mountinfo_line("253:0", "/", "ext4", "/dev/mapper/sys-root")
        + mountinfo_line("8:1", "/boot", "ext4", "/dev/sda1")
        + mountinfo_line("253:1", "/home", "ext4", "/dev/mapper/sys-home"),
        lvs_devno={"/dev/sys/root": "253:0", "/dev/sys/home": "253:1"},
    )
    answers = {
        LVS: (0, "  sys|root|/dev/sys/root|100|900|0\n  sys|home|/dev/sys/home|800|900|0\n", ""),
        PVS: (0, "  /dev/sda3|sys\n", ""),
    }
    answers.update(disk_answers("/dev/sdb", 8 * TIB))
    found = read(FakeModule(answers))
    assert found["excluded"] == [{"path": "/dev/sda", "by_id": None, "reason": "holds /, /boot"}]
    assert [(d["path"], d["state"], d["home"]) for d in found["disks"]] == [("/dev/sdb", "empty", False)]
    assert found["home_volume"]["lv"] == "home" and found["home_volume"]["adopt"]
    assert found["home_volume"]["disks"] == ["/dev/sda"]


@pytest.mark.parametrize(
    "names, first",
    [
        (
            ["wwn-0x5002538e40a1b2c3", "ata-SAMSUNG_MZ7LH3T8HMLT-00005_S456NY0M123456"],
            "ata-SAMSUNG_MZ7LH3T8HMLT-00005_S456NY0M123456",
        ),
        (
            ["nvme-eui.0025388b91b2c3d4", "nvme-nvme.144d-53", "nvme-INTEL_SSDPF2KX076T1_PHAX1234"],
            "nvme-INTEL_SSDPF2KX076T1_PHAX1234",
        ),
        (
            ["scsi-35000c500a1b2c3d4", "scsi-SSEAGATE_ST16000NM004J_ZR5ABC12", "wwn-0x5000c500a1b2c3d4"],
            "scsi-SSEAGATE_ST16000NM004J_ZR5ABC12",
        ),
        (["wwn-0x5000c500a1b2c3d4", "lvm-pv-uuid-Abc"], "wwn-0x5000c500a1b2c3d4"),
    ],
)
def test_the_model_and_serial_name_comes_first(names, first):
    assert sorted(names, key=dc.rank_by_id)[0] == first


def test_by_id_links_point_at_kernel_names(tmp_path):
    (tmp_path / "nvme0n1").touch()
    (tmp_path / "nvme0n1p1").touch()
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    (by_id / "nvme-eui.0025").symlink_to("../nvme0n1")
    (by_id / "nvme-SAMSUNG_X_S1").symlink_to("../nvme0n1")
    (by_id / "nvme-SAMSUNG_X_S1-part1").symlink_to("../nvme0n1p1")
    assert dc.by_id_links(str(by_id)) == {
        "nvme0n1": ["nvme-SAMSUNG_X_S1", "nvme-eui.0025"],
        "nvme0n1p1": ["nvme-SAMSUNG_X_S1-part1"],
    }
    assert dc.by_id_links(str(tmp_path / "none")) == {}


@pytest.mark.parametrize(
    "name, parent",
    [
        ("sda1", "sda"),
        ("vdb12", "vdb"),
        ("nvme0n1p3", "nvme0n1"),
        ("mmcblk0p1", "mmcblk0"),
        ("sda", None),
        ("nvme0n1", None),
    ],
)
def test_partitions_by_name(name, parent):
    assert dc.parent_of(name, {}) == parent


def test_whole_disks_one_per_device():
    nodes = {
        "loop0": "7:0",
        "md0": "9:0",
        "nbd0": "43:0",
        "sda": "8:0",
        "sda1": "8:1",
        "vdb": "7:1",
        "xvdf": "202:80",
        "disk0": "8:0",
    }
    # vdb is a loop major inside a container: names decide, not numbers; disk0 is sda again.
    assert dc.whole_disks(nodes) == ["sda", "vdb", "xvdf"]


def test_mountinfo_and_swaps():
    text = "36 25 8:17 / /srv/my\\040data rw,relatime shared:1 - xfs /dev/sdb1 rw\n"
    assert dc.parse_mountinfo(text) == [
        {"devno": "8:17", "mount_point": "/srv/my data", "fstype": "xfs", "source": "/dev/sdb1"}
    ]
    assert dc.parse_swaps("Filename Type Size Used Priority\n/dev/sda3 partition 1 0 -2\n/swap.img file 1 0 -3\n") == [
        "/dev/sda3",
        "/swap.img",
    ]


def test_documentation_matches_the_argument_spec(monkeypatch):
    doc, spec = documented_spec(monkeypatch, dc)
    assert spec["mount_point"]["default"] == "/home" and spec["vg_name"]["default"] == "data"
    assert "sysfs" in " ".join(doc["description"])
