"""carry_over: the pure logic (module_utils/carry_over_tree.py) and the module's refusals
that need no root: manifests and verification on small trees, the layout-independent
content digest, the journal, room computation, mountinfo/fstab/rsync parsing, /proc scans
on a recorded /proc tree."""

import json
import os
import stat

import pytest

from ansible.module_utils import carry_over_tree as t

MOUNTINFO = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard\n"
    "98 22 7:3 / /home rw,relatime shared:40 - xfs /dev/mapper/data-home rw,inode64\n"
    "99 22 7:3 / /mnt/kunlun-carry-home rw,relatime shared:41 - xfs /dev/loop3 rw\n"
    "120 22 0:52 / /srv/with\\040space rw - tmpfs tmpfs rw\n"
    "121 98 0:53 / /home/alice/mnt rw - tmpfs tmpfs rw\n"
)

RSYNC_STATS = """
Number of files: 3,215 (reg: 3,100, dir: 110, link: 4, dev: 1)
Number of created files: 3,214 (reg: 3,100, dir: 109, link: 4, dev: 1)
Number of deleted files: 2
Number of regular files transferred: 3,100
Total file size: 1,339,614,312 bytes
Total transferred file size: 1,339,614,312 bytes
Literal data: 265,871,977 bytes
"""


# ---------------------------------------------------------------- trees and verification


def make_tree(root):
    root.mkdir()
    (root / "d").mkdir()
    (root / "d/file").write_bytes(b"hello\n")
    (root / "name with space\nand newline").write_text("odd")
    (root / "ünï").write_text("unicode")
    os.link(root / "d/file", root / "hard")
    os.symlink("d/file", root / "sym")
    os.mkfifo(root / "fifo")
    with open(root / "sparse", "wb") as f:
        f.truncate(10 << 20)
        f.seek(5 << 20)
        f.write(b"data")
    os.utime(root / "d/file", ns=(1, 1_700_000_000_123_456_789))
    return root


def copy_tree(src, dst):
    """A faithful copy by hand (what rsync -aHAXS would produce)."""
    os.system("cp -a --sparse=always '%s' '%s'" % (src, dst))


def scan(path):
    return t.TreeScan(str(path), hash_content=True).scan()


def test_identical_copy_verifies(tmp_path):
    src = make_tree(tmp_path / "src")
    copy_tree(src, tmp_path / "dst")
    a, b = scan(src), scan(tmp_path / "dst")
    assert t.compare_scans(a, b) == []
    assert a.manifest_digest() == b.manifest_digest()
    assert a.entries == 9 and a.files == 5 and len(a.link_groups()) == 1
    assert a.summary()["bytes"] == 6 + 3 + len("unicode".encode()) + (10 << 20)


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda d: (d / "d/file").write_bytes(b"hellO\n"), "d/file: mtime_ns, sha256 differ"),
        (lambda d: os.unlink(d / "ünï"), "ünï: missing in the copy"),
        (lambda d: (d / "extra").write_text("x"), "extra: present in the copy only"),
        (lambda d: os.chmod(d / "d", 0o700), "d: mode differ"),
        (lambda d: (os.unlink(d / "sym"), os.symlink("elsewhere", d / "sym")), "sym: target"),
        (
            lambda d: (
                os.unlink(d / "hard"),
                (d / "hard").write_bytes(b"hello\n"),
                os.utime(d / "hard", ns=(1, 1_700_000_000_123_456_789)),
            ),
            "hard-link group not preserved: d/file, hard",
        ),
        (lambda d: (os.unlink(d / "fifo"), (d / "fifo").write_text("")), "fifo: type p in the source, f in the copy"),
        (lambda d: os.utime(d / "d/file", ns=(1, 1_700_000_000_123_456_000)), "d/file: mtime_ns differ"),
    ],
)
def test_each_kind_of_difference_is_named(tmp_path, damage, words):
    src = make_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    copy_tree(src, dst)
    damage(dst)
    diffs = t.compare_scans(scan(src), scan(dst))
    assert any(words in d for d in diffs), diffs


def test_xattr_difference_is_found(tmp_path):
    src = make_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    copy_tree(src, dst)
    try:
        os.setxattr(dst / "d/file", "user.k", b"v")
    except OSError:
        pytest.skip("no user xattrs on this filesystem")
    diffs = t.compare_scans(scan(src), scan(dst))
    assert diffs == ["d/file: xattrs differ", "hard: xattrs differ"]  # one inode, two names


def test_mismatched_paths_lists_what_to_copy_again(tmp_path):
    src = make_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    copy_tree(src, dst)
    os.unlink(dst / "hard")
    (dst / "hard").write_bytes(b"hello\n")
    (dst / "junk").write_text("x")
    assert t.mismatched_paths(scan(src), scan(dst)) == ["d/file", "hard", "junk"]


def test_difference_list_is_bounded(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / ("f%d" % i)).write_text(str(i))
    dst = tmp_path / "dst"
    dst.mkdir()
    os.utime(dst, ns=(os.stat(src).st_atime_ns, os.stat(src).st_mtime_ns))
    diffs = t.compare_scans(scan(src), scan(dst), limit=5)
    assert len(diffs) == 6 and diffs[-1].startswith("... and 2")  # 30 missing + root dir mtime


def test_journal_and_excluded_names_at_top_only(tmp_path):
    src = make_tree(tmp_path / "src")
    (src / "d" / t.JOURNAL_NAME).write_text("{}")
    (src / t.JOURNAL_NAME).write_text("{}")
    s = scan(src)
    assert s.excluded_present == [t.JOURNAL_NAME]
    assert "d/" + t.JOURNAL_NAME in s.records


def test_submounts_are_reported_not_entered(tmp_path):
    s = t.TreeScan("/dev").scan() if os.path.ismount("/dev/pts") else None
    if s is None:
        pytest.skip("no /dev/pts mount")
    assert "/dev/pts" in s.submounts


# ---------------------------------------------------------------- content digest


def test_digest_ignores_layout_but_not_bytes(tmp_path):
    dense = tmp_path / "dense"
    sparse = tmp_path / "sparse"
    payload = os.urandom(70000)
    dense.write_bytes(bytes(3 << 20) + payload + bytes(1 << 20))
    with open(sparse, "wb") as f:
        f.truncate((4 << 20) + 70000)
        f.seek(3 << 20)
        f.write(payload)
    assert os.stat(sparse).st_blocks < os.stat(dense).st_blocks
    assert t.content_digest(str(dense)) == t.content_digest(str(sparse))
    flipped = bytearray(payload)
    flipped[12345] ^= 1
    with open(sparse, "r+b") as f:
        f.seek(3 << 20)
        f.write(bytes(flipped))
    assert t.content_digest(str(dense)) != t.content_digest(str(sparse))


def test_digest_distinguishes_size_and_position(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"x" + bytes(100))
    b.write_bytes(b"x" + bytes(101))
    c.write_bytes(bytes(1) + b"x" + bytes(99))
    assert len({t.content_digest(str(p)) for p in (a, b, c)}) == 3


def test_digest_of_empty_and_all_zero_files(tmp_path):
    e, z = tmp_path / "e", tmp_path / "z"
    e.write_bytes(b"")
    z.write_bytes(bytes(200000))
    assert t.content_digest(str(e)) != t.content_digest(str(z))


def test_digest_dense_matches_block_walk(tmp_path):
    """Data segments separated by holes smaller than a block are hashed once each."""
    p = tmp_path / "f"
    with open(p, "wb") as f:
        for off in range(0, 1 << 20, 8192):
            f.seek(off)
            f.write(b"ab")
    q = tmp_path / "g"
    q.write_bytes(p.read_bytes())
    assert t.content_digest(str(p)) == t.content_digest(str(q))


# ---------------------------------------------------------------- room


def test_room_fits_and_refuses_with_numbers():
    assert t.room_problem(100 << 30, 200 << 30, 5, "the content of /home", "the new filesystem", "fix") is None
    msg = t.room_problem(
        100 << 30, 104 << 30, 5, "the content of /home", "the new filesystem at /mnt/x", "add a data disk"
    )
    assert msg.startswith("not enough room: the content of /home needs 105.0 GiB (100.0 GiB + 5% margin)")
    assert "has 104.0 GiB available; add a data disk" in msg
    assert t.room_problem(0, 0, 5, "a", "b", "c") is None


def test_human():
    assert t.human(512) == "512 B"
    assert t.human(3 << 40) == "3.0 TiB"


# ---------------------------------------------------------------- journal


def test_journal_roundtrip_phases_and_dir_times(tmp_path):
    d = tmp_path / "vol"
    d.mkdir()
    os.utime(d, ns=(5, 1_600_000_000_000_000_001))
    path = str(d / t.JOURNAL_NAME)
    assert t.read_journal(path) is None
    j = t.new_journal("/home", str(d), "/dev/data/home", "u-1")
    for phase in ("copying", "copied", "verified", "switching", "switched"):
        t.set_phase(j, phase)
        t.write_journal(path, j)
    back = t.read_journal(path)
    assert back["phase"] == "switched" and back["src"] == "/home"
    assert [h["phase"] for h in back["history"]] == ["copying", "copied", "verified", "switching", "switched"]
    assert os.stat(d).st_mtime_ns == 1_600_000_000_000_000_001
    assert not os.path.exists(path + ".tmp")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_journal_rejects_garbage_and_unknown_phase(tmp_path):
    p = tmp_path / "j"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        t.read_journal(str(p))
    p.write_text(json.dumps({"format": 1, "phase": "exploded"}))
    with pytest.raises(ValueError, match="not a carry-over journal"):
        t.read_journal(str(p))
    with pytest.raises(ValueError):
        t.set_phase(t.new_journal("/a", "/b"), "bogus")


def test_journal_history_is_bounded():
    j = t.new_journal("/a", "/b")
    for _ in range(80):
        t.set_phase(j, "copying")
    assert len(j["history"]) == 50


# ---------------------------------------------------------------- mounts, fstab, rsync


def test_parse_mountinfo():
    m = t.parse_mountinfo(MOUNTINFO)
    home = t.mount_at(m, "/home")
    assert (home["major"], home["minor"], home["fstype"], home["source"]) == (7, 3, "xfs", "/dev/mapper/data-home")
    assert t.mount_at(m, "/srv/with space")["fstype"] == "tmpfs"
    assert [x["mount_point"] for x in t.mounts_of(m, 7, 3)] == ["/home", "/mnt/kunlun-carry-home"]
    assert t.mounts_below(m, "/home") == ["/home/alice/mnt"]
    assert t.mount_at(m, "/var") is None


FSTAB = "# static\nUUID=root-uuid / ext4 errors=remount-ro 0 1\n/dev/vdc none swap sw 0 0\n"


def test_fstab_plan_appends_once():
    new, problem = t.fstab_plan(FSTAB, "/home", "u-1", "xfs", "defaults")
    assert problem is None
    assert new == FSTAB + "UUID=u-1 /home xfs defaults 0 0\n"
    again, problem = t.fstab_plan(new, "/home", "u-1", "xfs", "defaults")
    assert again == new and problem is None


def test_fstab_plan_accepts_equivalent_and_fixes_options():
    text = FSTAB + 'UUID="u-1"\t/home\txfs\tdefaults\t0\t0\n'
    assert t.fstab_plan(text, "/home", "u-1", "xfs", "defaults") == (text, None)
    new, problem = t.fstab_plan(
        FSTAB + "/dev/data/home /home xfs noatime 0 0\n", "/home", "u-1", "xfs", "defaults", ("/dev/data/home",)
    )
    assert problem is None and new.endswith("UUID=u-1 /home xfs defaults 0 0\n")
    assert new.count("/home") == 1


def test_fstab_plan_refuses_other_device():
    text = FSTAB + "LABEL=old /home ext4 defaults 0 2\n"
    new, problem = t.fstab_plan(text, "/home", "u-1", "xfs", "defaults")
    assert new == text
    assert "already mounts LABEL=old at /home (line 4" in problem and "Remove or comment out" in problem


def test_fstab_plan_ignores_comments_and_escapes_spaces():
    text = "#UUID=x /home xfs defaults 0 0\n"
    new, problem = t.fstab_plan(text, "/srv/my data", "u", "xfs", "defaults")
    assert problem is None and new.endswith("UUID=u /srv/my\\040data xfs defaults 0 0\n")
    assert t.fstab_plan(new, "/srv/my data", "u", "xfs", "defaults") == (new, None)


def test_fstab_plan_on_empty_file_without_newline():
    assert t.fstab_plan("", "/home", "u", "xfs", "defaults")[0] == "UUID=u /home xfs defaults 0 0\n"
    assert t.fstab_plan("x y z", "/home", "u", "xfs", "defaults")[0] == "x y z\nUUID=u /home xfs defaults 0 0\n"


def test_parse_rsync_stats():
    s = t.parse_rsync_stats(RSYNC_STATS)
    assert s == {"created": 3214, "deleted": 2, "transferred": 3100, "files": 3215, "transferred_bytes": 1339614312}
    assert t.parse_rsync_stats("")["created"] is None


def test_slug_and_display():
    assert t.slug("/var/lib/docker") == "var-lib-docker"
    assert t.slug("/") == "root"
    assert t.display("a\nb") == "a\\nb"
    assert t.display(b"x\xe9".decode("utf-8", "surrogateescape")) == "x\\xe9"


# ---------------------------------------------------------------- /proc scans (recorded tree)


def fake_proc(root, pid, comm, cmdline=b"", ppid=1, fds=()):
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "fdinfo").mkdir()
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(cmdline)
    (d / "stat").write_text("%d (%s) S %d 1 1 0 -1\n" % (pid, comm, ppid))
    for n, (target, flags) in enumerate(fds):
        os.symlink(target, d / "fd" / str(n))
        (d / "fdinfo" / str(n)).write_text("pos:\t0\nflags:\t%s\nmnt_id:\t22\n" % flags)


def test_writers_below_sees_only_writers_below_the_path(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 100, "bash", fds=[("/home/alice/.bash_history", "0100001")])
    fake_proc(proc, 101, "less", fds=[("/home/alice/notes", "0100000")])
    fake_proc(proc, 102, "dockerd", fds=[("/var/lib/docker/x", "0100002")])
    fake_proc(proc, 103, "ansible", fds=[("/home/ops/.ansible/tmp/x", "0100001")])
    fake_proc(proc, 104, "homer", fds=[("/homework/x", "0100001")])
    got = t.writers_below("/home", proc=str(proc), skip_pids={103})
    assert got == [(100, "bash", "/home/alice/.bash_history")]
    assert t.writers_below("/var/lib/docker", proc=str(proc)) == [(102, "dockerd", "/var/lib/docker/x")]


def test_ancestors_follow_ppid(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 10, "sshd", ppid=1)
    fake_proc(proc, 20, "sh", ppid=10)
    fake_proc(proc, 30, "python3", ppid=20)
    assert t.ancestors(30, proc=str(proc)) == {30, 20, 10, 1}


def test_rsync_pids_for_matches_exact_target(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 7, "rsync", b"/usr/bin/rsync\0-aHAXS\0/home/\0/mnt/kunlun-carry-home/\0")
    fake_proc(proc, 8, "rsync", b"rsync\0-a\0/x/\0/mnt/kunlun-carry-home-2/\0")
    fake_proc(proc, 9, "vim", b"vim\0/mnt/kunlun-carry-home/\0")
    assert t.rsync_pids_for("/mnt/kunlun-carry-home", proc=str(proc)) == [7]


# ---------------------------------------------------------------- the module (no root)


def run_module(capsys, args, check=False):
    import carry_over
    from ansible.module_utils.testing import patch_module_args

    if check:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            carry_over.main()
    return json.loads(capsys.readouterr().out)


def test_module_refuses_missing_src(tmp_path, capsys):
    r = run_module(capsys, {"src": str(tmp_path / "nope"), "dest": str(tmp_path / "d")})
    assert r["failed"] and "does not exist or is not a directory" in r["msg"]


def test_module_refuses_nested_dest(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    r = run_module(capsys, {"src": str(tmp_path / "s"), "dest": str(tmp_path / "s/inner")})
    assert r["failed"] and "are nested" in r["msg"]


def test_module_refuses_foreign_dest(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "d/precious").write_text("x")
    r = run_module(capsys, {"src": str(tmp_path / "s"), "dest": str(tmp_path / "d"), "state_dir": str(tmp_path / "st")})
    assert r["failed"] and "already holds content (precious)" in r["msg"]
    assert (tmp_path / "d/precious").read_text() == "x"


def test_module_dest_check_mode_reports_and_changes_nothing(tmp_path, capsys):
    src = make_tree(tmp_path / "src")
    before = sorted(os.listdir(tmp_path))
    r = run_module(
        capsys, {"src": str(src), "dest": str(tmp_path / "dst"), "state_dir": str(tmp_path / "st")}, check=True
    )
    assert r["changed"] is True and r["phase"] == "new"
    assert r["moved"]["entries"] == 9 and r["moved"]["hardlink_groups"] == 1
    assert "would copy 9 entries" in r["actions"][0]
    assert sorted(os.listdir(tmp_path)) == before


def test_module_device_check_mode_without_device(tmp_path, capsys):
    src = make_tree(tmp_path / "src")
    r = run_module(
        capsys,
        {"src": str(src), "device": str(tmp_path / "no-such-lv"), "staging": str(tmp_path / "stage")},
        check=True,
    )
    assert r["changed"] is True and "does not exist yet" in r["actions"][0]
    assert not (tmp_path / "stage").exists()
    r = run_module(
        capsys, {"src": str(src), "device": str(tmp_path / "no-such-lv"), "staging": str(tmp_path / "stage")}
    )
    assert r["failed"] and "create the volume first" in r["msg"]


def test_module_refuses_non_block_device(tmp_path, capsys):
    src = make_tree(tmp_path / "src")
    (tmp_path / "img").write_text("")
    r = run_module(capsys, {"src": str(src), "device": str(tmp_path / "img"), "staging": str(tmp_path / "stage")})
    assert r["failed"] and "is not a block device" in r["msg"]
