"""Loop devices on the machine: the hosts' data disks and the loops the in-host LVM kit
attaches (loop devices are global to the kernel, so they outlive containers and are
cleaned up from here)."""

import errno
import fcntl
import glob
import os
import struct

from .config import KIT_LOOP_TAG, SimError, log, run

LOOP_CLR_FD = 0x4C01
LOOP_GET_STATUS64 = 0x4C05
INFO64 = struct.Struct("<QQQQQIIII64s64s32sQQ")


def attached_loops():
    """Names (loopN) of every attached loop device on the machine."""
    names = []
    for path in glob.glob("/sys/block/loop*"):
        if os.path.isdir(os.path.join(path, "loop")):
            names.append(os.path.basename(path))
    return sorted(names, key=lambda n: int(n[4:]))


def _dev_node(name):
    """A device node for loopN on the machine (devtmpfs normally has it)."""
    path = "/dev/" + name
    if os.path.exists(path):
        return path
    with open("/sys/block/%s/dev" % name) as fh:
        major, minor = (int(x) for x in fh.read().strip().split(":"))
    os.mknod(path, 0o600 | 0o060000, os.makedev(major, minor))
    return path


def loop_file_name(name):
    """lo_file_name of loopN (the kit stores its tag there); None if not attached."""
    try:
        fd = os.open(_dev_node(name), os.O_RDONLY)
    except OSError:
        return None
    try:
        buf = bytearray(INFO64.size)
        fcntl.ioctl(fd, LOOP_GET_STATUS64, buf, True)
    except OSError:
        return None
    finally:
        os.close(fd)
    return INFO64.unpack(bytes(buf))[9].split(b"\0", 1)[0].decode("utf-8", "replace")


def backing_file(name):
    try:
        with open("/sys/block/%s/loop/backing_file" % name) as fh:
            return fh.read().strip()
    except OSError:
        return None


def detach(name):
    """Detach loopN; a busy device is set to auto-clear on last close by the kernel."""
    try:
        fd = os.open(_dev_node(name), os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    except OSError as exc:
        if exc.errno not in (errno.ENXIO,):
            log("detach %s: %s" % (name, exc))
    finally:
        os.close(fd)


def kit_loops(hosts=None):
    """Loops attached by the in-host LVM kit; with ``hosts`` (container names) only those of
    these hosts. The kit tags a loop ``kunlun-kit:<disk token>:<lv uuid>`` and a disk token
    is ``<container name>.<nonce>``, so this finds them even when the state file is lost."""
    found = []
    for name in attached_loops():
        tag = loop_file_name(name) or ""
        if not tag.startswith(KIT_LOOP_TAG):
            continue
        token = tag[len(KIT_LOOP_TAG) :].split(":", 1)[0]
        if hosts is None or token.split(".", 1)[0] in hosts:
            found.append(name)
    return found


def loops_for_file(path):
    """Loops whose backing file is ``path`` (the machine-side disk loops)."""
    real = os.path.realpath(path)
    return [n for n in attached_loops() if backing_file(n) in (path, real)]


def attach_file(path):
    """Attach a disk file; return /dev/loopN."""
    out = run(["losetup", "--find", "--show", path]).stdout.strip()
    if not out.startswith("/dev/loop"):
        raise SimError("losetup gave no device for %s: %r" % (path, out))
    return out


def release_disk(path, host):
    """Detach the kit loops of a host (container name) and then its disk loops."""
    for name in kit_loops([host]):
        log("detaching kit loop /dev/%s" % name)
        detach(name)
    for name in loops_for_file(path):
        log("detaching disk loop /dev/%s (%s)" % (name, path))
        detach(name)
