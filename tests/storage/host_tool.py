#!/usr/bin/python3
"""Test tool run ON a sim host (uploaded over SSH by the storage suites; standard library only).

  host_tool.py list ROOT [--skip REL ...]       checksum list of a tree, one JSON line per entry
  host_tool.py seed-home                        more /home content beside the kit's seed
  host_tool.py watch --point P --state F --lock F --src D --target D [--daemon-json F]

`list` records per entry: type, mode, owner, group, size, mtime (ns), sha256 of the content
(holes read as zeros), symlink target, device numbers, every extended attribute (ACLs
as system.posix_acl_*; XFS's internal trusted.SGI_ACL_* names are left out), the link
count and hard-link group inside the tree, and for files of 1 MiB and more whether they
are sparse (allocated < half the size).

`watch` waits for one fault point of a carry-over, recognised from observable state only
(the journal phase in the module's state file, written after each phase; rsync processes;
open files of the module; fstab; the mount table), freezes the module there (SIGSTOP, or
for a window a few system calls wide a ptrace stop at the first system call in it) and
then either SIGKILLs it (victim "module"; "module-tree" also kills its children) or prints
HIT and waits for "go" on stdin before letting it run on (victim "controller": the test
kills ansible-playbook on the controller meanwhile). A state file is "fresh" once it was
rewritten after the watcher started, so a phase left by an earlier killed run never counts.
It polls every 0.5 ms while the module holds its lock, every 10 ms until then (watch()).
"""

import argparse
import ctypes
import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

SKIP_XATTRS = ("trusted.SGI_ACL_FILE", "trusted.SGI_ACL_DEFAULT")


# ---------------------------------------------------------------- list
def digest(path):
    """sha256 of the logical content; holes (SEEK_DATA/SEEK_HOLE) are zeros and not read,
    and all-zero blocks count as zeros however they are stored."""
    h = hashlib.sha256()
    block = 1 << 16
    zero = bytes(block)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            off = data - data % block
            os.lseek(fd, off, os.SEEK_SET)
            while off < hole:
                chunk = os.read(fd, block)
                if not chunk:
                    break
                if chunk != zero[: len(chunk)]:
                    h.update(b"%d:" % off + chunk)
                off += len(chunk)
            pos = max(off, hole)
    finally:
        os.close(fd)
    h.update(b"size:%d" % size)
    return h.hexdigest()


def xattrs(path):
    out = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return out
    for name in sorted(names):
        if name in SKIP_XATTRS:
            continue
        try:
            out[name] = hashlib.sha256(os.getxattr(path, name, follow_symlinks=False)).hexdigest()[:16]
        except OSError:
            continue
    return out


def tree_list(root, skip):
    root = os.fsencode(root)
    skip = set(os.fsencode(s) for s in skip)
    dev = os.lstat(root).st_dev
    entries, groups = [], {}
    stack = [b""]
    while stack:
        rel = stack.pop()
        full = os.path.join(root, rel) if rel else root
        for name in sorted(os.listdir(full)):
            crel = os.path.join(rel, name) if rel else name
            if crel in skip:
                continue
            path = os.path.join(root, crel)
            st = os.lstat(path)
            rec = {
                "path": crel.decode("utf-8", "backslashreplace"),
                "mode": "%o" % st.st_mode,
                "uid": st.st_uid,
                "gid": st.st_gid,
                "mtime_ns": st.st_mtime_ns,
                "xattrs": xattrs(path),
            }
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != dev:
                    rec["mount"] = True
                else:
                    stack.append(crel)
            elif stat.S_ISREG(st.st_mode):
                rec.update(size=st.st_size, sha256=digest(path), nlink=st.st_nlink)
                if st.st_size >= 1 << 20:
                    rec["sparse"] = st.st_blocks * 512 < st.st_size // 2
                if st.st_nlink > 1:
                    groups.setdefault(st.st_ino, []).append(rec["path"])
                    rec["ino"] = st.st_ino
            elif stat.S_ISLNK(st.st_mode):
                rec["target"] = os.readlink(path).decode("utf-8", "backslashreplace")
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                rec["rdev"] = [os.major(st.st_rdev), os.minor(st.st_rdev)]
            entries.append(rec)
    for rec in entries:
        ino = rec.pop("ino", None)
        if ino is not None:
            rec["links"] = sorted(groups[ino])
    entries.sort(key=lambda r: r["path"])
    for rec in entries:
        print(json.dumps(rec, sort_keys=True))


# ---------------------------------------------------------------- seed
def seed_home():
    """Beside the kit's seed (alice, bob): many small files, a dense file, large sparse
    files, a 3-link hard-link group, a FIFO, setuid/sticky modes, names that are not UTF-8,
    old and ns-precision mtimes, a default ACL, a user xattr on a directory, an owner with
    no passwd entry, dangling and absolute symlinks."""
    import random

    rng = random.Random(4)
    base = b"/home/carol"
    if subprocess.run(["id", "carol"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "carol"], check=True)
    for d in range(30):
        sub = os.path.join(base, b"many", b"d%02d" % d)
        os.makedirs(sub, exist_ok=True)
        for f in range(100):
            with open(os.path.join(sub, b"f%03d" % f), "wb") as fh:
                fh.write(rng.randbytes(rng.randint(0, 4096)))
    with open(os.path.join(base, b"dense.bin"), "wb") as fh:
        for _ in range(96):
            fh.write(rng.randbytes(1 << 20))
    # Sparse files of 256 and 64 MiB, not GiB: rsync reads a hole as zeros and pipes them
    # (14 CPU-s for 4 GiB), at each full copy; the layout is what matters (data at the
    # start, an unaligned offset and the last block; a hole at the end).
    with open(os.path.join(base, b"vm-disk.img"), "wb") as fh:
        fh.truncate(256 << 20)
        for off in (0, 64 << 20, (192 << 20) + 123, (256 << 20) - 4096):
            fh.seek(off)
            fh.write(rng.randbytes(4096))
    with open(os.path.join(base, b"hole-at-end.img"), "wb") as fh:
        fh.write(b"head\n" * 1000)
        fh.truncate(64 << 20)
    h1 = os.path.join(base, b"hl-one")
    with open(h1, "wb") as fh:
        fh.write(b"three names, one inode\n")
    for other in (os.path.join(base, b"many", b"d00", b"hl-two"), os.path.join(base, b"hl three")):
        if not os.path.exists(other):
            os.link(h1, other)
    fifo = os.path.join(base, b"a-fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo, 0o640)
    tool = os.path.join(base, b"setuid-tool")
    with open(tool, "wb") as fh:
        fh.write(b"#!/bin/sh\necho tool\n")
    sticky = os.path.join(base, b"sticky-dir")
    os.makedirs(sticky, exist_ok=True)
    for name in (b"bad-\xff\xfe-latin1-\xe9", b"back\\slash", b"glob*?[x]", b"x" * 255):
        with open(os.path.join(base, name), "wb") as fh:
            fh.write(name)
    old = os.path.join(base, b"from-1980.txt")
    with open(old, "wb") as fh:
        fh.write(b"old\n")
    nsec = os.path.join(base, b"ns-mtime.txt")
    with open(nsec, "wb") as fh:
        fh.write(b"ns\n")
    acl_dir = os.path.join(base, b"team")
    os.makedirs(acl_dir, exist_ok=True)
    orphan = os.path.join(base, b"orphan-owner.dat")
    with open(orphan, "wb") as fh:
        fh.write(b"uid 4242 has no passwd entry\n")
    for link, target in ((b"dangling", b"/nonexistent/target"), (b"abs-link", b"/etc/hostname")):
        if not os.path.lexists(os.path.join(base, link)):
            os.symlink(target, os.path.join(base, link))
    subprocess.run(["chown", "-R", "carol:carol", base], check=True)
    os.chown(orphan, 4242, 4242)
    os.chmod(tool, 0o4755)
    os.chmod(sticky, 0o1777)
    subprocess.run(["setfacl", "-d", "-m", "u:alice:rwx", acl_dir], check=True)
    subprocess.run(["setfacl", "-m", "u:bob:rx", acl_dir], check=True)
    subprocess.run(["setfattr", "-n", "user.kunlun.dir", "-v", "on a directory", acl_dir], check=True)
    os.utime(old, (315532800, 315532800))
    os.utime(nsec, ns=(1700000000123456789, 1700000000987654321))
    print("seeded", base.decode())


# ---------------------------------------------------------------- watch
def read_phase(path):
    try:
        with open(path) as fh:
            return json.load(fh).get("phase")
    except (OSError, ValueError):
        return None


def identity(path):
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_mtime_ns)
    except OSError:
        return None


def module_pid(lock):
    """The carry_over module holds the lock and wrote its pid there."""
    try:
        with open(lock) as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return None
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == lock:
                return pid
    except OSError:
        pass
    return None


def procs():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read().split(b"\0")
            with open("/proc/%s/stat" % pid) as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(pid)] = (ppid, argv)
    return out


def rsync_pids(target):
    want = os.fsencode(target.rstrip("/") + "/")
    return [p for p, (_, argv) in procs().items() if argv and os.path.basename(argv[0]) == b"rsync" and want in argv]


def written_by(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/io" % pid) as fh:
                for line in fh:
                    if line.startswith("wchar:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def descendants(pid):
    table = procs()
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        kids = [p for p, (pp, _) in table.items() if pp == cur]
        out += kids
        todo += kids
    return out


def hashing_fd(pid, roots):
    """A regular file below one of roots that the module holds open (verification)."""
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if ".kunlun-carry-over" in target:
            continue
        if any(target.startswith(r.rstrip("/") + "/") for r in roots):
            try:
                if stat.S_ISREG(os.stat("/proc/%d/fd/%s" % (pid, fd)).st_mode):
                    return target
            except OSError:
                continue
    return None


def mounted(path):
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == path for line in fh)


def fstab_has(path):
    try:
        with open("/etc/fstab") as fh:
            return any(line.split()[1:2] == [path] for line in fh if line.strip() and not line.startswith("#"))
    except OSError:
        return False


def daemon_root(path):
    try:
        with open(path) as fh:
            return json.load(fh).get("data-root")
    except (OSError, ValueError):
        return None


def observe(a, pid=None):
    seen = {
        "phase": read_phase(a.state),
        "src_mounted": mounted(a.src),
        "fstab_has_src": fstab_has(a.src),
        "rsync_running": len(rsync_pids(a.target)),
    }
    if a.daemon_json:
        seen["daemon_data_root"] = daemon_root(a.daemon_json)
    if pid:
        seen["module_pid"] = pid
    return seen


PTRACE_SYSCALL = 24
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_O_TRACESYSGOOD = 1
WALL = 0x40000000  # __WALL: wait for a tracee that is not our child


def trace_until(pid, condition):
    """Stop pid at each of its system calls (ptrace) until condition() holds there.

    For a point whose window is a few system calls wide (the journal says 'verified', the
    next step has not started): polling from outside can miss it on a loaded machine, a
    syscall stop cannot, since every write the module makes is a system call. Returns
    True with pid held in a ptrace stop (it may then be killed), False if pid ended first.
    The sim host's capabilities (all but CAP_SYS_RESOURCE) allow the attach.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long

    def ptrace(req, data=0):
        if libc.ptrace(req, pid, None, ctypes.c_void_p(data)) == -1:
            raise OSError(ctypes.get_errno(), "ptrace %#x on %d" % (req, pid))

    try:
        ptrace(PTRACE_SEIZE, PTRACE_O_TRACESYSGOOD)
        ptrace(PTRACE_INTERRUPT)
    except OSError as e:
        if e.errno == errno.ESRCH:  # the module ended meanwhile
            return False
        raise
    inject = 0
    while True:
        try:
            _, status = os.waitpid(pid, WALL)
        except ChildProcessError:
            return False
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return False
        sig = os.WSTOPSIG(status)
        # a syscall stop, or the interrupt's event stop: nothing to pass on; any other
        # stop is a signal for the module (SIGCHLD of its commands), delivered on resume
        inject = 0 if sig in (signal.SIGTRAP | 0x80, signal.SIGTRAP) else sig
        if condition():
            return True
        try:
            ptrace(PTRACE_SYSCALL, inject)
        except OSError:
            return False


def watch(a):
    start_id = identity(a.state)
    parent = os.getppid()
    print("READY", flush=True)
    deadline = time.time() + a.timeout
    while time.time() < deadline:
        if os.getppid() != parent:  # the test's SSH session is gone: so are we
            return 4
        fresh = identity(a.state) not in (None, start_id)
        phase = read_phase(a.state) if fresh else None
        pid = module_pid(a.lock)
        hit = False
        if a.point == "during-copy":
            if phase == "copying" and pid:
                rs = rsync_pids(a.target)
                hit = bool(rs) and written_by(rs) >= a.min_written
        elif a.point == "after-copy":
            hit = phase == "copied" and pid is not None
        elif a.point == "during-verify":
            hit = phase == "copied" and pid is not None and hashing_fd(pid, [a.src, a.target]) is not None
        elif a.point == "after-verify" and pid is not None:

            def verified():
                return identity(a.state) not in (None, start_id) and read_phase(a.state) == "verified"

            hit = trace_until(pid, verified)
        elif a.point == "switch-fstab":
            hit = phase == "switching" and pid is not None
        elif a.point == "switch-mounted":
            # switching -> mounted; or, when an earlier kill left the volume mounted, the
            # re-run's finalize (journal 'switched', module not yet returned)
            hit = phase in ("switching", "switched") and pid is not None
        elif a.point == "config-written":
            hit = daemon_root(a.daemon_json) == a.target
        if not hit:
            # Every 0.5 ms while the carry-over module runs (it holds the lock; its windows
            # may be a few system calls wide). Before it starts (ansible's start and the
            # tasks before it: most of a run) every 10 ms: a spin there burned the host's
            # CPU for nothing, and no point can be missed, since each run of the module
            # takes the lock first, then scans, copies and verifies before any of them.
            # daemon.json is written by a task, not the module: always the fast poll.
            time.sleep(0.0005 if pid is not None or a.point == "config-written" else 0.01)
            continue
        if pid:
            os.kill(pid, signal.SIGSTOP)
        seen = observe(a, pid)
        if pid and a.point == "after-copy":
            seen["verify_started"] = hashing_fd(pid, [a.src, a.target]) is not None
        if pid and a.point == "during-verify":
            seen["hashing"] = hashing_fd(pid, [a.src, a.target])
        if pid and a.point in ("switch-fstab", "switch-mounted"):
            # Single-step the frozen module until the switch reaches the wanted state.
            want = (lambda: fstab_has(a.src)) if a.point == "switch-fstab" else (lambda: mounted(a.src))
            steps = 0
            while not want() and read_phase(a.state) == "switching" and steps < 200000:
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.0002)
                os.kill(pid, signal.SIGSTOP)
                steps += 1
            if a.point == "switch-fstab":
                # freeze a mount the module may just have started, before it mounts
                for child in descendants(pid):
                    try:
                        os.kill(child, signal.SIGSTOP)
                    except OSError:
                        pass
            else:
                time.sleep(0.05)  # let the mount child the module started exit
            seen = observe(a, pid)
            seen["steps"] = steps
        if a.victim in ("module", "module-tree") and pid:
            victims = [pid] + (descendants(pid) if a.victim == "module-tree" else [])
            for v in victims:
                try:
                    os.kill(v, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
            seen["killed"] = victims
            seen["after_kill"] = observe(a)
            print("HIT " + json.dumps(seen, sort_keys=True), flush=True)
            return 0
        # victim controller: the test kills ansible-playbook, then says go
        print("HIT " + json.dumps(seen, sort_keys=True), flush=True)
        sys.stdin.readline()
        if pid:
            os.kill(pid, signal.SIGCONT)
        print("RESUMED", flush=True)
        return 0
    print("TIMEOUT " + json.dumps(observe(a)), flush=True)
    return 3


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("list")
    pl.add_argument("root")
    pl.add_argument("--skip", action="append", default=[])
    sub.add_parser("seed-home")
    pw = sub.add_parser("watch")
    pw.add_argument("--point", required=True)
    pw.add_argument("--victim", default="module", choices=["module", "module-tree", "controller"])
    pw.add_argument("--state", required=True)
    pw.add_argument("--lock", required=True)
    pw.add_argument("--src", required=True)
    pw.add_argument("--target", required=True)
    pw.add_argument("--daemon-json")
    pw.add_argument("--min-written", type=int, default=8 << 20, help="during-copy: bytes rsync has written")
    pw.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    if a.cmd == "list":
        tree_list(a.root, a.skip)
    elif a.cmd == "seed-home":
        seed_home()
    else:
        return watch(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
