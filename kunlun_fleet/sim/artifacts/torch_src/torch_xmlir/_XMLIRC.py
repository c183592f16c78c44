"""Native bridge of torch_xmlir: device discovery through the kunlun driver's nodes.

The runtime opens /dev/xpuN for every device XPU_VISIBLE_DEVICES lets it see. A device
the driver could not bring up has a node with no driver behind it: opening it fails
(ENXIO, "No such device or address"), and the runtime leaves that device out of its
count, so one card in error on an 8-card server gives 7.
"""

import glob
import os
import re


def _dev_dir() -> str:
    return os.environ.get("KUNLUN_SIM_DEV_DIR", "/dev")


def _present() -> list:
    out = []
    for path in glob.glob(os.path.join(_dev_dir(), "xpu*")):
        m = re.fullmatch(r"xpu(\d+)", os.path.basename(path))
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def _xpu_get_visible_devices() -> list:
    present = _present()
    visible = os.environ.get("XPU_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return present
    wanted = [int(p) for p in (x.strip() for x in visible.split(",")) if p.isdigit()]
    return [d for d in wanted if d in present]


def _open_error(index: int):
    """None when /dev/xpu<index> opens, else the OSError."""
    try:
        os.close(os.open(os.path.join(_dev_dir(), "xpu%d" % index), os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return exc
    return None


def _xpu_get_failed_devices() -> list:
    """[(index, node, error text)] of visible devices whose node does not open."""
    out = []
    for d in _xpu_get_visible_devices():
        exc = _open_error(d)
        if exc is not None:
            out.append((d, os.path.join(_dev_dir(), "xpu%d" % d), "[Errno %d] %s" % (exc.errno, exc.strerror)))
    return out


def _xpu_get_devices_number() -> int:
    """Number of XPUs this process can use: the visible /dev/xpuN nodes that open."""
    return sum(1 for d in _xpu_get_visible_devices() if _open_error(d) is None)
