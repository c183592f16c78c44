#!/usr/bin/python3
"""Sim kit: LV activation without device-mapper.

This kernel has no device-mapper, so LVM runs with ``global/activation = 0`` and only
writes metadata. This program stands in for the LVM commands that create, resize,
activate or report LVs (it is installed as /usr/local/sbin/lvcreate, lvs, ... which come
first on PATH): it runs the real /usr/sbin/lvm command and then makes every active
linear LV a loop device over its PV range:

    /dev/loopN      offset = pe_start + first_pe * extent_size, sizelimit = size
    /dev/VG/LV      -> ../loopN
    /dev/mapper/VG-LV -> ../loopN

A loop the kit attached carries the tag ``kunlun-kit:<disk token>:<lv uuid>`` in its
lo_file_name, so it is found again after a container restart (loop devices are global and
outlive the container) and cleaned up from the machine by sim-down. Reports (lvs, vgs,
lvdisplay) show such an LV as active, as LVM would with device-mapper.

``kunlun-kit-lvm boot`` (the kunlun-kit-lvm.service unit) re-attaches the loops of every
LV at boot, before local-fs.target, and makes the /dev/disk/by-uuid and by-label links
udev makes on a real host. An LV of a volume group that misses a physical volume is not
activated, as LVM's autoactivation leaves it at boot (its linear extents on the missing
disk cannot be mapped).

The fstab entries are mounted by systemd itself, through the units this program writes as
the systemd generator ``kunlun-kit-fstab-generator``: systemd-fstab-generator ignores fstab
device entries in a container whose /sys is read-only, and writes, on a real host, a mount
unit for each that waits for its device unit (``x-systemd.device-timeout=``, 90 s by
default) and that local-fs.target requires, or only wants with ``nofail``
(systemd.mount(5)). Here ``kunlun-kit-device@.service`` (``kunlun-kit-lvm wait-device
PATH``) stands in for the device unit udev would bring up.

``kunlun-kit-disk detach|attach|status`` takes the host's data disk away from the next
boot on, or gives it back: a disk that failed or was pulled while the host was down.
"""

import errno
import fcntl
import os
import re
import stat
import struct
import subprocess
import sys
import time

LVM = "/usr/sbin/lvm"
TAG = "kunlun-kit:"
HOST_CONF = "/etc/kunlun-kit/host.conf"
# kunlun-kit-disk detach writes "detached" here: the data disks are gone from the next boot on.
DISK_SWITCH = "/etc/kunlun-kit/data-disk"
# The host's data disks (the LVM filter accepts these only): docker passes them in at every start.
DATA_DISK_RE = re.compile(r"^vd[a-z]+$")
# How long systemd waits for a device when fstab does not say (x-systemd.device-timeout=):
# DefaultTimeoutStartSec, 90 s (systemd-system.conf(5)).
DEFAULT_DEVICE_TIMEOUT = "90s"
LOCK = "/run/lock/kunlun-kit-lvm.lock"
# Probe nodes live under /dev: /run is a nodev tmpfs in the container.
NODE_DIR = "/dev/.kunlun-kit"

LOOP_SET_STATUS64 = 0x4C04
LOOP_GET_STATUS64 = 0x4C05
LOOP_CONFIGURE = 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CLR_FD = 0x4C01
INFO64 = struct.Struct("<QQQQQIIII64s64s32sQQ")
LOOP_MAJOR = 7
UUID_RE = re.compile(r"^[0-9A-Za-z]{6}(-[0-9A-Za-z]{4}){5}-[0-9A-Za-z]{6}$")


class KitError(Exception):
    pass


def err(msg):
    sys.stderr.write("  %s\n" % msg)


# ---------------------------------------------------------------- identity, locking
def disk_token():
    try:
        with open(HOST_CONF) as fh:
            for line in fh:
                key, _, value = line.strip().partition("=")
                if key == "disk_token" and value:
                    return value
    except OSError:
        pass
    return os.uname().nodename


def tag_for(lv_uuid):
    return "%s%s:%s" % (TAG, disk_token(), lv_uuid.replace("-", ""))


class Lock(object):
    def __enter__(self):
        os.makedirs(os.path.dirname(LOCK), exist_ok=True)
        self.fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# ---------------------------------------------------------------- loop devices
def _mknod(path, kind, major, minor, mode=0o660):
    dev = os.makedev(major, minor)
    try:
        st = os.lstat(path)
        if (stat.S_ISBLK(st.st_mode) if kind == "b" else stat.S_ISCHR(st.st_mode)) and st.st_rdev == dev:
            return path
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, mode | (stat.S_IFBLK if kind == "b" else stat.S_IFCHR), dev)
    return path


def _loop_devno(name):
    with open("/sys/block/%s/dev" % name) as fh:
        major, minor = fh.read().strip().split(":")
    return int(major), int(minor)


def loop_node(name):
    """/dev/loopN in this container (no udev: the kit makes the node)."""
    major, minor = _loop_devno(name)
    return _mknod("/dev/" + name, "b", major, minor)


def _probe_node(name):
    major, minor = _loop_devno(name)
    return _mknod(os.path.join(NODE_DIR, name), "b", major, minor, 0o600)


def get_status(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(INFO64.size)
        fcntl.ioctl(fd, LOOP_GET_STATUS64, buf, True)
        return list(INFO64.unpack(bytes(buf)))
    finally:
        os.close(fd)


def kit_loops():
    """{tag: loopN} for every loop on the machine that carries a kit tag of this host."""
    prefix = "%s%s:" % (TAG, disk_token())
    found = {}
    for entry in os.listdir("/sys/block"):
        if not entry.startswith("loop") or not os.path.isdir("/sys/block/%s/loop" % entry):
            continue
        try:
            info = get_status(_probe_node(entry))
        except OSError:
            continue
        name = info[9].split(b"\0", 1)[0].decode("utf-8", "replace")
        if name.startswith(prefix):
            found[name] = entry
    return found


def loop_geometry(name):
    info = get_status(loop_node(name))
    return info[3], info[4]  # offset, sizelimit


def attach(backing, offset, size, tag):
    """Attach a new loop over backing[offset:offset+size] tagged ``tag``; return loopN."""
    ctl = _mknod("/dev/loop-control", "c", 10, 237, 0o600)
    backing_fd = os.open(backing, os.O_RDWR)
    try:
        for _attempt in range(50):
            cfd = os.open(ctl, os.O_RDWR)
            try:
                number = fcntl.ioctl(cfd, LOOP_CTL_GET_FREE)
            finally:
                os.close(cfd)
            name = "loop%d" % number
            for _wait in range(50):
                if os.path.exists("/sys/block/%s/dev" % name):
                    break
                time.sleep(0.02)
            node = loop_node(name)
            info = INFO64.pack(0, 0, 0, offset, size, 0, 0, 0, 0, tag.encode()[:63], b"", b"", 0, 0)
            config = struct.pack("<II", backing_fd, 0) + info + b"\0" * 64
            lfd = os.open(node, os.O_RDWR)
            try:
                fcntl.ioctl(lfd, LOOP_CONFIGURE, config)
                return name
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
            finally:
                os.close(lfd)
            time.sleep(0.05)
    finally:
        os.close(backing_fd)
    raise KitError("no free loop device could be attached for %s" % tag)


def set_geometry(name, offset, size):
    """Change the live loop's offset/size limit (LOOP_SET_STATUS64); the kernel resizes
    the block device, so xfs_growfs works on the mounted filesystem."""
    node = loop_node(name)
    for _attempt in range(40):
        info = get_status(node)
        if info[3] == offset and info[4] == size:
            return
        info[3], info[4] = offset, size
        fd = os.open(node, os.O_RDWR)
        try:
            os.fsync(fd)
            fcntl.ioctl(fd, LOOP_SET_STATUS64, INFO64.pack(*info))
            return
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
        finally:
            os.close(fd)
        time.sleep(0.1)
    raise KitError("loop %s stayed busy while resizing" % name)


def detach(name):
    fd = os.open(loop_node(name), os.O_RDONLY)
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    finally:
        os.close(fd)


def mounted_devnos():
    devs = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            devs.setdefault(fields[2], []).append(fields[4])
    return devs


def in_use(name):
    """True when something holds the LV's device (a filesystem mounted in any mount
    namespace holds it exclusively), as LVM's open count would show."""
    try:
        fd = os.open(loop_node(name), os.O_RDONLY | os.O_EXCL)
    except OSError as exc:
        return exc.errno == errno.EBUSY
    os.close(fd)
    return False


def mounts_of(name):
    major, minor = _loop_devno(name)
    return mounted_devnos().get("%d:%d" % (major, minor), [])


# ---------------------------------------------------------------- LVM metadata
def lvm(*args, check=True):
    proc = subprocess.run([LVM] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if check and proc.returncode != 0:
        raise KitError("lvm %s failed: %s" % (" ".join(args), quiet_stderr(proc.stderr).strip()))
    return proc.stdout


def lv_table():
    """{lv_uuid: {vg, lv, attr, offset, size, pv}} of every LV LVM knows here."""
    pvs = {}
    for line in lvm(
        "pvs", "--noheadings", "--units", "b", "--nosuffix", "--separator", "|", "-o", "pv_name,pe_start"
    ).splitlines():
        if line.strip():
            name, pe_start = line.strip().split("|")
            pvs[name] = int(pe_start)
    lvs = {}
    for line in lvm(
        "lvs",
        "-a",
        "--segments",
        "--noheadings",
        "--units",
        "b",
        "--nosuffix",
        "--separator",
        "|",
        "-o",
        "vg_name,lv_name,lv_uuid,lv_attr,vg_extent_size,seg_start_pe,seg_size_pe,segtype,devices",
    ).splitlines():
        if not line.strip():
            continue
        vg, lv, uuid, attr, ext, seg_start, seg_size, segtype, devices = line.strip().split("|")
        entry = lvs.setdefault(
            uuid, {"vg": vg, "lv": lv, "uuid": uuid, "attr": attr, "ext": int(ext), "segs": [], "error": None}
        )
        match = re.match(r"^(.*)\((\d+)\)$", devices)
        if segtype not in ("linear", "striped") or not match or "," in devices:
            entry["error"] = "segment type %s on %s" % (segtype, devices or "no device")
            continue
        entry["segs"].append((int(seg_start), int(seg_size), match.group(1), int(match.group(2))))
    for entry in lvs.values():
        segs = sorted(entry["segs"])
        entry["offset"] = entry["size"] = None
        entry["pv"] = None
        if entry["error"] or not segs:
            entry["error"] = entry["error"] or "no segments"
            continue
        pv = segs[0][2]
        for prev, cur in zip(segs, segs[1:], strict=False):
            if cur[2] != pv or cur[3] != prev[3] + prev[1]:
                entry["error"] = "extents not contiguous on one PV"
        if pv not in pvs:
            entry["error"] = "PV %s not visible" % pv
        if entry["error"]:
            continue
        entry["pv"] = pv
        entry["offset"] = pvs[pv] + segs[0][3] * entry["ext"]
        entry["size"] = sum(s[1] for s in segs) * entry["ext"]
    return lvs


def mapper_name(vg, lv):
    return "%s-%s" % (vg.replace("-", "--"), lv.replace("-", "--"))


def _link(path, target):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        if os.readlink(path) == target:
            return
    except OSError:
        pass
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


def make_links(entry, name):
    _link("/dev/%s/%s" % (entry["vg"], entry["lv"]), "../%s" % name)
    _link("/dev/mapper/%s" % mapper_name(entry["vg"], entry["lv"]), "../%s" % name)


def remove_stale_links(active):
    """Remove /dev/VG/LV and /dev/mapper links that no longer name an active LV."""
    wanted = set()
    for entry, _name in active:
        wanted.add("/dev/%s/%s" % (entry["vg"], entry["lv"]))
        wanted.add("/dev/mapper/%s" % mapper_name(entry["vg"], entry["lv"]))
    for base in ["/dev/mapper"] + ["/dev/" + d for d in os.listdir("/dev")]:
        if not os.path.isdir(base) or os.path.islink(base):
            continue
        for item in os.listdir(base):
            path = os.path.join(base, item)
            if os.path.islink(path) and re.match(r"^\.\./loop\d+$", os.readlink(path)) and path not in wanted:
                os.unlink(path)
        if base != "/dev/mapper" and not os.listdir(base) and base not in ("/dev/shm", "/dev/pts", "/dev/mqueue"):
            try:
                os.rmdir(base)
            except OSError:
                pass


def activate(entry, loops):
    """Make the LV's loop exist with the right geometry; return (loopN, created)."""
    if entry["error"]:
        raise KitError(
            "cannot activate %s/%s: %s (the sim kit maps linear LVs whose extents "
            "are contiguous on one PV)" % (entry["vg"], entry["lv"], entry["error"])
        )
    tag = tag_for(entry["uuid"])
    name = loops.get(tag)
    created = False
    if name:
        set_geometry(name, entry["offset"], entry["size"])
    else:
        name = attach(entry["pv"], entry["offset"], entry["size"], tag)
        loops[tag] = name
        created = True
    loop_node(name)
    make_links(entry, name)
    return name, created


def deactivate(entry, loops, cmd):
    tag = tag_for(entry["uuid"])
    name = loops.get(tag)
    if not name:
        return
    if mounts_of(name) or in_use(name):
        raise KitError("Logical volume %s/%s in use." % (entry["vg"], entry["lv"]))
    detach(name)
    loops.pop(tag, None)


def wipe(name, size):
    """A new LV starts clean, as LVM's zeroing and signature wiping leave it."""
    node = "/dev/" + name
    fd = os.open(node, os.O_WRONLY)
    try:
        length = min(size, 1 << 20)
        os.write(fd, b"\0" * length)
        os.fsync(fd)
    finally:
        os.close(fd)
    subprocess.run(["wipefs", "-a", "-q", node], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sync(activate_all=False, select=None, refused=None):
    """Bring loops in line with metadata: resize the active ones, detach removed LVs,
    activate those in ``select`` (uuids) or all when activate_all. At boot (activate_all)
    an LV that misses a physical volume (attr[8] 'p', partial) is not activated, its loop
    from before the boot detached, and it is listed in ``refused``."""
    table = lv_table()
    loops = kit_loops()
    by_tag = {tag_for(u): u for u in table}
    for tag, name in list(loops.items()):
        if tag not in by_tag:
            if mounts_of(name) or in_use(name):
                err("WARNING: kit loop %s of a removed LV is still mounted" % name)
                continue
            detach(name)
            loops.pop(tag)
    active = []
    created = []
    for uuid, entry in table.items():
        tag = tag_for(uuid)
        want = activate_all or (select is not None and uuid in select)
        if tag in loops or want:
            if activate_all and entry["attr"][9:10] == "k":
                continue
            if activate_all and entry["attr"][8:9] == "p":
                # lvchange(8) --activationmode: complete (LVM's default for a linear LV) activates
                # no LV with a missing PV; the device-mapper table of the last boot is gone too.
                name = loops.pop(tag, None)
                if name and not (mounts_of(name) or in_use(name)):
                    detach(name)
                if refused is not None:
                    refused.append(entry)
                continue
            name, new = activate(entry, loops)
            active.append((entry, name))
            if new:
                created.append((entry, name))
    remove_stale_links(active)
    return table, loops, created


# ---------------------------------------------------------------- argument helpers
def split_activation(args):
    """Pull -a/--activate VALUE out of args; return (value or None, rest)."""
    rest, value = [], None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-a", "--activate"):
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 2
            continue
        if arg.startswith("--activate="):
            value = arg.split("=", 1)[1]
        elif re.match(r"^-a[ayenls]+$", arg):
            value = arg[2:]
        else:
            rest.append(arg)
        i += 1
    return value, rest


def split_zero(args):
    """Pull -Z/--zero and -W/--wipesignatures out; return (zero, wipe, rest)."""
    zero = wipe_sig = True
    rest = []
    i = 0
    while i < len(args):
        arg = args[i]
        m = re.match(r"^(-Z|--zero|-W|--wipesignatures)(?:=?([yn]))?$", arg)
        if m:
            value = m.group(2)
            if value is None and i + 1 < len(args) and args[i + 1] in ("y", "n"):
                value = args[i + 1]
                i += 1
            if m.group(1) in ("-Z", "--zero"):
                zero = value != "n"
            else:
                wipe_sig = value != "n"
        else:
            rest.append(arg)
        i += 1
    return zero, wipe_sig, rest


def contiguous(args):
    """Without device-mapper an LV must be one range of its PV: ask LVM to allocate
    contiguously (unless the caller chose a policy), so it refuses what the kit cannot map
    instead of writing metadata for an LV that cannot be activated."""
    if any(a == "--alloc" or a.startswith("--alloc=") or a in ("-C", "--contiguous") for a in args):
        return args
    return args + ["--alloc", "contiguous"]


def restore_alloc(before, args):
    """The contiguous policy the kit asked for is recorded on the LV; put back inherit
    (what LVM records by default) unless the caller chose a policy."""
    if any(a == "--alloc" or a.startswith("--alloc=") or a in ("-C", "--contiguous") for a in args):
        return
    for uuid, entry in lv_table().items():
        old = before.get(uuid)
        if entry["attr"][2:3] == "c" and (old is None or old["attr"][2:3] != "c"):
            lvm("lvchange", "--alloc", "inherit", "%s/%s" % (entry["vg"], entry["lv"]), check=False)


def split_resizefs(args):
    rest = [a for a in args if a not in ("-r", "--resizefs")]
    return len(rest) != len(args), rest


def positional(args):
    """Rough positional args (VG, VG/LV, /dev/VG/LV) for commands whose options we know."""
    takes_value = {
        "-n",
        "--name",
        "-L",
        "--size",
        "-l",
        "--extents",
        "-s",
        "--snapshot",
        "-i",
        "--stripes",
        "-I",
        "--stripesize",
        "--type",
        "-m",
        "--mirrors",
        "--config",
        "--alloc",
        "-C",
        "--contiguous",
        "-p",
        "--permission",
        "-r",
        "--readahead",
        "-M",
        "--persistent",
        "--major",
        "--minor",
        "--addtag",
        "--deltag",
        "-S",
        "--select",
        "--setactivationskip",
        "-k",
        "--setautoactivation",
        "--profile",
        "--metadataprofile",
        "--poolmetadatasize",
        "-T",
        "--thin",
        "-V",
        "--virtualsize",
        "-c",
        "--chunksize",
        "--reportformat",
        "-o",
        "--options",
        "-O",
        "--sort",
        "--separator",
        "--units",
        "--cachemode",
        "--discards",
        "--errorwhenfull",
    }
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            if arg in takes_value:
                skip = True
            continue
        out.append(arg)
    return out


def select_uuids(table, names):
    """uuids of the LVs named by VG, VG/LV or /dev/VG/LV arguments (all when none)."""
    if not names:
        return set(table)
    chosen = set()
    for name in names:
        name = name.rstrip("/")
        if name.startswith("/dev/mapper/"):
            base = name[len("/dev/mapper/") :]
            parts = [p.replace("\0", "-") for p in base.replace("--", "\0").split("-", 1)]
            name = "/".join(parts)
        elif name.startswith("/dev/"):
            name = name[len("/dev/") :]
        for uuid, entry in table.items():
            if name in (entry["vg"], "%s/%s" % (entry["vg"], entry["lv"])):
                chosen.add(uuid)
    return chosen


# ---------------------------------------------------------------- report rewriting
def _active_uuids():
    table = lv_table()
    loops = kit_loops()
    active, opened = set(), set()
    for uuid in table:
        name = loops.get(tag_for(uuid))
        if name:
            active.add(uuid)
            if mounts_of(name) or in_use(name):
                opened.add(uuid)
    return active, opened


def _fix_attr(attr, uuid, active, opened):
    """LVM without device-mapper reports state/open as X (unknown); report the kit's."""
    if len(attr) < 6:
        return attr
    chars = list(attr)
    chars[4] = "a" if uuid in active else "-"
    chars[5] = "o" if uuid in opened else "-"
    return "".join(chars)


def report(cmd, args):
    """lvs/vgs: run the real report with lv_attr,lv_uuid appended, then show kit-active LVs
    as active (attr[4] 'a', attr[5] 'o' when mounted) and drop the appended columns."""
    opts = " ".join(args)
    if cmd == "vgs" and "lv_" not in opts:
        return run_real(cmd, args)
    json_mode = "--reportformat" in opts and "json" in opts
    sep = None
    prefixes = "--nameprefixes" in args
    for i, arg in enumerate(args):
        if arg == "--separator" and i + 1 < len(args):
            sep = args[i + 1]
        elif arg.startswith("--separator="):
            sep = arg.split("=", 1)[1]
    extra = ["-o", "+lv_attr,lv_uuid"]
    proc = subprocess.run(
        [LVM, cmd] + args + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True
    )
    if proc.returncode != 0:
        # Fall back to the plain report so the caller sees LVM's own error.
        return run_real(cmd, args)
    sys.stderr.write(quiet_stderr(proc.stderr))
    try:
        active, opened = _active_uuids()
    except KitError:
        active, opened = set(), set()
    out = proc.stdout
    lines = []
    # The appended columns are always " " + attr (10) + " " + uuid (38) in aligned output
    # (LVM pads every column, the last too), or sep + attr + sep + uuid with a separator:
    # cutting exactly that suffix gives LVM's own line for the caller's columns.
    json_row = re.compile(r'^(.*), "lv_attr":"([^"]*)", "lv_uuid":"([^"]*)"(\}?,?)\s*$')
    for line in out.splitlines():
        if json_mode:
            m = json_row.match(line)
            if m:
                body, attr, uuid, tail = m.groups()
                new = _fix_attr(attr, uuid, active, opened)
                body = body.replace('"lv_attr":"%s"' % attr, '"lv_attr":"%s"' % new, 1)
                line = body + tail
            lines.append(line)
            continue
        if prefixes:
            m = re.search(r"\s*LVM2_LV_ATTR='([^']*)'\s+LVM2_LV_UUID='([^']*)'\s*$", line)
            if m:
                base = line[: m.start()]
                new = _fix_attr(m.group(1), m.group(2), active, opened)
                line = base.replace("LVM2_LV_ATTR='%s'" % m.group(1), "LVM2_LV_ATTR='%s'" % new, 1)
            lines.append(line)
            continue
        s_ = " " if sep is None else sep
        tail = line[-(38 + 10 + 2 * len(s_)) :] if len(line) >= 48 + 2 * len(s_) else ""
        m = re.match(r"^%s(\S{10})%s(\S{38})$" % (re.escape(s_), re.escape(s_)), tail) if tail else None
        if m and UUID_RE.match(m.group(2)):
            attr, uuid = m.group(1), m.group(2)
            body = line[: -len(tail)]
            new = _fix_attr(attr, uuid, active, opened)
            if new != attr:
                body = re.sub(
                    r"(^|%s|\s)%s(?=%s|\s|$)" % (re.escape(s_), re.escape(attr), re.escape(s_)),
                    lambda mm, new=new: mm.group(1) + new,
                    body,
                    count=1,
                )
            line = body
        else:
            # Heading line: cut "Attr" and "LV UUID" (padded to 10 and 38 when aligned).
            aligned = " Attr" + " " * 6 + " LV UUID" + " " * 31
            plain = "%sAttr%sLV UUID" % (s_, s_)
            if sep is None and line.endswith(aligned):
                line = line[: -len(aligned)]
            elif line.endswith(plain):
                line = line[: -len(plain)]
        lines.append(line)
    sys.stdout.write("\n".join(lines) + ("\n" if lines else ""))
    return 0


def lvdisplay(args):
    proc = subprocess.run(
        [LVM, "lvdisplay"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True
    )
    sys.stderr.write(quiet_stderr(proc.stderr))
    if proc.returncode != 0 or "-c" in args or "--colon" in args:
        sys.stdout.write(proc.stdout)
        return proc.returncode
    try:
        active, opened = _active_uuids()
    except KitError:
        active, opened = set(), set()
    uuid = None
    out = []
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s*LV UUID\s+(\S+)", line)
        if m:
            uuid = m.group(1)
        if uuid in active and "LV Status" in line:
            line = line.replace("NOT available", "available")
        if uuid in opened and re.match(r"^\s*# open\s+0\s*$", line):
            line = line.replace("0", "1")
        out.append(line)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


# ---------------------------------------------------------------- commands
# Warnings LVM prints only because the kit runs it with activation disabled (the kit does
# the activation and the zeroing): a real host never shows them, so neither do we.
NOISE = re.compile(
    r"^\s*WARNING: (Activation disabled\. No device-mapper interaction will be "
    r"attempted\.|Logical volume \S+ not zeroed\.)\s*$"
)


def run_real(cmd, args):
    """Run the real LVM command with its stderr filtered of the kit's noise; prompts (a
    partial line with no newline) are passed through as soon as LVM stops writing."""
    import select

    proc = subprocess.Popen([LVM, cmd] + args, stderr=subprocess.PIPE)
    fd = proc.stderr.fileno()
    buf = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            if buf:
                sys.stderr.buffer.write(buf)
                sys.stderr.flush()
                buf = b""
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not NOISE.match(line.decode("utf-8", "replace")):
                sys.stderr.buffer.write(line + b"\n")
        sys.stderr.flush()
    if buf and not NOISE.match(buf.decode("utf-8", "replace")):
        sys.stderr.buffer.write(buf)
    sys.stderr.flush()
    return proc.wait()


def quiet_stderr(text):
    return "".join(line + "\n" for line in text.splitlines() if not NOISE.match(line))


def cmd_lvcreate(args):
    activation, rest = split_activation(args)
    zero, wipe_sig, rest = split_zero(rest)
    if any(a in rest for a in ("-T", "--thin", "--thinpool", "-s", "--snapshot")) or any(
        a.startswith(("--type=thin", "--type=snapshot", "--type=cache")) for a in rest
    ):
        err("the sim kit maps linear LVs only (no thin pools or snapshots without device-mapper)")
        return 5
    with Lock():
        before_table = lv_table()
        before = set(before_table)
        rc = run_real("lvcreate", contiguous(rest) + ["--zero", "n", "--wipesignatures", "n"])
        if rc != 0:
            return rc
        restore_alloc(before_table, rest)
        table = lv_table()
        new = set(table) - before
        if activation is not None and activation.endswith("n"):
            return 0
        _, _, created = sync(select=new)
        for entry, name in created:
            if entry["uuid"] in new and (zero or wipe_sig):
                wipe(name, entry["size"])
    return 0


def cmd_resize(cmd, args):
    resizefs, rest = split_resizefs(args)
    with Lock():
        before = lv_table()
        rc = run_real(cmd, contiguous(rest) if cmd != "lvreduce" else rest)
        if rc != 0:
            return rc
        restore_alloc(before, rest)
        table, loops, _ = sync()
    if resizefs:
        for uuid, entry in table.items():
            old = before.get(uuid)
            name = loops.get(tag_for(uuid))
            if not old or not name or old["size"] == entry["size"]:
                continue
            if entry["size"] < (old["size"] or 0):
                err("the sim kit cannot shrink a filesystem (--resizefs on reduce)")
                return 5
            mounts = mounts_of(name)
            fstype = subprocess.run(
                ["blkid", "-o", "value", "-s", "TYPE", "/dev/" + name], stdout=subprocess.PIPE, universal_newlines=True
            ).stdout.strip()
            if fstype == "xfs" and mounts:
                rc = subprocess.run(["xfs_growfs", mounts[0]]).returncode
            elif fstype.startswith("ext"):
                rc = subprocess.run(["resize2fs", "/dev/" + name]).returncode
            elif fstype:
                err("the sim kit grows xfs (mounted) and ext* filesystems only, not %s" % fstype)
                rc = 5
            if rc:
                return rc
    return 0


def cmd_change(cmd, args):
    activation, rest = split_activation(args)
    # Options that change nothing by themselves: with only these besides -a, the real
    # command has nothing left to do (LVM would reject it).
    neutral = {
        "-q",
        "--quiet",
        "-v",
        "--verbose",
        "-y",
        "--yes",
        "-f",
        "--force",
        "-d",
        "--debug",
        "-K",
        "--ignoreactivationskip",
        "--noudevsync",
        "--ignoremonitoring",
        "--sysinit",
        "--ignorelockingfailure",
        "--nolocking",
        "-P",
        "--partial",
        "--activationmode",
    }
    changes = []
    skip = False
    for arg in rest:
        if skip:
            skip = False
            continue
        if arg in ("--config", "--commandprofile", "--activationmode", "--profile"):
            skip = True
            continue
        if arg.startswith("-") and arg not in neutral and not re.match(r"^-[qvydfK]+$", arg):
            changes.append(arg)
    with Lock():
        rc = 0
        if activation is None or changes:
            rc = run_real(cmd, rest)
            if rc != 0:
                return rc
        if activation is None:
            sync()
            return 0
        table = lv_table()
        names = positional(rest)
        chosen = select_uuids(table, names)
        loops = kit_loops()
        if activation.endswith("n"):
            for uuid in chosen:
                try:
                    deactivate(table[uuid], loops, cmd)
                except KitError as exc:
                    err(str(exc))
                    rc = 5
            sync()
            return rc
        try:
            sync(select=chosen)
        except KitError as exc:
            err(str(exc))
            return 5
    return rc


def cmd_remove(cmd, args):
    with Lock():
        table = lv_table()
        names = positional(args)
        chosen = select_uuids(table, names) if names else set()
        loops = kit_loops()
        for uuid in chosen:
            name = loops.get(tag_for(uuid))
            if name and (mounts_of(name) or in_use(name)):
                entry = table[uuid]
                err("Logical volume %s/%s contains a filesystem in use." % (entry["vg"], entry["lv"]))
                return 5
        rc = run_real(cmd, args)
        sync()
    return rc


def data_disk_detached():
    try:
        with open(DISK_SWITCH) as fh:
            return fh.read().strip() == "detached"
    except OSError:
        return False


def take_data_disks_away():
    """The data disks' nodes gone from /dev (docker makes them again at every start): LVM,
    blkid and lsblk find no such disk, as after a disk failed or was pulled."""
    gone = []
    for name in sorted(os.listdir("/dev")):
        path = "/dev/" + name
        if DATA_DISK_RE.match(name) and stat.S_ISBLK(os.lstat(path).st_mode):
            os.unlink(path)
            gone.append(path)
    return gone


def udev_links(node):
    """/dev/disk/by-uuid/UUID and /dev/disk/by-label/LABEL -> the LV's node, as udev's
    60-persistent-storage rules make them for the filesystem on a block device."""
    probe = subprocess.run(["blkid", "-p", "-o", "export", node], stdout=subprocess.PIPE, universal_newlines=True)
    for line in probe.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in ("UUID", "LABEL") and re.match(r"^[A-Za-z0-9._-]+$", value):
            _link("/dev/disk/by-%s/%s" % (key.lower(), value), "../../" + os.path.basename(node))


def cmd_boot():
    """Re-attach every LV's loop (not those missing a physical volume) and make the links
    udev makes; systemd mounts the fstab entries (cmd_fstab_generator's units)."""
    # systemd makes / a shared mount on a real host but not in a container; without it a
    # service's private mount namespace (ProtectSystem=, PrivateTmp=) keeps a copy of
    # /home mounted after `umount /home`, and the LV stays in use.
    subprocess.run(["mount", "--make-rshared", "/"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if data_disk_detached():
        for path in take_data_disks_away():
            print("kit: data disk %s detached (kunlun-kit-disk attach gives it back at the next boot)" % path)
    refused = []
    with Lock():
        try:
            table, loops, _ = sync(activate_all=True, refused=refused)
        except KitError as exc:
            err(str(exc))
            return 1
    for entry in refused:
        # LVM's own words for an LV that misses a physical volume.
        err(
            "Refusing activation of partial LV %s/%s.  Use '--activationmode partial' to override."
            % (entry["vg"], entry["lv"])
        )
    for uuid, entry in table.items():
        name = loops.get(tag_for(uuid))
        if name:
            udev_links("/dev/" + name)
            print("kit: activated %s/%s as /dev/%s" % (entry["vg"], entry["lv"], name))
    return 0


def cmd_disk(args):
    """kunlun-kit-disk detach|attach|status: the data disks gone from the next boot on, or back."""
    if args == ["detach"]:
        with open(DISK_SWITCH, "w") as fh:
            fh.write("detached\n")
        print("kit: the data disk is gone from the next boot on (kunlun-kit-disk attach gives it back)")
        return 0
    if args == ["attach"]:
        if os.path.exists(DISK_SWITCH):
            os.unlink(DISK_SWITCH)
        print("kit: the data disk is back from the next boot on")
        return 0
    if args == ["status"]:
        present = [n for n in sorted(os.listdir("/dev")) if DATA_DISK_RE.match(n)]
        print(
            "%s; %s from the next boot"
            % (
                "present: " + " ".join("/dev/" + n for n in present) if present else "absent",
                "detached" if data_disk_detached() else "attached",
            )
        )
        return 0
    sys.stderr.write("usage: kunlun-kit-disk detach|attach|status\n")
    return 2


def cmd_wait_device(args):
    """Wait until the block device at args[0] exists (the device unit's job at boot); the
    unit's TimeoutStartSec (x-systemd.device-timeout=) ends the wait."""
    if len(args) != 1:
        sys.stderr.write("usage: kunlun-kit-lvm wait-device PATH\n")
        return 2
    while True:
        try:
            if stat.S_ISBLK(os.stat(args[0]).st_mode):
                return 0
        except OSError:
            pass
        time.sleep(0.2)


def _escape(path, **how):
    """systemd-escape --path, with --suffix=... or --template=..."""
    argv = ["systemd-escape", "--path"] + ["--%s=%s" % kv for kv in how.items()] + [path]
    return subprocess.run(argv, stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()


def fstab_device(spec):
    """The device path systemd makes of an fstab spec (fstab_node_to_udev_node), or None
    when the spec is no device (a network or virtual file system)."""
    spec = spec.replace('"', "")
    for key, where in (
        ("UUID", "by-uuid"),
        ("LABEL", "by-label"),
        ("PARTUUID", "by-partuuid"),
        ("PARTLABEL", "by-partlabel"),
    ):
        if spec.startswith(key + "="):
            return "/dev/disk/%s/%s" % (where, spec[len(key) + 1 :])
    return spec if spec.startswith("/dev/") else None


def cmd_fstab_generator(args):
    """The systemd generator: for each fstab device entry, the mount unit systemd-fstab-generator
    writes on a real host, which it does not write when /sys is read-only (as in this container)."""
    normal = args[0] if args else "/run/systemd/generator"
    try:
        if not os.statvfs("/sys").f_flag & os.ST_RDONLY:
            return 0  # systemd's own generator makes them
        with open("/etc/fstab") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#"):
            continue
        where = os.path.normpath(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
        fstype, options = fields[2], fields[3] if len(fields) > 3 else "defaults"
        opts = options.split(",")
        what = fstab_device(fields[0])
        if not what or fstype == "swap" or "noauto" in opts or not where.startswith("/") or where == "/":
            continue
        timeouts = [o.split("=", 1)[1] for o in opts if o.startswith("x-systemd.device-timeout=")]
        unit = _escape(where, suffix="mount")
        device = _escape(what, template="kunlun-kit-device@.service")
        with open(os.path.join(normal, unit), "w") as fh:
            fh.write(
                "# Automatically generated by kunlun-kit-fstab-generator (sim kit): the unit\n"
                "# systemd-fstab-generator writes for this /etc/fstab line on a real host (here /sys is\n"
                "# read-only and it ignores device entries); kunlun-kit-device@.service stands in for\n"
                "# the device unit it waits for.\n"
                "[Unit]\nDocumentation=man:fstab(5) man:systemd-fstab-generator(8)\nSourcePath=/etc/fstab\n"
                "%sRequires=%s\nAfter=%s\n\n[Mount]\nWhat=%s\nWhere=%s\n%sOptions=%s\n"
                % (
                    "" if "nofail" in opts else "Before=local-fs.target\n",
                    device,
                    device,
                    what,
                    where,
                    "" if fstype == "auto" else "Type=%s\n" % fstype,
                    options,
                )
            )
        dropin = os.path.join(normal, device + ".d")
        os.makedirs(dropin, exist_ok=True)
        with open(os.path.join(dropin, "50-device-timeout.conf"), "w") as fh:
            fh.write("[Service]\nTimeoutStartSec=%s\n" % (timeouts[-1] if timeouts else DEFAULT_DEVICE_TIMEOUT))
        # nofail: only wanted by local-fs.target, and not ordered before it (systemd.mount(5)).
        wanted = os.path.join(normal, "local-fs.target.%s" % ("wants" if "nofail" in opts else "requires"))
        os.makedirs(wanted, exist_ok=True)
        _link(os.path.join(wanted, unit), "../" + unit)
    return 0


def main(argv):
    prog = os.path.basename(argv[0])
    args = argv[1:]
    if prog == "kunlun-kit-disk":
        return cmd_disk(args)
    if prog == "kunlun-kit-fstab-generator":
        return cmd_fstab_generator(args)
    if prog in ("kitlvm.py", "kunlun-kit-lvm"):
        if not args:
            sys.stderr.write("usage: kunlun-kit-lvm boot|sync|status|wait-device PATH\n")
            return 2
        prog, args = args[0], args[1:]
        if prog == "boot":
            return cmd_boot()
        if prog == "wait-device":
            return cmd_wait_device(args)
        if prog == "sync":
            with Lock():
                sync()
            return 0
        if prog == "status":
            for tag, name in sorted(kit_loops().items()):
                offset, size = loop_geometry(name)
                print("%s %s offset=%d size=%d mounts=%s" % (name, tag, offset, size, ",".join(mounts_of(name))))
            return 0
    try:
        if prog == "lvcreate":
            return cmd_lvcreate(args)
        if prog in ("lvextend", "lvresize", "lvreduce"):
            return cmd_resize(prog, args)
        if prog in ("lvchange", "vgchange"):
            return cmd_change(prog, args)
        if prog in ("lvremove", "vgremove"):
            return cmd_remove(prog, args)
        if prog in ("lvrename", "vgrename"):
            with Lock():
                rc = run_real(prog, args)
                sync()
            return rc
        if prog in ("lvs", "vgs"):
            return report(prog, args)
        if prog == "lvdisplay":
            return lvdisplay(args)
    except KitError as exc:
        err(str(exc))
        return 5
    return run_real(prog, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
