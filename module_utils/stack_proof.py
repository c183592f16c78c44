# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prove the validated combination from inside a serving image.

Two halves:

- PROBE_SOURCE: a standard-library-only Python program run by the image's own interpreter
  (``<venv>/bin/python -c PROBE_SOURCE '<json request>'``). It reads what the image really
  holds (importlib.metadata versions, torch.__version__, the accelerators torch_xmlir
  counts, where vllm_kunlun is loaded from, whether its _kunlun extension imports) and
  prints one JSON line. It never consults torch.xpu (an Intel stub that always says 0).
- judge(): compares such a report with the pins and the known-bad combinations (through
  module_utils/kunlun_stack.py, the checker preflight uses) and returns table rows.

Standard library only (Python 3.8+ on the host; the probe itself runs with the image's
Python).
"""

from __future__ import absolute_import, division, print_function

import json

__metaclass__ = type

# Marker in front of the probe's JSON line, so output an import prints is ignored.
PROBE_MARKER = "KUNLUN_STACK_PROOF "

PROBE_SOURCE = r'''
import json, os, platform, sys, sysconfig, site
MARK = "KUNLUN_STACK_PROOF "
req = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
# The current directory must not shadow an installed package (python -c puts it first).
sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
out = {"python": platform.python_version(), "executable": sys.executable,
       "prefix": sys.prefix, "versions": {}, "errors": {}}

def err(key, exc):
    out["errors"][key] = "%s: %s" % (type(exc).__name__, exc)

try:
    import importlib.metadata as md
except Exception as exc:
    md = None
    err("importlib.metadata", exc)
for name in req.get("distributions", []):
    found = None
    for cand in (name, name.replace("_", "-"), name.replace("-", "_")):
        try:
            found = md.version(cand)
            break
        except Exception:
            continue
    out["versions"][name] = found
dirs = set()
for getter in (lambda: site.getsitepackages(),
               lambda: [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
    try:
        dirs.update(os.path.realpath(d) for d in getter())
    except Exception:
        pass
out["site_packages"] = sorted(dirs)
try:
    import torch
    out["torch_version"] = str(torch.__version__)
except Exception as exc:
    err("torch", exc)
try:
    import torch_xmlir
    out["devices"] = int(torch_xmlir._XMLIRC._xpu_get_devices_number())
except Exception as exc:
    err("torch_xmlir", exc)
try:
    import vllm_kunlun
    path = os.path.realpath(vllm_kunlun.__file__)
    out["vllm_kunlun_file"] = path
    out["vllm_kunlun_in_site_packages"] = any(path.startswith(d + os.sep) for d in dirs)
    out["vllm_kunlun_commit"] = getattr(vllm_kunlun, "__commit__", None)
except Exception as exc:
    err("vllm_kunlun", exc)
try:
    from vllm_kunlun import _kunlun
    out["kunlun_extension"] = os.path.realpath(getattr(_kunlun, "__file__", "") or "")
except Exception as exc:
    err("vllm_kunlun._kunlun", exc)
sys.stdout.write("\n" + MARK + json.dumps(out, sort_keys=True) + "\n")
'''


def probe_request(components):
    """The JSON argument of the probe: the distributions whose versions to read."""
    names = [name for name, entry in sorted((components or {}).items())
             if name != "python" and isinstance(entry, dict) and entry.get("version")]
    return json.dumps({"distributions": names}, sort_keys=True)


def parse_probe_output(stdout):
    """The probe's report from its stdout; raises ValueError when there is none."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(PROBE_MARKER):
            return json.loads(line[len(PROBE_MARKER):])
    raise ValueError("the probe printed no report line (%r)" % (stdout or "")[-300:])


def _row(component, expected, found, ok):
    return {"component": component, "expected": str(expected), "found": str(found), "ok": bool(ok)}


def _minor(version):
    return ".".join(str(version or "").split(".")[:2])


def found_versions(report):
    """{component: version} as found in the image, for the known-bad checker."""
    versions = {}
    for name, version in (report.get("versions") or {}).items():
        versions[name] = version or ""
    if report.get("vllm_kunlun_commit"):
        versions["vllm_kunlun_commit"] = str(report["vllm_kunlun_commit"])
    versions["python"] = report.get("python") or ""
    return versions


def judge(report, components, device_count, python_match="exact", known_bad_problems=None):
    """Rows {component, expected, found, ok} for every check of the report.

    `components` are the pins (kunlun_stack_components); `known_bad_problems` the result
    of kunlun_stack.check_known_bad on found_versions(report) (Problem objects or dicts).
    `python_match`: "exact" compares the interpreter with the python pin as written,
    "minor" only its major.minor (the ABI the cp310 wheels need).
    """
    errors = report.get("errors") or {}
    rows = []
    python_pin = (components.get("python") or {}).get("version") if isinstance(components.get("python"), dict) else None
    if python_pin:
        found = report.get("python") or "(unknown)"
        if python_match == "minor":
            ok = _minor(found) == _minor(python_pin)
            expected = "%s (major.minor %s)" % (python_pin, _minor(python_pin))
        else:
            ok = found == str(python_pin)
            expected = str(python_pin)
        rows.append(_row("python", expected, "%s (%s)" % (found, report.get("executable", "?")), ok))

    versions = report.get("versions") or {}
    for name, entry in sorted(components.items()):
        if name == "python" or not isinstance(entry, dict) or not entry.get("version"):
            continue
        found = versions.get(name)
        rows.append(_row(name, entry["version"], found or "(not installed)", found == str(entry["version"])))

    torch_pin = (components.get("torch") or {}).get("version")
    if torch_pin:
        found = report.get("torch_version")
        rows.append(_row("torch.__version__", torch_pin,
                         found if found is not None else "(import failed: %s)" % errors.get("torch", "?"),
                         found == str(torch_pin)))

    found = report.get("devices")
    rows.append(_row("torch_xmlir._XMLIRC._xpu_get_devices_number()", device_count,
                     found if found is not None else "(failed: %s)" % errors.get("torch_xmlir", "?"),
                     found is not None and int(found) == int(device_count)))

    path = report.get("vllm_kunlun_file")
    if path is None:
        rows.append(_row("vllm_kunlun.__file__", "in site-packages",
                         "(import failed: %s)" % errors.get("vllm_kunlun", "?"), False))
    else:
        rows.append(_row("vllm_kunlun.__file__", "in site-packages", path,
                         bool(report.get("vllm_kunlun_in_site_packages"))))

    ext = report.get("kunlun_extension")
    rows.append(_row("from vllm_kunlun import _kunlun", "imports",
                     "imports (%s)" % ext if ext is not None else "(failed: %s)" % errors.get("vllm_kunlun._kunlun", "?"),
                     ext is not None))

    commit_pin = (components.get("vllm_kunlun") or {}).get("commit")
    commit = report.get("vllm_kunlun_commit")
    if commit_pin and commit:
        rows.append(_row("vllm_kunlun commit", commit_pin, commit, str(commit) == str(commit_pin)))

    for problem in known_bad_problems or []:
        data = problem.as_dict() if hasattr(problem, "as_dict") else dict(problem)
        rows.append(_row("known-bad combination", "absent", data.get("found", ""), False))
    return rows


def format_table(rows):
    """Plain-text table `component | expected | found` of the given rows."""
    head = ("component", "expected", "found")
    body = [(r["component"], r["expected"], r["found"]) for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(2)]
    lines = ["%-*s | %-*s | %s" % (widths[0], a, widths[1], b, c) for a, b, c in [head] + body]
    lines.insert(1, "-" * min(160, max(len(line) for line in lines)))
    return "\n".join(lines)
