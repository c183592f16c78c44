# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsers for what a Kunlunxin P800 server says about its XPUs.

Pure functions over the text of ``xpu-smi`` (table), ``xpu-smi -q``, ``xpu-smi -L``,
``lspci -Dn``/``lspci -Dnn``, ``lsmod`` (or /proc/modules), ``/proc/kunlun/version``
and ``/proc/xpu/devN/state``, plus version comparison helpers. Standard library only,
Python 3.8+, no I/O: the callers (modules in library/) run the commands.

Decisions written down here because the vendor does not document them:

* A device "in error": xpu-smi (like nvidia-smi) prints ``ERR!`` in the table fields it
  cannot read for that device. ``parse_table`` gives such a device ``state: "error"``
  (and the list of ``err_fields``), every other device ``state: "ok"``. When the driver
  exposes ``/proc/xpu/devN/state``, a value other than ``RUNNING`` also means "error"
  (see ``device_state``); the caller combines both.
* Firmware versions: ``xpu-smi -q`` prints ``ALL Version : 1.0.2.14.1.54``, six dotted
  fields, while the support notes say "firmware 1.48 or newer". The last two fields of
  the six-field form are the firmware release (``1.54``): that is what a floor such as
  ``1.48`` is compared against. A firmware string with any other number of fields (for
  example ``1.48`` or ``1.40.0.0``) is compared whole, as a dotted version. See
  ``firmware_release`` and ``firmware_at_least``.
* Power: the table's ``Pwr:Usage/Cap`` column (``85W / 400W``) gives each card's power use
  and its power cap; ``xpu-smi -q`` gives them in its ``Power Readings`` block. The
  vendor's material shows the block's title but not its keys, so the cap is the first of
  ``Enforced Power Limit``, ``Power Limit``, ``Current Power Limit`` found there, and the
  use the first of ``Power Draw``, ``Average Power Draw``, ``Instantaneous Power Draw``
  (nvidia-smi's keys: xpu-smi's table and ``-q`` otherwise mirror nvidia-smi's); a block
  titled ``XPU Power Readings`` counts too. A value is watts (``400W``, ``400.00 W``,
  ``400``); anything else (``N/A``, ``ERR!``, ``Unknown Error``, ``[Not Supported]``,
  nothing) is unknown: None, never an error. The table's figure is used when it has one, else the ``-q`` figure
  (``merge_devices``). ``low_power_devices`` judges the caps against the full cap (400 W
  on a P800; in the 120 W low-power mode a card gives about a third of its FP16 rate).
* The XRE release: xpu-smi builds print their header in two forms, ``Driver Version:
  5.0.21.26    XPU-RT Version: 5.0.21`` (the XRE release) and ``Driver Version: 515.58
  XPU-RT Version: N/A`` (not an XRE release). ``driver_release`` takes the first value
  shaped like a release (three or more dotted numbers, ``xre_release``) from the header,
  then ``-q``'s ``Driver Version``, then /proc/kunlun/version, and names every reading
  when none gives one (docs/target.md).
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# Card variants by XPU part number (docs/target.md: "VD" cards need the modprobe option).
PART_NUMBER_VARIANTS = {
    "B00100300110312": "VD",
    "B00100300110112": "VC",
}

# PCI vendor ids seen for Kunlunxin, and the P800 device ids.
KUNLUN_PCI_VENDORS = ("1d22", "2057")
P800_PCI_DEVICES = ("3686", "3687", "3688", "3689")

KUNLUN_MODULES = ("kunlun", "kunlun_peermem")

ERR = "ERR!"


# --------------------------------------------------------------------------- versions


def version_tuple(version):
    """'5.0.21.26' -> (5, 0, 21, 26). Non-numeric parts end the tuple.

    Raises ValueError when ``version`` does not start with a number.
    """
    if version is None:
        raise ValueError("no version given")
    parts = []
    for part in str(version).strip().split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        parts.append(int(m.group(0)))
        if m.group(0) != part:
            break
    if not parts:
        raise ValueError("not a dotted version: %r" % (version,))
    return tuple(parts)


def compare_versions(a, b):
    """-1, 0 or 1 as dotted version ``a`` is lower, equal or higher than ``b``.

    Missing trailing fields count as 0 (``1.48 == 1.48.0``).
    """
    ta, tb = version_tuple(a), version_tuple(b)
    width = max(len(ta), len(tb))
    ta = ta + (0,) * (width - len(ta))
    tb = tb + (0,) * (width - len(tb))
    return (ta > tb) - (ta < tb)


def version_at_least(version, floor):
    """True when dotted ``version`` >= ``floor``; False when ``version`` is None/invalid."""
    try:
        return compare_versions(version, floor) >= 0
    except ValueError:
        return False


def firmware_release(firmware):
    """The part of an xpu-smi firmware string a "firmware X.Y" floor is compared with.

    ``1.0.2.14.1.54`` (the six-field ``ALL Version``) -> ``1.54``; any other shape is
    returned unchanged (``1.48`` -> ``1.48``, ``1.40.0.0`` -> ``1.40.0.0``).
    """
    if firmware is None:
        return None
    firmware = str(firmware).strip()
    fields = firmware.split(".")
    if len(fields) == 6 and all(f.isdigit() for f in fields):
        return ".".join(fields[4:])
    return firmware


def firmware_at_least(firmware, floor):
    """True when the firmware release of ``firmware`` is >= ``floor`` (e.g. '1.48')."""
    return version_at_least(firmware_release(firmware), firmware_release(floor))


def card_variant(part_number):
    """'VD', 'VC' or None for an XPU part number."""
    if not part_number:
        return None
    return PART_NUMBER_VARIANTS.get(part_number.strip())


# ------------------------------------------------------------------------- bus ids


def normalize_bus_id(bus_id):
    """'00000000:52:00.0', '0000:52:00.0' or '52:00.0' -> '0000:52:00.0' (lower case)."""
    if not bus_id:
        return None
    m = re.match(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", bus_id.strip())
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return "%04x:%s:%s.%s" % (domain, m.group(2).lower(), m.group(3).lower(), m.group(4))


# --------------------------------------------------------------------- xpu-smi table

_HEADER_RE = re.compile(r"Driver Version:\s*(?P<driver>\S+)\s+XPU-RT Version:\s*(?P<runtime>\S+)")
_ROW1_RE = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>\S+)\s*"
    r"\|\s*(?P<bus_id>[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+(?P<disp>\S+)\s*"
    r"\|\s*(?P<ecc>\S+)\s*\|\s*$"
)
_ROW2_RE = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+"
    r"(?P<power_draw>[\d.]+\s*W|\S+)\s*/\s*(?P<power_cap>[\d.]+\s*W|\S+)\s*"
    r"\|\s*(?P<mem_used>\S+)\s*/\s*(?P<mem_total>\S+)\s*"
    r"\|\s*(?P<util>\S+)\s+(?P<compute_mode>\S+)\s*\|\s*$"
)
_ROW3_RE = re.compile(
    r"^\|\s*\|\s*(?P<l3_used>\S+)\s*/\s*(?P<l3_total>\S+)\s*"
    r"\|\s*(?P<sriov>\S+)\s*\|\s*$"
)
_PROC_RE = re.compile(
    r"^\|\s*(?P<xpu>\d+)\s+(?P<pid>\d+)\s+(?P<type>\S+)\s+(?P<name>.+?)\s+"
    r"(?P<mem>\S+)\s*\|\s*$"
)


def _na(value):
    """'N/A' -> None, anything else unchanged."""
    if value is None or value.strip() in ("N/A", ""):
        return None
    return value.strip()


def _mib(value):
    """'98304MiB' / '98304 MiB' -> 98304; None when absent, N/A or ERR!."""
    if value is None:
        return None
    m = re.match(r"^\s*(\d+)\s*MiB\s*$", value)
    return int(m.group(1)) if m else None


_WATTS_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:W|Watts?)?\s*$", re.IGNORECASE)


def parse_watts(value):
    """'400W', '400 W', '400.00 W' or '400' -> 400; '85.5 W' -> 85.5.

    None for anything that is not a figure in watts: None, '', 'N/A', '[N/A]', 'ERR!',
    'Unknown Error', 'Not Supported'. Whole figures come back as int, others as float.
    """
    if value is None:
        return None
    m = _WATTS_RE.match(str(value))
    if not m:
        return None
    watts = float(m.group(1))
    return int(watts) if watts == int(watts) else round(watts, 2)


def parse_header(text):
    """Driver and runtime versions from the table's header line.

    Returns {'driver_version': str|None, 'runtime_version': str|None}; ``N/A`` is None.
    """
    for line in text.splitlines():
        m = _HEADER_RE.search(line)
        if m:
            runtime = m.group("runtime").rstrip("|").strip()
            return {"driver_version": _na(m.group("driver")), "runtime_version": _na(runtime)}
    return {"driver_version": None, "runtime_version": None}


def parse_table(text):
    """Parse plain ``xpu-smi`` output.

    Returns a dict: driver_version, runtime_version, devices (list, in the order printed,
    each with index, name, bus_id, memory_total_mib, memory_used_mib, temperature,
    power_draw, power_cap (the column's text), power_draw_w, power_cap_w (watts, None when
    unknown), utilization, compute_mode, sriov_mode, state ('ok'|'error'), err_fields) and
    processes (list of {xpu, pid, type, name, memory_mib}).
    """
    result = parse_header(text)
    devices = []
    processes = []
    lines = text.splitlines()
    in_processes = False
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        if "Processes:" in line:
            in_processes = True
            i += 1
            continue
        if in_processes:
            m = _PROC_RE.match(line)
            if m:
                processes.append(
                    {
                        "xpu": int(m.group("xpu")),
                        "pid": int(m.group("pid")),
                        "type": m.group("type"),
                        "name": m.group("name").strip(),
                        "memory_mib": _mib(m.group("mem")),
                    }
                )
            i += 1
            continue
        m1 = _ROW1_RE.match(line)
        if m1:
            dev = {
                "index": int(m1.group("index")),
                "name": m1.group("name").strip(),
                "bus_id": m1.group("bus_id"),
                "persistence": _na(m1.group("persistence")),
                "ecc": _na(m1.group("ecc")),
            }
            fields = dict(m1.groupdict())
            m2 = _ROW2_RE.match(lines[i + 1].rstrip()) if i + 1 < len(lines) else None
            m3 = _ROW3_RE.match(lines[i + 2].rstrip()) if i + 2 < len(lines) else None
            if m2:
                fields.update(m2.groupdict())
                dev.update(
                    {
                        "temperature": _na(m2.group("temp")),
                        "power_draw": _na(m2.group("power_draw")),
                        "power_cap": _na(m2.group("power_cap")),
                        "power_draw_w": parse_watts(m2.group("power_draw")),
                        "power_cap_w": parse_watts(m2.group("power_cap")),
                        "memory_used_mib": _mib(m2.group("mem_used")),
                        "memory_total_mib": _mib(m2.group("mem_total")),
                        "utilization": _na(m2.group("util")),
                        "compute_mode": _na(m2.group("compute_mode")),
                    }
                )
                i += 1
            else:
                dev.update(
                    {
                        "temperature": None,
                        "power_draw": None,
                        "power_cap": None,
                        "power_draw_w": None,
                        "power_cap_w": None,
                        "memory_used_mib": None,
                        "memory_total_mib": None,
                        "utilization": None,
                        "compute_mode": None,
                    }
                )
            if m2 and m3:
                fields.update(m3.groupdict())
                dev["sriov_mode"] = _na(m3.group("sriov"))
                i += 1
            else:
                dev["sriov_mode"] = None
            err_fields = sorted(k for k, v in fields.items() if v == ERR)
            dev["err_fields"] = err_fields
            dev["state"] = "error" if err_fields else "ok"
            devices.append(dev)
        i += 1
    result["devices"] = devices
    result["processes"] = processes
    return result


# ------------------------------------------------------------------------ xpu-smi -q

_KV_RE = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_Q_DEVICE_RE = re.compile(r"^XPU\s+(?P<bus_id>[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")


# Keys of the Power Readings block, in the order they are preferred (see the module's notes).
_POWER_CAP_KEYS = ("enforced power limit", "power limit", "current power limit")
_POWER_DRAW_KEYS = ("power draw", "average power draw", "instantaneous power draw")


def _power_reading(raw, keys):
    """Watts of the first of ``keys`` (lower case) in a ``Power Readings`` block of ``raw``.

    The block may be titled ``Power Readings`` or ``<anything> Power Readings`` (nvidia-smi
    prints ``GPU Power Readings``); a key that is printed but not a figure (``N/A``) does
    not stop the search. None when no key gives a figure.
    """
    found = {}
    for path, value in raw.items():
        parts = path.split("/")
        if len(parts) == 2 and parts[0].strip().lower().endswith("power readings"):
            found.setdefault(parts[1].strip().lower(), value)
    for key in keys:
        watts = parse_watts(found.get(key))
        if watts is not None:
            return watts
    return None


def parse_query(text):
    """Parse ``xpu-smi -q [--id=N]``.

    Returns driver_version, runtime_version, attached (int|None) and devices: a list of
    dicts with bus_id, index (the ``Minor Number`` when printed, else the position),
    name, brand, architecture, serial, uuid, part_number, card_variant,
    firmware_version (``ALL Version``), device_id (``0x36862057``),
    memory_total_mib, memory_used_mib, power_cap_w and power_draw_w (from ``Power
    Readings``, watts, None when unknown: see the module's notes), and ``raw`` (every key,
    sections joined by '/').
    """
    result = {"driver_version": None, "runtime_version": None, "attached": None, "devices": []}
    dev = None
    sections = []  # (indent, name)
    for line in text.splitlines():
        if not line.strip() or set(line.strip()) <= set("=-"):
            continue
        if line.strip().startswith("=") and "LOG" in line:
            continue
        m = _Q_DEVICE_RE.match(line)
        if m:
            dev = {"bus_id": m.group("bus_id"), "raw": {}}
            result["devices"].append(dev)
            sections = []
            continue
        m = _KV_RE.match(line)
        if m:
            indent = len(m.group("indent").expandtabs())
            key, value = m.group("key").strip(), m.group("value")
            if dev is None:
                if key == "Driver Version":
                    result["driver_version"] = _na(value)
                elif key == "XPU-RT Version":
                    result["runtime_version"] = _na(value)
                elif key == "Attached XPUs":
                    result["attached"] = int(value) if value.isdigit() else None
                continue
            while sections and sections[-1][0] >= indent:
                sections.pop()
            path = "/".join([s[1] for s in sections] + [key])
            dev["raw"][path] = value
            continue
        # a section title: a line without a colon, e.g. "    Firmware Version"
        if dev is not None:
            indent = len(line) - len(line.lstrip())
            while sections and sections[-1][0] >= indent:
                sections.pop()
            sections.append((indent, line.strip()))
    for position, dev in enumerate(result["devices"]):
        raw = dev["raw"]
        minor = raw.get("Minor Number")
        dev["index"] = int(minor) if minor and minor.isdigit() else position
        dev["name"] = _na(raw.get("Product Name"))
        dev["brand"] = _na(raw.get("Product Brand"))
        dev["architecture"] = _na(raw.get("Product Architecture"))
        dev["serial"] = _na(raw.get("Serial Number"))
        dev["uuid"] = _na(raw.get("XPU UUID"))
        dev["part_number"] = _na(raw.get("XPU Part Number"))
        dev["card_variant"] = card_variant(dev["part_number"])
        dev["firmware_version"] = _na(raw.get("Firmware Version/ALL Version"))
        dev["device_id"] = _na(raw.get("PCI/Device Id"))
        if raw.get("PCI/Bus Id"):
            dev["bus_id"] = raw["PCI/Bus Id"]
        dev["memory_total_mib"] = _mib(raw.get("Memory Usage/Total"))
        dev["memory_used_mib"] = _mib(raw.get("Memory Usage/Used"))
        dev["power_cap_w"] = _power_reading(raw, _POWER_CAP_KEYS)
        dev["power_draw_w"] = _power_reading(raw, _POWER_DRAW_KEYS)
    return result


# ------------------------------------------------------------------------ xpu-smi -L

_LIST_RE = re.compile(r"^XPU\s+(?P<index>\d+):\s*(?P<name>.*?)(?:\s*\(UUID:\s*(?P<uuid>[^)]+)\))?\s*$")


def parse_list(text):
    """Parse ``xpu-smi -L``: lines ``XPU <n>: <name> (UUID: <uuid>)``."""
    devices = []
    for line in text.splitlines():
        m = _LIST_RE.match(line.strip())
        if m:
            devices.append(
                {"index": int(m.group("index")), "name": m.group("name").strip() or None, "uuid": m.group("uuid")}
            )
    return devices


# ----------------------------------------------------------------------------- lspci

_LSPCI_RE = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<rest>.*)$"
)
# -nn: "... [1200]: Vendor Device [2057:3686] (rev 01)"; -n: "1200: 2057:3686 (rev 01)"
_LSPCI_IDS_RE = re.compile(
    r"(?:\[|\s|^)(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]?(?:\s+\(rev\s+(?P<rev>[0-9a-fA-F]+)\))?\s*$"
)


def parse_lspci(text, vendors=KUNLUN_PCI_VENDORS, devices=P800_PCI_DEVICES):
    """P800 PCI functions in ``lspci -Dn`` or ``lspci -Dnn`` output.

    Returns a list of {slot, vendor, device, rev} for functions whose vendor is in
    ``vendors`` and device in ``devices`` (pass None to keep every function).
    """
    found = []
    for line in text.splitlines():
        m = _LSPCI_RE.match(line.strip())
        if not m:
            continue
        ids = _LSPCI_IDS_RE.search(m.group("rest"))
        if not ids:
            continue
        vendor, device = ids.group("vendor").lower(), ids.group("device").lower()
        if vendors is not None and vendor not in vendors:
            continue
        if devices is not None and device not in devices:
            continue
        found.append(
            {
                "slot": normalize_bus_id(m.group("slot")) or m.group("slot"),
                "vendor": vendor,
                "device": device,
                "rev": ids.group("rev"),
            }
        )
    return found


# ----------------------------------------------------------------------------- lsmod


def parse_lsmod(text):
    """Modules in ``lsmod`` output or /proc/modules content.

    Returns {name: {'size': int|None, 'used': int|None, 'used_by': [names]}}.
    """
    modules = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] == "Module":
            continue
        name = parts[0]
        size = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        used = None
        if len(parts) > 2 and parts[2].lstrip("-").isdigit():
            used = int(parts[2])
        used_by = []
        if len(parts) > 3:
            # lsmod: "a,b"; /proc/modules: "a,b," or "-"
            used_by = [u for u in parts[3].split(",") if u and u != "-"]
            if used_by and used_by[-1] in ("Live", "Loading", "Unloading"):
                used_by = []
        modules[name] = {"size": size, "used": used, "used_by": used_by}
    return modules


def kunlun_modules_loaded(text):
    """Sorted list of the Kunlun modules (kunlun, kunlun_peermem) in lsmod output."""
    loaded = parse_lsmod(text)
    return sorted(m for m in KUNLUN_MODULES if m in loaded)


# ------------------------------------------------------------------------------ /proc

_DOTTED_RE = re.compile(r"^\d+(?:\.\d+)+$")
_AFTER_VERSION_RE = re.compile(r"\bversion\s*[:=]?\s*v?(\d+(?:\.\d+)+)(?![\w.-])", re.IGNORECASE)


def _bare(token):
    return token.strip("()[]{},;:\"'")


def parse_proc_version(text):
    """The XRE release in /proc/kunlun/version, or None.

    The file's format is not documented; in order: the tenth field of a line containing
    ``KUNLUN`` (the field public install scripts print after running the XRE installer),
    a dotted number right after the word ``version`` (``version: 5.0.21.26``), else the
    one token of the text shaped like an XRE release (``xre_release``). A kernel release
    (``5.10.0-1.0.0.39``) is not a dotted number, so it is never taken; two candidates
    and nothing else to choose by give None.
    """
    if not text:
        return None
    for line in text.splitlines():
        fields = line.split()
        if "KUNLUN" in line and len(fields) >= 10 and _DOTTED_RE.match(_bare(fields[9])):
            return _bare(fields[9])
    m = _AFTER_VERSION_RE.search(text)
    if m:
        return m.group(1)
    shaped = sorted(set(t for t in (_bare(t) for t in text.split()) if xre_release(t)))
    return shaped[0] if len(shaped) == 1 else None


def device_state(proc_state_text):
    """(state, raw) from the content of /proc/xpu/devN/state.

    ``RUNNING`` -> ('ok', 'RUNNING'); anything else -> ('error', raw); None (no file) ->
    (None, None).
    """
    if proc_state_text is None:
        return None, None
    raw = proc_state_text.strip()
    return ("ok" if raw == "RUNNING" else "error"), raw


# ------------------------------------------------------------------- the XRE release

# Where the loaded driver's XRE release is read, in the order tried (driver_release).
XRE_SOURCES = ("xpu-smi", "xpu-smi -q", "/proc/kunlun/version")

_XRE_RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+(?:\.\d+)*$")


def xre_release(value):
    """``value`` (stripped) when it is shaped like an XRE release, else None.

    Every XRE release in the public material has three or more dotted numbers
    (5.0.21.15, 5.0.21.21, 5.0.21.26). Some xpu-smi
    builds print ``Driver Version: 515.58`` with ``XPU-RT Version: N/A``: two numbers,
    not an XRE release, so None.
    """
    if value is None:
        return None
    value = str(value).strip()
    return value if _XRE_RELEASE_RE.match(value) else None


def _header_printed(text):
    """The table header's 'Driver Version: ... XPU-RT Version: ...' as printed, or None."""
    for line in text.splitlines():
        m = _HEADER_RE.search(line)
        if m:
            return " ".join(m.group(0).rstrip("|").split())
    return None


def _query_driver_printed(text):
    """xpu-smi -q's 'Driver Version : ...' line (before the first device), or None."""
    for line in text.splitlines():
        if _Q_DEVICE_RE.match(line):
            break
        m = _KV_RE.match(line)
        if m and m.group("key").strip() == "Driver Version":
            return "Driver Version : %s" % m.group("value")
    return None


def driver_release(table_text=None, query_text=None, proc_text=None):
    """The loaded driver's XRE release, where it was read and what every source said.

    ``table_text`` and ``query_text`` are the output of ``xpu-smi`` and ``xpu-smi -q``
    (None when not run or failed), ``proc_text`` the content of /proc/kunlun/version
    (None when absent). The release is the first value shaped like one
    (``xre_release``) of: the table header's ``Driver Version``, ``-q``'s ``Driver
    Version``, /proc/kunlun/version (``parse_proc_version``). xpu-smi's ``XPU-RT
    Version`` is never used: N/A in one form, and ``-q`` has been seen printing 10.2
    there beside ``Driver Version : 5.0.21.26``.

    Returns {'version', 'source' (one of XRE_SOURCES), 'read', 'error'}: ``read`` maps
    each source to what it printed (the header's two versions, ``-q``'s line, the file's
    first line) or None; ``error`` names every reading when none gives a release, and is
    None when one does or when nothing was there to read (no driver).
    """
    table_version = parse_header(table_text)["driver_version"] if table_text else None
    query_version = parse_query(query_text)["driver_version"] if query_text else None
    proc_lines = [line.strip() for line in (proc_text or "").splitlines() if line.strip()]
    read = {
        "xpu-smi": _header_printed(table_text) if table_text else None,
        "xpu-smi -q": _query_driver_printed(query_text) if query_text else None,
        "/proc/kunlun/version": proc_lines[0][:200] if proc_lines else None,
    }
    candidates = (
        ("xpu-smi", xre_release(table_version)),
        ("xpu-smi -q", xre_release(query_version)),
        ("/proc/kunlun/version", parse_proc_version(proc_text)),
    )
    for source, version in candidates:
        if version:
            return {"version": version, "source": source, "read": read, "error": None}
    if table_text is None and query_text is None and proc_text is None:
        return {"version": None, "source": None, "read": read, "error": None}

    def printed(source, text):
        if read[source]:
            return "%s printed '%s'" % (source, read[source])
        return "%s %s" % (source, "did not answer" if text is None else "printed no Driver Version")

    proc = read["/proc/kunlun/version"]
    parts = [
        printed("xpu-smi", table_text),
        printed("xpu-smi -q", query_text),
        ("/proc/kunlun/version reads '%s'" % proc)
        if proc
        else "/proc/kunlun/version %s" % ("does not exist" if proc_text is None else "is empty"),
    ]
    error = (
        "no source gives the XRE release of the loaded driver: %s. An XRE release has three or "
        "more dotted numbers (5.0.21.26); a Driver Version such as 515.58 with XPU-RT Version N/A "
        "is not one. Fix: check that the kunlun module is loaded (lsmod | grep kunlun) and that "
        "/proc/kunlun/version names the XRE release, then re-run." % "; ".join(parts)
    )
    return {"version": None, "source": None, "read": read, "error": error}


# -------------------------------------------------------------------------- combined


def merge_devices(table, query=None, listing=None):
    """One record per device from the table, ``-q`` and ``-L`` results.

    Devices are keyed by bus id (``-q``) and index (``-L``); the table's list decides
    which devices exist. When the table has no devices (for example a build that only
    answers ``-q``), the ``-q`` devices are used.
    """
    query = query or {"devices": []}
    listing = listing or []
    by_bus = {}
    for qdev in query.get("devices", []):
        by_bus[normalize_bus_id(qdev.get("bus_id"))] = qdev
    by_index = dict((d["index"], d) for d in listing)
    base = table.get("devices") or [
        {
            "index": q["index"],
            "name": q["name"],
            "bus_id": q["bus_id"],
            "memory_total_mib": q["memory_total_mib"],
            "state": "ok",
            "err_fields": [],
        }
        for q in query.get("devices", [])
    ]

    def first_known(*values):
        for value in values:
            if value is not None:
                return value
        return None

    merged = []
    for dev in base:
        qdev = by_bus.get(normalize_bus_id(dev.get("bus_id")), {})
        ldev = by_index.get(dev["index"], {})
        part = qdev.get("part_number")
        merged.append(
            {
                "index": dev["index"],
                "name": dev.get("name") or qdev.get("name") or ldev.get("name"),
                "bus_id": dev.get("bus_id") or qdev.get("bus_id"),
                "memory_total_mib": dev.get("memory_total_mib") or qdev.get("memory_total_mib"),
                "part_number": part,
                "card_variant": card_variant(part),
                "firmware_version": qdev.get("firmware_version"),
                "serial": qdev.get("serial"),
                "uuid": qdev.get("uuid") or ldev.get("uuid"),
                "device_id": qdev.get("device_id"),
                "power_cap_w": first_known(dev.get("power_cap_w"), qdev.get("power_cap_w")),
                "power_draw_w": first_known(dev.get("power_draw_w"), qdev.get("power_draw_w")),
                "state": dev.get("state", "ok"),
                "err_fields": list(dev.get("err_fields", [])),
            }
        )
    return merged


# ----------------------------------------------------------------------------- power


def card_label(dev):
    """'device 3 (serial 02K...)', or 'device 3 (00000000:61:00.0)' without a serial."""
    ident = ("serial %s" % dev["serial"]) if dev.get("serial") else (dev.get("bus_id") or "bus id unknown")
    return "device %s (%s)" % (dev.get("index"), ident)


def _watts_text(watts):
    return "%g W" % watts


def low_power_devices(devices, full_cap_w):
    """Judge each device's power cap against ``full_cap_w`` (400 on a P800).

    Returns (low, unknown): ``low`` lists {index, serial, bus_id, power_cap_w, label} of
    the devices capped below ``full_cap_w``; ``unknown`` lists the same fields of the
    devices whose cap xpu-smi did not give (N/A, ERR!, missing). ``label`` is
    ``card_label``. A cap at or above the full cap is fine; the comparison is exact
    (``399 W`` is below ``400``).
    """
    low, unknown = [], []
    for dev in devices:
        entry = {
            "index": dev.get("index"),
            "serial": dev.get("serial"),
            "bus_id": dev.get("bus_id"),
            "power_cap_w": dev.get("power_cap_w"),
            "label": card_label(dev),
        }
        if entry["power_cap_w"] is None:
            unknown.append(entry)
        elif entry["power_cap_w"] < full_cap_w:
            low.append(entry)
    return low, unknown


def low_power_message(low, full_cap_w, device_count=None):
    """What ``low_power_devices`` found, with the fix, as one paragraph (None when none).

    Names every card by index and serial (bus id without one) and its cap. The fix says
    what is known: the vendor's tool sets a card's power limit; its exact flags are not
    given here, so none are invented.
    """
    if not low:
        return None
    parts = ["%s at %s" % (card_label(d), _watts_text(d["power_cap_w"])) for d in low]
    of = (" of %d" % device_count) if device_count else ""
    one = len(low) == 1
    noun = "card" if one and not device_count else "cards"
    return (
        "%d%s %s %s capped below the full %s: %s. A P800 gives 345 TFLOPS FP16 at 400 W "
        "and 128 TFLOPS in its 120 W low-power mode: the host would miss its throughput "
        "targets. Fix: set %s back to %s with the vendor's tool (xpu-smi) and re-run."
        % (
            len(low),
            of,
            noun,
            "is" if one else "are",
            _watts_text(full_cap_w),
            ", ".join(parts),
            "the card's power limit" if one else "each card's power limit",
            _watts_text(full_cap_w),
        )
    )
