"""Native bridge of torch_xmlir: device discovery through the kunlun driver's nodes."""
import glob
import os
import re


def _present() -> list:
    dev_dir = os.environ.get("KUNLUN_SIM_DEV_DIR", "/dev")
    out = []
    for path in glob.glob(os.path.join(dev_dir, "xpu*")):
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


def _xpu_get_devices_number() -> int:
    """Number of XPUs this process can use (the /dev/xpuN nodes, as XPU_VISIBLE_DEVICES allows)."""
    return len(_xpu_get_visible_devices())
