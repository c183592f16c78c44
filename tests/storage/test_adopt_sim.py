"""/home as servers are delivered: an LVM volume of the vendor's own names (vg0/lv_home),
mounted through fstab by /dev/mapper path, holding users' files (the kit's home_lvm
fault). The storage stage adopts it without touching the disk: the data stays byte for
byte (the seed's manifest), the volume and its XFS grow online into the volume group's
free extents, the fstab line by path gets nofail and the bounded device wait and keeps its
path, is reported with the UUID line it should be and is rewritten by UUID only when asked;
a run after that changes nothing. An XFS that overlay2 cannot
use (ftype=0) is refused before any change.

The ext4 volume goes through site.yml end to end in the e2e (kf-node-3 starts with it)."""

import pytest

from storage_helpers import HOST, refused_run, sh, stage, tree, tree_diff, upload_tool, wait_seeded

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MANIFEST = "/var/lib/kunlun-kit/home.manifest"


def lv_bytes(name):
    return int(sh("lvs --noheadings --nosuffix --units b -o lv_size %s" % name).stdout.strip().split(".")[0])


def test_adopts_a_delivered_xfs_home_grows_it_and_keeps_the_data(fresh_host):
    fresh_host(HOST, "home_lvm=xfs", "home_lvm_free=20")
    wait_seeded(MANIFEST)
    # The users' data as the host tool lists it (content, owners, modes, mtimes, xattrs and
    # ACLs, hard links, sparseness; holes not read, unlike the seed's own manifest).
    upload_tool()
    seeded = tree("/home")
    fstab_before = sh("cat /etc/fstab").stdout
    vg_bytes = int(sh("vgs --noheadings --nosuffix --units b -o vg_size vg0").stdout.strip().split(".")[0])
    before_lv, before_fs = lv_bytes("vg0/lv_home"), int(sh("df -B1 --output=size /home | tail -1").stdout)
    assert before_lv < vg_bytes * 0.85, (before_lv, vg_bytes)
    uuid = sh("blkid -p -o value -s UUID /dev/mapper/vg0-lv_home").stdout.strip()

    # The sim inventory lists /dev/vdb as the data disk: it is vg0's own PV, not foreign.
    proc, rec = stage("storage.yml")
    assert proc.returncode == 0, proc.stdout[-5000:]
    # Messages as one line (the callback may fold long ones).
    out = " ".join(proc.stdout.split())
    assert "adopting vg0/lv_home mounted at /home (xfs" in out, out[-5000:]
    # Grown online, volume and filesystem, into the free 20 %; the same filesystem.
    assert lv_bytes("vg0/lv_home") == vg_bytes
    assert int(sh("df -B1 --output=size /home | tail -1").stdout) > before_fs * 1.2
    assert sh("blkid -p -o value -s UUID /dev/mapper/vg0-lv_home").stdout.strip() == uuid
    assert sh("lvs --noheadings -o lv_name data/home", check=False).returncode != 0, "a volume of its own was built"
    # The users' data, byte for byte (ownership, modes, hardlinks, the sparse file).
    now = tree("/home", "newdata")
    assert now == seeded, tree_diff(seeded, now)
    # fstab by path: kept by path with nofail and the device wait (the sim inventory's 20 s),
    # the rest of the line as it was; reported with the line by UUID.
    boot = "defaults,nofail,x-systemd.device-timeout=20s"
    assert sh("cat /etc/fstab").stdout == fstab_before.replace(
        "/dev/mapper/vg0-lv_home /home xfs defaults 0 2", "/dev/mapper/vg0-lv_home /home xfs %s 0 2" % boot
    )
    assert "mounts /home by path (/dev/mapper/vg0-lv_home /home xfs defaults 0 2); kept by path" in out, out[-4000:]
    assert "UUID=%s /home xfs %s 0 2" % (uuid, boot) in out, out[-4000:]
    assert "/home: vg0/lv_home adopted" in out and "ftype=1" in out, out[-4000:]

    # No run in between to show that the line by path, reported, is no change: the e2e's
    # second run does (kf-node-3's adopted ext4, mounted by path); that the grown volume is
    # not grown again, the last run below.

    # Asked to: fstab by UUID, the rest of the line kept; then nothing to change again.
    proc, rec = stage("storage.yml", "-e", "storage_fstab_by_uuid=true")
    assert proc.returncode == 0 and rec["changed"] == 1, (rec, proc.stdout[-4000:])
    lines = [line.split() for line in sh("cat /etc/fstab").stdout.splitlines() if " /home " in line]
    assert lines == [["UUID=%s" % uuid, "/home", "xfs", boot, "0", "2"]], lines
    proc, rec = stage("storage.yml", "-e", "storage_fstab_by_uuid=true")
    assert proc.returncode == 0 and rec["changed"] == 0, (rec, proc.stdout[-4000:])
    now = tree("/home", "newdata")
    assert now == seeded, tree_diff(seeded, now)


def test_refuses_an_xfs_overlay2_cannot_use_and_changes_nothing(fresh_host):
    fresh_host(HOST, "home_lvm=xfs_ftype0", "home_lvm_free=10")
    wait_seeded(MANIFEST)
    upload_tool()
    refused_run(
        "storage.yml",
        ["/home (vg0/lv_home) is xfs with ftype=0", "overlay2 needs XFS with ftype=1 or ext4", "mkfs.xfs -n ftype=1"],
    )
    # Preflight refuses it with the same words, before any stage (the snapshot covers
    # the volume's size, fstab and /home's checksums).
    refused_run("preflight.yml", ["/home (vg0/lv_home) is xfs with ftype=0"])
