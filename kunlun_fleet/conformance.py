"""kunlun-fleet conformance DIR: the product's own parsers over the raw outputs that
`kunlun-fleet status --collect DIR` saved (DIR/<host>/<file> and DIR/<host>/index.json).

Per host and per file one verdict:
  ok          the parser read it, and it yields every field the sim kit's output of the same
              command yields (tests/fixtures/conformance/sim/kf-node-1/, the reference);
  missing     the command is not installed or the file does not exist on the host (recorded
              by the collection; not a failure);
  unreadable  the command failed, or the parser raised or returned nothing usable (the reason);
  differs     the parser read it, but the parsed structure lacks fields the reference yields.
The parsers are imported from module_utils/ and library/ as the unit tests import them
(tests/conftest.py): module_utils as ansible.module_utils.<name>, library/ on sys.path.

Exit codes: 0 every file ok or missing; 2 a file unreadable or differing (or a host not
collected); 3 bad input (no DIR, no DIR/<host>/index.json, an index that is not JSON, an
index entry or a file that leads out of DIR: a name with ../ or /, an absolute path, a link).
"""

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "fixtures" / "conformance" / "sim" / "kf-node-1"
OK, FAILED, REFUSED = 0, 2, 3
VERDICTS = ("ok", "missing", "unreadable", "differs")
# Exit statuses a command may end with and still have told the product something (what the
# product's modules accept): findmnt 1 = nothing mounted there, blkid 2 = no signature.
QUIET_EXITS = {"findmnt.json": (1,), "blkid.txt": (2,)}


def _parsers():
    """The product's parser modules, importable as Ansible (and tests/conftest.py) make them."""
    import ansible.module_utils

    if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
    if str(ROOT / "library") not in sys.path:
        sys.path.insert(0, str(ROOT / "library"))
    from ansible.module_utils import xpu_smi
    import data_disk_info
    import engine_state
    import host_status
    import volume_info

    return {
        "xpu_smi": xpu_smi,
        "data_disk_info": data_disk_info,
        "engine_state": engine_state,
        "host_status": host_status,
        "volume_info": volume_info,
    }


class Unusable(Exception):
    """The parser returned nothing the product can use."""


class _Module(object):
    """Stands in for AnsibleModule where a parser lives inside a module's reader: every
    tool is found, and running it prints the collected text."""

    def __init__(self, text):
        self.text = text

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/" + name

    def run_command(self, argv, **kwargs):
        return 0, self.text, ""


def _known(value):
    return value not in (None, "", [], {})


def _keys(prefix, record):
    return set("%s%s" % (prefix, k) for k, v in record.items() if _known(v))


def _records(prefix, records):
    fields = set()
    for record in records:
        fields |= _keys(prefix, record)
    return fields


# Each reader: (text, index) -> the set of fields parsed, or raises (Unusable for "nothing").
def read_table(p, text, index):
    table = p["xpu_smi"].parse_table(text)
    if not table.get("devices"):
        raise Unusable("parse_table found no device")
    fields = _keys("", dict((k, v) for k, v in table.items() if k not in ("devices", "processes")))
    return fields | _records("device.", table["devices"])


def read_query(p, text, index):
    query = p["xpu_smi"].parse_query(text)
    if not query.get("devices"):
        raise Unusable("parse_query found no device")
    return _keys("", dict((k, v) for k, v in query.items() if k != "devices")) | _records("device.", query["devices"])


def read_list(p, text, index):
    listing = p["xpu_smi"].parse_list(text)
    if not listing:
        raise Unusable("parse_list found no 'XPU <n>: ...' line")
    return _records("", listing)


def read_lspci(p, text, index):
    functions = p["xpu_smi"].parse_lspci(text)
    if not functions:
        raise Unusable(
            "parse_lspci found no P800 function (vendor %s, device %s)"
            % ("/".join(p["xpu_smi"].KUNLUN_PCI_VENDORS), "/".join(p["xpu_smi"].P800_PCI_DEVICES))
        )
    return _records("", functions)


def read_lsmod(p, text, index):
    modules = p["xpu_smi"].parse_lsmod(text)
    if not modules:
        raise Unusable("parse_lsmod found no module")
    return _records("module.", modules.values())


def read_proc_version(p, text, index):
    if not p["xpu_smi"].parse_proc_version(text):
        raise Unusable("parse_proc_version found no dotted version")
    return {"version"}


def read_proc_state(p, text, index):
    state, raw = p["xpu_smi"].device_state(text)
    if not raw:
        raise Unusable("device_state read an empty state")
    return {"state"}


def read_findmnt(p, text, index):
    mount = p["volume_info"].parse_findmnt_json(text)
    if not mount:
        raise Unusable("parse_findmnt_json found no filesystem (not findmnt -J output?)")
    return _keys("", mount)


def read_blkid(p, text, index):
    found = p["volume_info"].parse_blkid_export(text)
    if not found:
        raise Unusable("parse_blkid_export found no KEY=value line")
    # The keys the product reads (volume_info, data_disk_info, carry_over).
    return set(k for k in ("UUID", "TYPE", "PTTYPE") if _known(found.get(k)))


def read_lsblk(p, text, index):
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines:
        raise Unusable("no device line")
    bad = [" ".join(parts) for parts in lines if len(parts) != 2]
    if bad:
        raise Unusable("lines that are not 'NAME TYPE': %s" % "; ".join(bad[:3]))
    reader = p["data_disk_info"].DiskReader(_Module(text))
    reader.partitions("/dev/collected")  # data_disk_info's own reading of the same lines
    return {"name", "type"}


def read_docker_info(p, text, index):
    info = p["engine_state"].running_engine(_Module(text), 30)
    if not info:
        raise Unusable("running_engine read no JSON object (not docker info --format '{{json .}}' output?)")
    return set(k for k in ("Driver", "DockerRootDir", "Images", "Containers") if k in info and info[k] is not None)


def read_os_release(p, text, index):
    info = p["host_status"].parse_os_release(text)
    if not info:
        raise Unusable("parse_os_release found no KEY=value line")
    return set(k for k in ("PRETTY_NAME", "NAME", "VERSION_ID", "ID") if _known(info.get(k)))


def read_mountinfo(p, text, index):
    mount_point = index.get("mount_point") or "/home"
    top = p["host_status"].parse_mountinfo(text, mount_point)
    if not top:
        raise Unusable("parse_mountinfo found nothing mounted at %s" % mount_point)
    return _keys("", top)


READERS = (
    (r"^xpu-smi\.txt$", read_table),
    (r"^xpu-smi-q\.txt$", read_query),
    (r"^xpu-smi-L\.txt$", read_list),
    (r"^lspci-Dnn?\.txt$", read_lspci),
    (r"^(lsmod|proc_modules)\.txt$", read_lsmod),
    (r"^proc_kunlun_version\.txt$", read_proc_version),
    (r"^proc_xpu_dev\d+_state\.txt$", read_proc_state),
    (r"^findmnt\.json$", read_findmnt),
    (r"^blkid\.txt$", read_blkid),
    (r"^lsblk\.txt$", read_lsblk),
    (r"^docker-info\.json$", read_docker_info),
    (r"^os-release\.txt$", read_os_release),
    (r"^proc_self_mountinfo\.txt$", read_mountinfo),
)


def reader_of(name):
    for pattern, reader in READERS:
        if re.match(pattern, name):
            return reader
    return None


def reference_name(name):
    """The reference file for a collected one (one /proc/xpu/devN/state stands for all)."""
    return re.sub(r"^proc_xpu_dev\d+_state", "proc_xpu_dev0_state", name)


class BadInput(Exception):
    pass


# The fix for a collection that names something outside itself.
COLLECT_AGAIN = "Fix: collect it again with `kunlun-fleet status --collect DIR` (it writes plain files only)"


def _linked(path, what):
    """Refuses a link where the collection has a plain file or directory: reading through it
    would read what it points at, outside DIR."""
    if path.is_symlink():
        raise BadInput(
            "%s %s is a link (to %s), not a %s of the collection. %s"
            % (what, path, os.readlink(path), what, COLLECT_AGAIN)
        )


def host_dirs(directory):
    """[(host, dir)] under DIR (or DIR itself when it is one host's collection)."""
    base = Path(directory)
    if not base.is_dir():
        raise BadInput("no directory %s (give the DIR of `kunlun-fleet status --collect DIR`)" % directory)
    if (base / "index.json").is_file():
        _linked(base / "index.json", "file")
        return [(base.name, base)]
    found = sorted((d.name, d) for d in base.iterdir() if d.is_dir() and (d / "index.json").is_file())
    for _name, d in found:
        _linked(d, "directory")
        _linked(d / "index.json", "file")
    if not found:
        raise BadInput(
            "no %s/<host>/index.json: not a directory written by `kunlun-fleet status --collect`" % directory
        )
    return found


def load_index(host_dir):
    try:
        index = json.loads((Path(host_dir) / "index.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadInput("%s/index.json is unreadable: %s" % (host_dir, exc)) from exc
    if not isinstance(index, dict) or not isinstance(index.get("commands"), list):
        raise BadInput("%s/index.json has no list of commands" % host_dir)
    return index


_reference_cache = {}


def reference_fields(p, name, reference_dir):
    """The fields the sim kit's output of the same command yields (None: no reference)."""
    key = (str(reference_dir), name)
    if key not in _reference_cache:
        path = Path(reference_dir) / reference_name(name)
        fields = None
        reader = reader_of(name)
        if reader and path.is_file():
            try:
                ref_index = json.loads((Path(reference_dir) / "index.json").read_text())
            except (OSError, ValueError):
                ref_index = {}
            try:
                fields = reader(p, path.read_text(errors="replace"), ref_index)
            except Exception:  # a broken reference compares with nothing
                fields = None
        _reference_cache[key] = fields
    return _reference_cache[key]


def entry_path(host_dir, entry):
    """The file an index entry names: a plain file of the host's directory. A name that
    leaves it (a path with ../ or /, an absolute path) or a link is refused (BadInput)."""
    name = entry.get("file")
    path = Path(host_dir) / str(name)
    if not isinstance(name, str) or name in (".", "..") or "/" in name or "\\" in name:
        raise BadInput(
            "%s/index.json: the entry of %r names the file %r, which is not a file of %s (a path that leaves the "
            "host's directory). %s" % (host_dir, entry.get("command"), name, host_dir, COLLECT_AGAIN)
        )
    _linked(path, "file")
    return path


def check_file(p, host_dir, entry, index, reference_dir):
    """{file, command, verdict, reason, lacks} for one entry of a host's index."""
    name = entry.get("file") or ""
    out = {"file": name or None, "command": entry.get("command"), "verdict": "ok", "reason": "", "lacks": []}
    if entry.get("missing"):
        out.update(verdict="missing", reason=entry.get("reason") or "missing on the host")
        return out
    if not name:
        out.update(verdict="unreadable", reason="the index names no file for it")
        return out
    path = entry_path(host_dir, entry)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        out.update(verdict="unreadable", reason="%s: %s" % (path, exc.strerror or exc))
        return out
    rc = entry.get("rc")
    if rc not in (0, None):
        if rc in QUIET_EXITS.get(name, ()) and not text.strip():
            out["reason"] = "exited %d with nothing to read (the product takes that as 'none')" % rc
            return out
        said = (entry.get("stderr") or text).strip().splitlines()
        out.update(verdict="unreadable", reason="exited %s: %s" % (rc, said[0][:200] if said else "no output"))
        return out
    reader = reader_of(name)
    if reader is None:
        out["reason"] = "kept as is: no parser of the product reads it"
        return out
    try:
        fields = reader(p, text, index)
    except Unusable as exc:
        out.update(verdict="unreadable", reason=str(exc))
        return out
    except Exception as exc:  # the parser raised: that is the finding
        out.update(verdict="unreadable", reason="the parser raised %s: %s" % (type(exc).__name__, exc))
        return out
    expected = reference_fields(p, name, reference_dir)
    if expected is None:
        out["reason"] = "parsed; no sim reference to compare with"
        return out
    lacks = sorted(expected - fields)
    if lacks:
        out.update(
            verdict="differs",
            lacks=lacks,
            reason="parsed, but lacks what the sim kit's output yields: %s" % ", ".join(lacks),
        )
    return out


def check(directory, reference_dir=REFERENCE):
    """The conformance document: {dir, hosts: {host: {files: [...], error}}, counts, exit_code}.
    Raises BadInput."""
    p = _parsers()
    doc = {"dir": str(directory), "reference": str(reference_dir), "hosts": {}}
    counts = dict((v, 0) for v in VERDICTS)
    not_collected = 0
    for host, host_dir in host_dirs(directory):
        index = load_index(host_dir)
        files = [check_file(p, host_dir, e, index, reference_dir) for e in index["commands"] if isinstance(e, dict)]
        error = index.get("error") if not files else None
        if error:
            not_collected += 1
        for f in files:
            counts[f["verdict"]] += 1
        doc["hosts"][host] = {"files": files, "error": error}
    doc["counts"] = counts
    doc["exit_code"] = FAILED if (counts["unreadable"] or counts["differs"] or not_collected) else OK
    return doc


def render(doc):
    lines = []
    for host, h in doc["hosts"].items():
        lines.append("%s" % host)
        if h["error"]:
            lines.append("  not collected: %s" % h["error"])
        width = max([len(f["file"] or f["command"] or "") for f in h["files"]] + [4])
        for f in h["files"]:
            label = f["file"] or f["command"] or "?"
            lines.append(("  %s  %-10s %s" % (label.ljust(width), f["verdict"], f["reason"])).rstrip())
    c = doc["counts"]
    lines.append("")
    lines.append(
        "%d host(s): %d ok, %d missing, %d unreadable, %d differs (exit %d)"
        % (len(doc["hosts"]), c["ok"], c["missing"], c["unreadable"], c["differs"], doc["exit_code"])
    )
    if doc["exit_code"]:
        lines.append(
            "send DIR to the project; each unreadable or differing file is a new unit-test fixture "
            "(docs/cli.md, 'conformance')"
        )
    return "\n".join(lines) + "\n"


def run(directory, as_json=False, out=None, reference_dir=REFERENCE):
    out = out or sys.stdout
    try:
        doc = check(directory, reference_dir)
    except BadInput as exc:
        sys.stderr.write("kunlun-fleet conformance: %s\n" % exc)
        if as_json:
            out.write(json.dumps({"dir": str(directory), "error": str(exc), "exit_code": REFUSED}, indent=2) + "\n")
        return REFUSED
    out.write(json.dumps(doc, indent=2) + "\n" if as_json else render(doc))
    return doc["exit_code"]
