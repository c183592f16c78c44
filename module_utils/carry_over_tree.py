# -*- coding: utf-8 -*-
# Pure logic of the carry_over module: tree scans and manifests, the journal, room
# computation, /proc/self/mountinfo and fstab handling, and the refusal messages.
# Standard library only (this file runs on the managed host with its Python 3.8+).

from __future__ import absolute_import, division, print_function

import errno
import hashlib
import json
import os
import re
import stat
import struct
import time

__metaclass__ = type

JOURNAL_NAME = ".kunlun-carry-over.json"
JOURNAL_FORMAT = 1

# Phases of a carry-over, in order. The journal records the last one reached.
PHASES = ("new", "copying", "copied", "verified", "switching", "switched")

BLOCK = 64 * 1024
_ZERO = bytes(BLOCK)
_SEEK_DATA = getattr(os, "SEEK_DATA", 3)
_SEEK_HOLE = getattr(os, "SEEK_HOLE", 4)
_O_NOATIME = getattr(os, "O_NOATIME", 0)


def display(path):
    """A printable form of a file name (names may hold any byte but / and NUL)."""
    raw = os.fsencode(path)
    text = raw.decode("utf-8", "backslashreplace")
    return text.replace("\n", "\\n").replace("\t", "\\t")


def slug(path):
    """'/var/lib/docker' -> 'var-lib-docker' (for lock and state file names)."""
    s = re.sub(r"[^A-Za-z0-9_.]+", "-", path.strip("/"))
    return s or "root"


def human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0
    return "%d B" % n


# --------------------------------------------------------------------------- content


def content_digest(path, size=None):
    """sha256 over the file's content, independent of how it is laid out on disk.

    The digest covers the file size and every 64 KiB block that is not all zeros,
    prefixed with its offset. Holes (found with SEEK_DATA/SEEK_HOLE) are never read, so a
    sparse 1 TiB file costs what its data costs, and a copy that turned zero runs into
    holes (rsync -S) gets the same digest as its dense source, while any differing byte
    changes it. The file is opened with O_NOATIME so verifying leaves access times alone.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | _O_NOATIME)
    except OSError as e:
        if e.errno != errno.EPERM or not _O_NOATIME:
            raise
        fd = os.open(path, flags)
    h = hashlib.sha256()
    try:
        if size is None:
            size = os.fstat(fd).st_size
        pos = 0
        done = 0  # every block below this offset has been processed
        while pos < size:
            try:
                data = os.lseek(fd, pos, _SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after pos: the rest is a hole
                    break
                if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no SEEK_DATA: dense
                    data = pos
                else:
                    raise
            try:
                hole = os.lseek(fd, data, _SEEK_HOLE)
            except OSError:
                hole = size
            start = max(data - data % BLOCK, done)
            os.lseek(fd, start, os.SEEK_SET)
            off = start
            while off < hole:
                chunk = os.read(fd, BLOCK)
                if not chunk:
                    break
                if chunk != _ZERO[: len(chunk)]:
                    h.update(struct.pack("<Q", off))
                    h.update(chunk)
                off += len(chunk)
            done = off
            pos = max(hole, off)
    finally:
        os.close(fd)
    h.update(struct.pack("<Q", size))
    return h.hexdigest()


# XFS shows its on-disk form of POSIX ACLs to root as these trusted.* names; the ACLs
# themselves are compared as system.posix_acl_access / system.posix_acl_default.
_FS_INTERNAL_XATTRS = frozenset(["trusted.SGI_ACL_FILE", "trusted.SGI_ACL_DEFAULT"])


def _xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
            return ()
        raise
    out = []
    for name in sorted(names):
        if name in _FS_INTERNAL_XATTRS:
            continue
        try:
            value = os.getxattr(path, name, follow_symlinks=False)
        except OSError as e:
            if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
                continue
            raise
        out.append((name, hashlib.sha256(value).hexdigest()[:16]))
    return tuple(out)


def _kind(mode):
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISLNK(mode):
        return "l"
    if stat.S_ISFIFO(mode):
        return "p"
    if stat.S_ISSOCK(mode):
        return "s"
    if stat.S_ISCHR(mode):
        return "c"
    if stat.S_ISBLK(mode):
        return "b"
    return "?"


class TreeScan(object):
    """The entries of a directory tree on ONE filesystem (lstat; symlinks not followed).

    summary only (hash=False): counts, apparent bytes, allocated bytes (hard links counted
    once), submounts. With hash=True also a record per entry for verification.
    """

    def __init__(self, root, exclude_top=(JOURNAL_NAME,), hash_content=False):
        self.root = root
        self.exclude_top = set(exclude_top)
        self.hash_content = hash_content
        self.entries = 0
        self.files = 0
        self.dirs = 0
        self.bytes = 0
        self.allocated = 0
        self.submounts = []
        self.records = {}
        self.hardlinks = {}
        self.excluded_present = []

    def _record(self, rel, full, st):
        kind = _kind(st.st_mode)
        rec = [kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
        if kind == "f":
            rec.append(st.st_size)
            rec.append(st.st_mtime_ns)
            rec.append(content_digest(full, st.st_size) if self.hash_content else None)
        elif kind == "l":
            rec.append(os.readlink(full))
            rec.append(st.st_mtime_ns)
        elif kind == "d":
            rec.append(st.st_mtime_ns)
        elif kind in ("c", "b"):
            rec.append((os.major(st.st_rdev), os.minor(st.st_rdev)))
            rec.append(st.st_mtime_ns)
        else:
            rec.append(st.st_mtime_ns)
        rec.append(_xattrs(full))
        return tuple(rec)

    def scan(self):
        root_st = os.lstat(self.root)
        if not stat.S_ISDIR(root_st.st_mode):
            raise OSError(errno.ENOTDIR, "not a directory", self.root)
        dev = root_st.st_dev
        seen_inodes = set()
        self._account("", self.root, root_st, seen_inodes)
        stack = [""]
        while stack:
            rel = stack.pop()
            path = os.path.join(self.root, rel) if rel else self.root
            with os.scandir(path) as it:
                children = sorted(it, key=lambda e: e.name)
            for entry in children:
                crel = os.path.join(rel, entry.name) if rel else entry.name
                if not rel and entry.name in self.exclude_top:
                    self.excluded_present.append(entry.name)
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and st.st_dev != dev:
                    self.submounts.append(os.path.join(self.root, crel))
                    continue
                self._account(crel, entry.path, st, seen_inodes)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(crel)
        return self

    def _account(self, rel, full, st, seen_inodes):
        self.entries += 1
        if stat.S_ISDIR(st.st_mode):
            self.dirs += 1
        elif stat.S_ISREG(st.st_mode):
            self.files += 1
        key = (st.st_dev, st.st_ino)
        if key not in seen_inodes:
            if stat.S_ISREG(st.st_mode):
                self.bytes += st.st_size
            self.allocated += st.st_blocks * 512
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                seen_inodes.add(key)
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            self.hardlinks.setdefault(st.st_ino, []).append(rel or ".")
        if self.hash_content:
            self.records[rel or "."] = self._record(rel, full, st)

    def link_groups(self):
        """Hard-link groups as a set of frozensets of relative paths (size > 1)."""
        return set(frozenset(v) for v in self.hardlinks.values() if len(v) > 1)

    def summary(self):
        return {
            "entries": self.entries,
            "files": self.files,
            "dirs": self.dirs,
            "bytes": self.bytes,
            "allocated_bytes": self.allocated,
            "hardlink_groups": len(self.link_groups()),
        }

    def manifest_digest(self):
        h = hashlib.sha256()
        for rel in sorted(self.records):
            h.update(os.fsencode(rel) + b"\0" + repr(self.records[rel]).encode("utf-8", "backslashreplace") + b"\n")
        for group in sorted(sorted(os.fsencode(p) for p in g) for g in self.link_groups()):
            h.update(b"L" + b"\0".join(group) + b"\n")
        return h.hexdigest()


_FIELDS = {
    "f": ("type", "mode", "uid", "gid", "size", "mtime_ns", "sha256", "xattrs"),
    "l": ("type", "mode", "uid", "gid", "target", "mtime_ns", "xattrs"),
    "d": ("type", "mode", "uid", "gid", "mtime_ns", "xattrs"),
    "c": ("type", "mode", "uid", "gid", "rdev", "mtime_ns", "xattrs"),
    "b": ("type", "mode", "uid", "gid", "rdev", "mtime_ns", "xattrs"),
}
_DEFAULT_FIELDS = ("type", "mode", "uid", "gid", "mtime_ns", "xattrs")


def compare_scans(src, dst, limit=20):
    """Differences between two hashed scans, as readable strings (empty list: identical).

    Compared per entry: type, permission bits, owner, group, size, mtime (ns), sha256 of
    content, symlink target, device numbers, extended attributes (ACLs included); then
    the hard-link groups.
    """
    diffs = []
    count = 0
    for rel in sorted(set(src.records) | set(dst.records)):
        a = src.records.get(rel)
        b = dst.records.get(rel)
        if a == b:
            continue
        count += 1
        if len(diffs) >= limit:
            continue
        if b is None:
            diffs.append("%s: missing in the copy" % display(rel))
        elif a is None:
            diffs.append("%s: present in the copy only" % display(rel))
        elif a[0] != b[0]:
            diffs.append("%s: type %s in the source, %s in the copy" % (display(rel), a[0], b[0]))
        else:
            names = _FIELDS.get(a[0], _DEFAULT_FIELDS)
            what = [n for n, x, y in zip(names, a, b) if x != y]
            diffs.append("%s: %s differ" % (display(rel), ", ".join(what)))
    ga, gb = src.link_groups(), dst.link_groups()
    for g in sorted(ga - gb, key=sorted):
        count += 1
        if len(diffs) < limit:
            diffs.append("hard-link group not preserved: %s" % ", ".join(display(p) for p in sorted(g)))
    for g in sorted(gb - ga, key=sorted):
        count += 1
        if len(diffs) < limit:
            diffs.append("hard-link group only in the copy: %s" % ", ".join(display(p) for p in sorted(g)))
    if count > len(diffs):
        diffs.append("... and %d more differences" % (count - len(diffs)))
    return diffs


def mismatched_paths(src, dst):
    """Relative paths whose copy must be redone (entries differing or mis-linked)."""
    out = set()
    for rel in set(src.records) | set(dst.records):
        if rel != "." and src.records.get(rel) != dst.records.get(rel):
            out.add(rel)
    for g in src.link_groups() ^ dst.link_groups():
        out.update(g)
    out.discard(".")
    return sorted(out)


# --------------------------------------------------------------------------- room


def room_problem(needed_bytes, available_bytes, margin_percent, what, where, fix):
    """None when the content fits, else the refusal message."""
    want = int(needed_bytes * (100 + margin_percent) / 100.0)
    if want <= available_bytes:
        return None
    return "not enough room: %s needs %s (%s + %d%% margin) but %s has %s available; %s" % (
        what,
        human(want),
        human(needed_bytes),
        margin_percent,
        where,
        human(available_bytes),
        fix,
    )


# --------------------------------------------------------------------------- journal


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_journal(path):
    """The journal dict, or None if there is none. Raises ValueError on a broken one."""
    try:
        with open(path, "r") as f:
            text = f.read()
    except IOError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError("journal %s is not valid JSON (%s)" % (path, e)) from e
    if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT or data.get("phase") not in PHASES:
        raise ValueError("journal %s is not a carry-over journal of format %d" % (path, JOURNAL_FORMAT))
    return data


def new_journal(src, target, device=None, uuid=None):
    return {
        "format": JOURNAL_FORMAT,
        "src": src,
        "target": target,
        "device": device,
        "uuid": uuid,
        "phase": "new",
        "started": now(),
        "updated": now(),
        "runs": 0,
        "history": [],
        "note": (
            "Written by the kunlun-fleet carry_over module. The source directory is "
            "never deleted: after the switch its old content stays on the old "
            "filesystem, underneath the mount point."
        ),
    }


def set_phase(journal, phase, **extra):
    if phase not in PHASES:
        raise ValueError("unknown phase %s" % phase)
    journal["phase"] = phase
    journal["updated"] = now()
    journal.setdefault("history", []).append({"phase": phase, "at": journal["updated"]})
    del journal["history"][:-50]
    journal.update(extra)
    return journal


def write_journal(path, journal, keep_dir_times=True):
    """Write atomically (temp + fsync + rename), keeping the directory's times unchanged
    so the copied root directory keeps the source's mtime."""
    d = os.path.dirname(path)
    dst = os.stat(d) if keep_dir_times else None
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps(journal, indent=2, sort_keys=True) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    if dst is not None:
        os.utime(d, ns=(dst.st_atime_ns, dst.st_mtime_ns))


# --------------------------------------------------------------------------- mounts


def _unescape(s):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(text):
    """/proc/self/mountinfo -> list of dicts (mount_point, major, minor, root, fstype, source, options)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, _sep, right = line.partition(" - ")
        f = left.split()
        r = right.split()
        if len(f) < 6 or len(r) < 2:
            continue
        major, _sep, minor = f[2].partition(":")
        out.append(
            {
                "mount_point": _unescape(f[4]),
                "major": int(major),
                "minor": int(minor),
                "root": _unescape(f[3]),
                "options": f[5],
                "fstype": r[0],
                "source": _unescape(r[1]),
            }
        )
    return out


def mount_at(mounts, path):
    """The topmost mount whose mount point is exactly path, or None."""
    found = None
    for m in mounts:
        if m["mount_point"] == path:
            found = m
    return found


def mounts_of(mounts, major, minor):
    return [m for m in mounts if (m["major"], m["minor"]) == (major, minor)]


def mounts_below(mounts, path):
    prefix = path.rstrip("/") + "/"
    return sorted(set(m["mount_point"] for m in mounts if m["mount_point"].startswith(prefix)))


# --------------------------------------------------------------------------- fstab


def _escape_fstab(path):
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def fstab_line(uuid, path, fstype, opts):
    return "UUID=%s %s %s %s 0 0" % (uuid, _escape_fstab(path), fstype, opts)


def fstab_plan(text, path, uuid, fstype, opts, device_aliases=()):
    """Plan the fstab entry mounting UUID=uuid at path.

    Returns (new_text, problem). new_text == text when nothing is to change. problem is a
    refusal message when fstab already mounts something else at path.
    """
    want = fstab_line(uuid, path, fstype, opts)
    ours = set(["UUID=%s" % uuid, "/dev/disk/by-uuid/%s" % uuid]) | set(device_aliases)
    lines = text.splitlines()
    hits = []
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        f = s.split()
        if len(f) >= 2 and _unescape(f[1]) == path:
            hits.append((i, f))
    if not hits:
        body = text if (not text or text.endswith("\n")) else text + "\n"
        return body + want + "\n", None
    for i, f in hits:
        spec = f[0]
        if spec.startswith('UUID="') and spec.endswith('"'):
            spec = "UUID=" + spec[6:-1]
        if spec not in ours:
            return text, (
                "/etc/fstab already mounts %s at %s (line %d: %r); it is not the "
                "new volume (UUID=%s). Remove or comment out that line if the new "
                "volume is to replace it, or carry the content of %s yourself."
                % (f[0], path, i + 1, lines[i].strip(), uuid, path)
            )
    i, f = hits[-1]
    cur = (f + ["0", "0"])[:6]
    if cur[0].replace('"', "") == "UUID=%s" % uuid and cur[2] == fstype and cur[3] == opts:
        return text, None
    lines[i] = want
    return "\n".join(lines) + "\n", None


# --------------------------------------------------------------------------- processes


def writers_below(path, proc="/proc", skip_pids=()):
    """Processes holding a file below path open for writing: [(pid, comm, file)]."""
    prefix = path.rstrip("/") + "/"
    out = []
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if int(pid) in skip_pids:
            continue
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if not target.startswith(prefix):
                continue
            try:
                with open(os.path.join(proc, pid, "fdinfo", fd)) as f:
                    info = f.read()
                flags = int(re.search(r"^flags:\s*([0-7]+)", info, re.M).group(1), 8)
            except (OSError, IOError, AttributeError, ValueError):
                continue
            if flags & 3:
                try:
                    with open(os.path.join(proc, pid, "comm")) as f:
                        comm = f.read().strip()
                except (OSError, IOError):
                    comm = "?"
                out.append((int(pid), comm, target))
                break
    return out


def ancestors(pid=None, proc="/proc"):
    """This process and its ancestors (the connection that runs us)."""
    pid = pid or os.getpid()
    out = set()
    while pid and pid not in out:
        out.add(pid)
        try:
            with open(os.path.join(proc, str(pid), "stat")) as f:
                data = f.read()
            pid = int(data.rsplit(")", 1)[1].split()[1])
        except (OSError, IOError, ValueError, IndexError):
            break
    return out


def rsync_pids_for(target, proc="/proc"):
    """rsync processes writing into target (left over from an interrupted run)."""
    want = os.fsencode(target.rstrip("/") + "/")
    out = []
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, IOError):
            continue
        if argv and os.path.basename(argv[0]) == b"rsync" and want in argv:
            out.append(int(pid))
    return out


def parse_rsync_stats(text):
    """The counters of rsync --stats that tell whether anything was done."""
    out = {}
    for key, pat in (
        ("created", r"Number of created files:\s*([\d,]+)"),
        ("deleted", r"Number of deleted files:\s*([\d,]+)"),
        ("transferred", r"Number of regular files transferred:\s*([\d,]+)"),
        ("files", r"Number of files:\s*([\d,]+)"),
        ("transferred_bytes", r"Total transferred file size:\s*([\d,]+)"),
    ):
        m = re.search(pat, text)
        out[key] = int(m.group(1).replace(",", "")) if m else None
    return out
