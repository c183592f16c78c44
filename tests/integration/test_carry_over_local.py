"""carry_over for real on this machine: loop devices, XFS, rsync, mounts, SIGKILL.

Everything happens under a scratch directory in /tmp (a loop-backed XFS volume, a seeded
source tree, a scratch fstab); the machine's /home, /var/lib/docker and /etc/fstab are
never touched. The module runs through ansible-playbook from the project root, so
ansible.cfg's library/module_utils apply.

Check mode, a real run and its re-runs, the module's refusals, and the one fault the sim
suite cannot reach: a re-run started while the module of a killed ansible-playbook still
holds the lock (the module frozen at a point recognised from observable state only - the
journal phase on the new volume, rsync processes - the product has no test hooks). The
test then compares an independent checksum list of the seeded content (paths, types,
modes, owners, sizes, mtimes, sha256, symlink targets, xattrs/ACLs, hard-link groups) of
the source (seen under the mount through a bind mount of its parent) and of the copy
against the list taken before: nothing lost or changed.
"""

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kunlun_fleet.sim.config import SIM_HOME

pytestmark = pytest.mark.integration


def _orphaned_workers():
    """ansible-playbook processes of this checkout left with init as their parent: a worker
    of ansible-core 2.19 runs in a session of its own, so killing ansible-playbook's process
    group (the "ansible-playbook-group" victim) leaves it behind, idle, once its module ended."""
    mine = str(ROOT / ".venv" / "bin" / "ansible-playbook")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path("/proc", pid, "cmdline").read_bytes().split(b"\0")
            ppid = int(Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == 1 and len(argv) > 1 and argv[1].decode(errors="replace") == mine:
            found.append(int(pid))
    return found


@pytest.fixture(scope="module", autouse=True)
def no_orphans_left():
    """After the module's last test (every carry-over has been resumed and checked), end
    the workers the killed runs left, so a run of the suite leaves no process behind."""
    before = set(_orphaned_workers())
    yield
    for pid in set(_orphaned_workers()) - before:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = ROOT / ".venv/bin/ansible-playbook"
JOURNAL = ".kunlun-carry-over.json"
TOOLS = ("rsync", "mkfs.xfs", "losetup", "setfacl", "setfattr", "blkid", "mount")


def _missing_tools():
    return [t for t in TOOLS if shutil.which(t) is None]


if os.geteuid() != 0 or _missing_tools() or "xfs" not in Path("/proc/filesystems").read_text():
    pytest.skip(
        "needs root, XFS and %s (apt-get install rsync xfsprogs acl attr)" % ", ".join(TOOLS), allow_module_level=True
    )


# ----------------------------------------------------------------------------- helpers


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def mountinfo():
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split(" - ")[0].split()
        out.append(f[4].replace("\\040", " "))
    return out


def machine_mounts():
    """The mount table without the sim engine's own (other lanes' sim hosts start and stop
    containers under the sim home at any time while this suite runs)."""
    return [m for m in mountinfo() if not m.startswith(SIM_HOME + "/")]


def is_mountpoint(path):
    return str(path) in mountinfo()


class Scratch:
    """A scratch area with a loop-backed XFS volume; cleans up its mounts and loops."""

    def __init__(self, base, size="3G"):
        self.base = Path(base)
        self.src = self.base / "home"
        self.staging = self.base / "stage"
        self.fstab = self.base / "fstab"
        self.state_dir = self.base / "state"
        self.peek = self.base / "peek"
        self.loops = []
        self.src.mkdir()
        self.fstab.write_text("# scratch fstab\n/dev/vda / ext4 defaults 0 1\n")
        self.device = self.new_loop("disk.img", size)
        sh("mkfs.xfs", "-q", "-f", "-n", "ftype=1", self.device)

    def new_loop(self, name, size):
        img = self.base / name
        sh("truncate", "-s", size, str(img))
        dev = sh("losetup", "-f", "--show", str(img)).stdout.strip()
        self.loops.append(dev)
        return dev

    def underneath(self):
        """A view of the parent directory without the mounts on top (the old content)."""
        if not is_mountpoint(self.peek):
            self.peek.mkdir(exist_ok=True)
            sh("mount", "--bind", str(self.base), str(self.peek))
        return self.peek / self.src.name

    def cleanup(self):
        for _ in range(3):
            mine = [m for m in mountinfo() if m == str(self.base) or m.startswith(str(self.base) + "/")]
            for m in sorted(mine, key=len, reverse=True):
                sh("umount", "-l", m, check=False)
        for dev in self.loops:
            sh("losetup", "-d", dev, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def scratch():
    base = tempfile.mkdtemp(prefix="kf-carry-", dir="/tmp")
    s = Scratch(base)
    try:
        yield s
    finally:
        kill_leftovers(s)
        s.cleanup()


def kill_leftovers(s):
    for pid in pids_with_arg(str(s.base)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def pids_with_arg(fragment, name=None):
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if name and os.path.basename(argv[0]).decode(errors="replace") != name:
            continue
        if any(fragment.encode() in a for a in argv):
            out.append(int(p.name))
    return out


def seed(root, big_mb=240, small=3000, rng=None):
    """Many small files, large dense and sparse files, hard links, odd names, ACLs,
    xattrs, symlinks, a FIFO, a device node, odd owners and modes."""
    rng = rng or random.Random(4)
    root = Path(root)
    for i in range(small):
        d = root / ("users/u%02d/dir%02d" % (i % 17, i % 23))
        d.mkdir(parents=True, exist_ok=True)
        (d / ("f%05d.txt" % i)).write_bytes(rng.randbytes(rng.randint(0, 8192)))
    big = root / "users/u01/data"
    big.mkdir(parents=True, exist_ok=True)
    for i in range(max(1, big_mb // 4)):
        (big / ("blob%03d.bin" % i)).write_bytes(rng.randbytes(4 << 20))
    # 256 MiB apparent, 16 KiB of data. Every hash and copy reads the holes as zeros, so
    # the apparent size is kept small enough not to dominate the suite's CPU.
    with open(root / "users/u02/sparse.img", "wb") as f:
        f.truncate(256 << 20)
        for off in (0, 64 << 20, (150 << 20) + 12345, (256 << 20) - 4096):
            f.seek(off)
            f.write(rng.randbytes(4096))
    with open(root / "users/u02/zeros-dense.bin", "wb") as f:  # explicit zeros, not holes
        f.write(bytes(3 << 20))
    odd = root / "odd names"
    odd.mkdir()
    for name in (
        "with space",
        "new\nline",
        "tab\there",
        "ünï©ødé-名前",
        "-leading-dash",
        "back\\slash",
        "quote'\"",
        "star*?[x]",
        " trailing ",
    ):
        (odd / name).write_text(name)
    (odd / b"latin1-\xe9".decode("utf-8", "surrogateescape")).write_text("raw byte name")
    hl = root / "links"
    hl.mkdir()
    (hl / "a").write_text("linked content")
    os.link(hl / "a", hl / "b")
    os.link(hl / "a", root / "users/u03/c-link")
    os.link(root / "users/u02/sparse.img", hl / "sparse-link")
    os.symlink("a", hl / "rel-link")
    os.symlink("/nonexistent/target", hl / "dangling")
    os.symlink("../users", hl / "dir-link")
    os.mkfifo(hl / "fifo")
    os.mknod(hl / "null-dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    acl = root / "acl"
    acl.mkdir()
    (acl / "file").write_text("acl")
    sh("setfacl", "-m", "u:1234:rw,g:2345:r", str(acl / "file"))
    sh("setfacl", "-d", "-m", "u:1234:rwx", str(acl))
    (acl / "inherits").write_text("default acl")
    (acl / "xattr").write_text("x")
    sh("setfattr", "-n", "user.kunlun", "-v", "value with spaces", str(acl / "xattr"))
    sh("setfattr", "-n", "trusted.overlay.opaque", "-v", "y", str(acl))
    os.chown(acl / "file", 4242, 4343)
    os.chown(hl / "dangling", 5151, 5252, follow_symlinks=False)
    os.chmod(acl / "xattr", 0o4751)
    os.chmod(root / "users/u04", 0o1770)
    os.utime(odd / "with space", ns=(1_000_000_000, 1_234_567_891_123_456_789))


def checksum_list(root, exclude_top=(JOURNAL,)):
    """Independent of the module's code: (path, type, mode, uid, gid, size, mtime_ns,
    sha256, link target, xattrs) per entry + the hard-link groups."""
    root = str(root)
    rows = []
    inodes = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames) + ([] if dirpath != root else ["."]):
            path = os.path.normpath(os.path.join(dirpath, name))
            rel = os.path.relpath(path, root)
            if rel in exclude_top:
                continue
            st = os.lstat(path)
            digest = link = None
            if stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                digest = h.hexdigest()
            if stat.S_ISLNK(st.st_mode):
                link = os.readlink(path)
            xattrs = tuple(
                sorted(
                    (n, os.getxattr(path, n, follow_symlinks=False))
                    for n in os.listxattr(path, follow_symlinks=False)
                    if not n.startswith("trusted.SGI_ACL")
                )
            )
            mtime = None if stat.S_ISDIR(st.st_mode) and rel == "." else st.st_mtime_ns
            rows.append(
                (
                    rel,
                    stat.S_IFMT(st.st_mode),
                    stat.S_IMODE(st.st_mode),
                    st.st_uid,
                    st.st_gid,
                    st.st_size if not stat.S_ISDIR(st.st_mode) else None,
                    mtime,
                    digest,
                    link,
                    st.st_rdev if stat.S_ISCHR(st.st_mode) else None,
                    xattrs,
                )
            )
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                inodes.setdefault(st.st_ino, []).append(rel)
    groups = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
    return sorted(rows), groups


def playbook(s, tmp, check=False, diff=False, **args):
    params = dict(
        src=str(s.src), device=s.device, staging=str(s.staging), fstab=str(s.fstab), state_dir=str(s.state_dir)
    )
    params.update(args)
    params = {k: v for k, v in params.items() if v is not None}
    pb = Path(tmp) / "carry.yml"
    pb.write_text(
        textwrap.dedent("""\
        - name: Carry over (test)
          hosts: localhost
          connection: local
          gather_facts: false
          tasks:
            - name: Carry
              carry_over: %s
              register: carried
        """)
        % json.dumps(params)
    )
    argv = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-e", "ansible_python_interpreter=/usr/bin/python3", str(pb)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    return argv


def env():
    e = dict(os.environ)
    e.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="False",
    )
    return e


def task_result(stdout):
    # profile_tasks/timer (ansible.cfg) print after the JSON document
    data, _ = json.JSONDecoder().raw_decode(stdout[stdout.index("{") :])
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


def run(argv):
    p = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    try:
        return p.returncode, task_result(p.stdout)
    except (ValueError, KeyError, IndexError):
        raise AssertionError(
            "ansible-playbook output not understood (rc=%d):\n%s\n%s"
            % (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
        ) from None


def journal_phase(s):
    for p in (s.staging / JOURNAL, s.src / JOURNAL):
        try:
            return json.loads(p.read_text())["phase"]
        except (OSError, ValueError, KeyError):
            continue
    return None


def lock_path(s):
    return Path("/run/lock/kunlun-carry-over-{}.lock".format(str(s.src).strip("/").replace("/", "-")))


def module_pid(s):
    """The module process: it holds the lock and wrote its pid into the lock file."""
    lock = lock_path(s)
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    if pid and Path("/proc/%d" % pid).exists() and lock_held_by(pid, lock):
        return pid
    return None


def lock_held_by(pid, lock):
    """Whether pid has the lock file open (its holder, or a module waiting for it)."""
    try:
        for fd in Path("/proc/%d/fd" % pid).iterdir():
            if os.readlink(fd) == str(lock):
                return True
    except OSError:
        pass
    return False


def lock_waiters(s, holder):
    lock = lock_path(s)
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) != holder and lock_held_by(int(p.name), lock)
    ]


def _during_copy(s):
    return journal_phase(s) == "copying" and pids_with_arg(str(s.staging) + "/", name="rsync")


def kill_playbook_keep_module(argv, s, predicate, deadline=300):
    """Start ansible-playbook; when predicate holds, freeze its module (SIGSTOP) and SIGKILL
    ansible-playbook's process group. With the linear strategy the module runs below the
    worker, in the worker's own session (ansible-core 2.19), and survives its controller as a
    module on a remote host survives its SSH connection (under Mitogen it would run in a
    context of ansible-playbook's group and die with it). Returns the frozen module's pid."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=dict(env(), ANSIBLE_STRATEGY="linear"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    end = time.time() + deadline
    try:
        while time.time() < end:
            if proc.poll() is not None:
                raise AssertionError("the run ended before the fault point")
            pid = module_pid(s) if predicate(s) else None
            if pid:
                os.kill(pid, signal.SIGSTOP)
                os.killpg(proc.pid, signal.SIGKILL)
                return pid
            time.sleep(0.002)
        raise AssertionError("fault point never reached")
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


def fstab_lines_for(s):
    return [line for line in s.fstab.read_text().splitlines() if line.split()[1:2] == [str(s.src)]]


def assert_carried(s, before):
    """Source untouched underneath, copy identical, switched exactly once."""
    assert is_mountpoint(s.src)
    assert not is_mountpoint(s.staging)
    assert checksum_list(s.src) == before, "the copy differs from the seeded content"
    assert checksum_list(s.underneath()) == before, "the source changed"
    uuid = sh("blkid", "-p", "-o", "value", "-s", "UUID", s.device).stdout.strip()
    assert fstab_lines_for(s) == ["UUID=%s %s xfs defaults 0 0" % (uuid, s.src)]
    assert json.loads((s.src / JOURNAL).read_text())["phase"] == "switched"
    assert not pids_with_arg(str(s.base), name="rsync")


# ----------------------------------------------------------------------------- tests


def test_carry_check_mode_then_real_then_idempotent(scratch, tmp_path):
    s = scratch
    seed(s.src, big_mb=40, small=500)
    before = checksum_list(s.src)
    fstab_before = s.fstab.read_text()
    mounts_before = machine_mounts()

    rc, res = run(playbook(s, tmp_path, check=True, diff=True))
    assert rc == 0 and res["changed"] is True, res
    assert res["moved"]["entries"] == len(before[0])
    assert res["moved"]["hardlink_groups"] == len(before[1])
    assert "UUID=" in res["diff"][0]["after"] and res["diff"][0]["before"] == fstab_before
    assert s.fstab.read_text() == fstab_before and machine_mounts() == mounts_before
    assert not s.state_dir.exists() and not s.staging.exists()

    rc, res = run(playbook(s, tmp_path, diff=True))
    assert rc == 0 and res["changed"] is True and res["phase"] == "switched", res
    assert res["verified"]["entries"] == len(before[0])
    assert_carried(s, before)
    # sparse stays sparse on the new volume
    st = os.stat(s.src / "users/u02/sparse.img")
    assert st.st_blocks * 512 < 16 << 20

    rc, res = run(playbook(s, tmp_path, diff=True))
    assert rc == 0 and res["changed"] is False, res
    rc, res = run(playbook(s, tmp_path, check=True, diff=True))
    assert rc == 0 and res["changed"] is False, res
    assert_carried(s, before)


# SIGKILL at every phase of both carry-overs (the module, the module with its children,
# ansible-playbook), each followed by a re-run that resumes and loses nothing, goes through
# the stage playbooks on a sim host: tests/storage/test_carry_over_faults_sim.py::
# test_sigkill_at_every_phase_then_rerun_loses_nothing (the volume mounted at src before the
# journal says so included). Only what it cannot reach is here: there every re-run waits for
# the lock to be free first, so that its fault watcher sees one run at a time.


@pytest.mark.slow
def test_rerun_waits_for_the_module_its_killed_run_left(scratch, tmp_path):
    """ansible-playbook killed during the copy: its module goes on. Held frozen, it still
    holds the lock when the re-run's module starts: the re-run waits for it, then finds the
    carry-over done and changes nothing."""
    s = scratch
    seed(s.src, big_mb=40, small=500)
    before = checksum_list(s.src)
    argv = playbook(s, tmp_path)
    orphan = kill_playbook_keep_module(argv, s, _during_copy)
    assert journal_phase(s) == "copying"
    rerun = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not lock_waiters(s, orphan):
            assert rerun.poll() is None, "the re-run ended while the orphaned module held the lock"
            assert time.time() < deadline, "the re-run's module never came to wait for the lock"
            time.sleep(0.05)
        # the orphan, frozen, still holds the lock: the other process with it open waits
        assert module_pid(s) == orphan, "the orphaned module no longer holds the lock"
        assert journal_phase(s) == "copying" and not is_mountpoint(s.src)
    finally:
        if Path("/proc/%d" % orphan).exists():
            os.kill(orphan, signal.SIGCONT)
    out, err = rerun.communicate(timeout=900)
    try:
        res = task_result(out)
    except (ValueError, KeyError, IndexError):
        raise AssertionError("re-run output not understood (rc=%d):\n%s\n%s" % (rerun.returncode, out, err)) from None
    assert rerun.returncode == 0 and res["phase"] == "switched", res
    assert res["changed"] is False, "the re-run did not find the orphan's work done: %s" % res
    assert_carried(s, before)


# ---- refusals: clear message, nothing changed -----------------------------------------


def _snapshot(s):
    mine = [m for m in mountinfo() if m.startswith(str(s.base))]
    return (mine, s.fstab.read_text(), sh("blkid", "-p", "-o", "export", s.device, check=False).stdout)


def _refused(s, tmp_path, words, **args):
    snap = _snapshot(s)
    rc, res = run(playbook(s, tmp_path, **args))
    assert rc != 0 and res.get("failed"), res
    for w in words:
        assert w in res["msg"], res["msg"]
    assert _snapshot(s) == snap
    assert not is_mountpoint(s.staging)
    return res["msg"]


def test_refuses_when_volume_too_small(scratch, tmp_path):
    s = scratch
    small = s.new_loop("small.img", "300M")
    sh("mkfs.xfs", "-q", "-f", small)
    seed(s.src, big_mb=4, small=10)
    # 320 MiB allocated, none of it written: the room check counts allocated bytes
    with open(s.src / "users/u01/data/allocated.bin", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 320 << 20)
    _refused(s, tmp_path, ["not enough room", str(s.src), "add a data disk"], device=small)
    # check mode tells the same truth
    rc, res = run(playbook(s, tmp_path, check=True, device=small))
    assert rc != 0 and "not enough room" in res["msg"]


def test_refuses_src_mounted_from_another_device(scratch, tmp_path):
    s = scratch
    other = s.new_loop("other.img", "300M")
    sh("mkfs.xfs", "-q", "-f", other)
    sh("mount", other, str(s.src))
    _refused(s, tmp_path, ["already a mount point of %s" % other, "unmount it"])


def test_refuses_foreign_content_and_other_filesystems(scratch, tmp_path):
    s = scratch
    seed(s.src, big_mb=4, small=10)
    mnt = s.base / "m"
    mnt.mkdir()
    sh("mount", s.device, str(mnt))
    (mnt / "someone-elses-data").write_text("precious")
    sh("umount", str(mnt))
    _refused(s, tmp_path, ["already holds content", "someone-elses-data", "Refusing"])
    ext4 = s.new_loop("ext4.img", "200M")
    sh("mkfs.ext4", "-q", "-F", ext4)
    _refused(s, tmp_path, ["holds a ext4 filesystem, not xfs"], device=ext4)
    blank = s.new_loop("blank.img", "200M")
    _refused(s, tmp_path, ["holds no filesystem", "community.general.filesystem"], device=blank)


def test_refuses_conflicting_fstab_entry(scratch, tmp_path):
    s = scratch
    seed(s.src, big_mb=4, small=10)
    s.fstab.write_text(s.fstab.read_text() + "LABEL=oldhome %s ext4 defaults 0 2\n" % s.src)
    _refused(s, tmp_path, ["already mounts LABEL=oldhome", "Remove or comment out"])


def test_refuses_writers_below_src(scratch, tmp_path):
    s = scratch
    seed(s.src, big_mb=4, small=10)
    writer = subprocess.Popen(
        [sys.executable, "-c", "import time; f=open(%r,'a'); time.sleep(120)" % str(s.src / "open-log")]
    )
    try:
        time.sleep(0.5)
        _refused(s, tmp_path, ["open for writing", "pid %d" % writer.pid])
    finally:
        writer.kill()
        writer.wait()
