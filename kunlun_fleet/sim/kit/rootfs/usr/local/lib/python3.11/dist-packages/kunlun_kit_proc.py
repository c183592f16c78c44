"""Kit: /proc/modules for Python programs on a kernel built without loadable modules.

The sim hosts' kernel has no CONFIG_MODULES: /proc/modules does not exist and no file can
be created in procfs. Tools that read it directly (community.general.modprobe reads
/proc/modules, then /lib/modules/$(uname -r)/modules.builtin) would fail. Loaded by
kunlun_kit_proc.pth at interpreter start-up, this wraps open() so that, ONLY while the
real file is absent:
  /proc/modules                           reads the kit's loaded modules (kunlun,
                                          kunlun_peermem; state of the kit's modprobe)
                                          in /proc/modules format;
  /lib/modules/<release>/modules.builtin  lists the modules built into the kernel (the
                                          names under /sys/module), as kernel/<name>.ko.
On a kernel with modules both files exist and nothing changes.
"""

import builtins
import io
import os

_PREFIX = os.environ.get("XRE_PREFIX", "/") or "/"
_SIZES = {"kunlun": 1658880, "kunlun_peermem": 16384}
_DEPENDS = {"kunlun_peermem": ["kunlun"]}
_real_open = builtins.open
_builtin = "/lib/modules/%s/modules.builtin" % os.uname().release


def _loaded(name):
    return os.path.isdir(os.path.join(_PREFIX, "run/kunlun-kit/modules", name))


def proc_modules_text():
    lines = []
    for name in ("kunlun_peermem", "kunlun"):  # newest first, like the kernel
        if not _loaded(name):
            continue
        holders = [m for m, deps in _DEPENDS.items() if name in deps and _loaded(m)]
        lines.append(
            "%s %d %d %s Live 0x0000000000000000 (O)"
            % (name, _SIZES[name], len(holders), "".join(h + "," for h in holders) or "-")
        )
    return "".join(line + "\n" for line in lines)


def builtin_text():
    try:
        names = sorted(os.listdir("/sys/module"))
    except OSError:
        names = []
    return "".join("kernel/%s.ko\n" % n for n in names)


def _open(file, mode="r", *args, **kwargs):
    if isinstance(file, (str, bytes, os.PathLike)) and not any(c in mode for c in "wax+"):
        path = os.fsdecode(os.fspath(file))
        if path in ("/proc/modules", _builtin) and not os.path.exists(path):
            text = proc_modules_text() if path == "/proc/modules" else builtin_text()
            if "b" in mode:
                return io.BytesIO(text.encode())
            return io.StringIO(text)
    return _real_open(file, mode, *args, **kwargs)


if not os.path.exists("/proc/modules"):
    builtins.open = _open
    io.open = _open
