# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prove the validated combination from inside a serving image.

Two halves:

- PROBE_SOURCE: a standard-library-only Python program run by the image's own interpreter
  (``<venv>/bin/python -c PROBE_SOURCE '<json request>'``). It reads what the image really
  holds (importlib.metadata versions, torch.__version__, the accelerators torch_xmlir
  counts, where vllm_kunlun is loaded from, whether its _kunlun extension imports) and
  what vllm-kunlun runs on: torch in CUDA-compatible mode (torch.cuda.is_available(),
  torch.cuda.device_count(), a small tensor made on cuda:0 and read back, device 0's
  total_memory) and the platform class vllm-kunlun registers (its `vllm.platform_plugins`
  entry point, resolved as vLLM resolves it: device_name, dispatch_key, dist_backend) and,
  when asked, the quantization method serving uses as vLLM loads it (its general plugins
  loaded, then get_quantization_config of vllm's quantization module, which the image build
  may have replaced with vllm-kunlun's). It prints one JSON line. It never consults
  torch.xpu (an Intel stub that always says 0) nor the platform's is_cuda() (vllm-kunlun's
  platform returns False from it, also in a working stack).
- judge(): compares such a report with the pins and the known-bad combinations (through
  module_utils/kunlun_stack.py, the checker preflight uses) and returns table rows, each
  naming the layer it proves: driver (the accelerators the runtime can open), torch
  (xpytorch's CUDA-compatible mode), plugin (vllm-kunlun and its platform), image (the
  pinned versions).

Standard library only (Python 3.8+ on the host; the probe itself runs with the image's
Python).
"""

from __future__ import absolute_import, division, print_function

import json

__metaclass__ = type

# Marker in front of the probe's JSON line, so output an import prints is ignored.
PROBE_MARKER = "KUNLUN_STACK_PROOF "

PROBE_SOURCE = r"""
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
# torch in CUDA-compatible mode: the accelerators are torch.cuda devices.
cuda = out["cuda"] = {}
if "torch_version" in out:
    try:
        cuda["available"] = bool(torch.cuda.is_available())
    except Exception as exc:
        err("torch.cuda.is_available", exc)
    try:
        cuda["device_count"] = int(torch.cuda.device_count())
    except Exception as exc:
        err("torch.cuda.device_count", exc)
    try:
        t = torch.arange(4, device="cuda:0")
        cuda["tensor_device"] = str(t.device)
        cuda["tensor"] = [int(v) for v in t.cpu().tolist()]
        cuda["tensor_ok"] = cuda["tensor"] == [0, 1, 2, 3] and cuda["tensor_device"] == "cuda:0"
    except Exception as exc:
        cuda["tensor_ok"] = False
        err("torch.cuda.tensor", exc)
    try:
        props = torch.cuda.get_device_properties(0)
        cuda["total_memory_bytes"] = int(props.total_memory)
        cuda["device_name"] = str(getattr(props, "name", ""))
    except Exception as exc:
        err("torch.cuda.get_device_properties", exc)
# The platform vLLM will run on: the vllm.platform_plugins entry points called, the one
# class named imported (vllm/platforms/__init__.py), read from an instance like
# vllm's current_platform.
plat = out["platform"] = {}
try:
    import importlib
    eps = md.entry_points()
    group = eps.select(group="vllm.platform_plugins") if hasattr(eps, "select") \
        else eps.get("vllm.platform_plugins", [])
    named = []
    for ep in group:
        qualname = ep.load()()
        if qualname:
            named.append((ep.name, qualname))
    if not named:
        raise LookupError("no vllm.platform_plugins entry point names a platform class")
    if len(named) > 1:
        raise RuntimeError("Only one platform plugin can be activated, but got: %s" % named)
    plat["plugin"], plat["class"] = named[0]
    mod_name, _, cls_name = plat["class"].rpartition(".")
    inst = getattr(importlib.import_module(mod_name), cls_name)()
    for key in ("device_name", "device_type", "dispatch_key", "dist_backend"):
        value = getattr(inst, key, None)
        plat[key] = value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)
except Exception as exc:
    err("platform", exc)
# The quantization method the server is started with, as vLLM loads it: the general plugins
# first (where an out-of-tree method registers), then vllm's quantization module.
method = req.get("quantization")
if method:
    quant = out["quantization"] = {"method": method}
    try:
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        quant["general_plugins"] = True
    except Exception as exc:
        err("vllm.general_plugins", exc)
    try:
        import vllm.model_executor.layers.quantization as vq
        quant["module"] = os.path.realpath(getattr(vq, "__file__", "") or "")
        quant["listed"] = method in list(getattr(vq, "QUANTIZATION_METHODS", None) or [])
        cfg = vq.get_quantization_config(method)
        quant["config"] = ("%s.%s" % (cfg.__module__, cfg.__qualname__)) if isinstance(cfg, type) else str(cfg)
    except Exception as exc:
        err("quantization", exc)
sys.stdout.write("\n" + MARK + json.dumps(out, sort_keys=True) + "\n")
"""


def probe_request(components, quantization=None):
    """The JSON argument of the probe: the distributions whose versions to read, and the
    quantization method to load (serving's --quantization; none: not probed)."""
    names = [
        name
        for name, entry in sorted((components or {}).items())
        if name != "python" and isinstance(entry, dict) and entry.get("version")
    ]
    request = {"distributions": names}
    if quantization:
        request["quantization"] = str(quantization)
    return json.dumps(request, sort_keys=True)


def parse_probe_output(stdout):
    """The probe's report from its stdout; raises ValueError when there is none."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(PROBE_MARKER):
            return json.loads(line[len(PROBE_MARKER) :])
    raise ValueError("the probe printed no report line (%r)" % (stdout or "")[-300:])


# The layers a check proves, lowest first: a broken lower layer breaks the ones above it.
LAYERS = ("driver", "torch", "plugin", "image")
LAYER_FIX = {
    "driver": "the accelerators are not all usable: check the driver on this host (xpu-smi, lsmod | grep kunlun, "
    "the /dev/xpuN nodes; playbooks/driver.yml verifies every card) and XPU_VISIBLE_DEVICES",
    "torch": "torch in the image does not drive the accelerators as CUDA devices (xpytorch's CUDA-compatible "
    "mode): rebuild the image from the pinned torch .run with playbooks/image.yml",
    "plugin": "vllm-kunlun's platform is not what vLLM needs (its vllm.platform_plugins class, its _kunlun "
    "extension, site-packages, the quantization method serving uses): rebuild the image from the pinned "
    "vllm-kunlun tarball with playbooks/image.yml (its build log says which quantization module it "
    "installed), or serve with a --quantization the stack provides",
    "image": "rebuild the image from the pins with playbooks/image.yml",
}
# What vLLM must see on the platform vllm-kunlun registers (CUDA-compatible mode). Its
# dispatch_key is read and shown, not compared: the public 0.15.1-era KunlunPlatform does
# not set it, so it is vLLM's Platform default "CPU" there (docs/target.md).
PLATFORM_FIELDS = {"device_name": "cuda", "dist_backend": "nccl"}
# torch.cuda.get_device_properties(i).total_memory of a P800 (96 GB HBM), in GiB.
MEMORY_GIB = (80.0, 100.0)
GIB = 1024**3


def _row(component, expected, found, ok, layer="image"):
    return {"component": component, "expected": str(expected), "found": str(found), "ok": bool(ok), "layer": layer}


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


def _gib(nbytes):
    return "%.1f GiB" % (float(nbytes) / GIB)


def _failed(errors, key, what="failed"):
    return "(%s: %s)" % (what, errors.get(key, "?"))


def cuda_rows(report, device_count, memory_gib=MEMORY_GIB):
    """The rows of torch's CUDA-compatible mode. A failure is the driver's when the runtime
    sees no accelerator at all (torch_xmlir counts 0) or torch.cuda counts what torch_xmlir
    counts (both short: the devices are missing below torch), else torch's."""
    errors = report.get("errors") or {}
    cuda = report.get("cuda") or {}
    xmlir = report.get("devices")
    count = cuda.get("device_count")
    # torch_loaded: the probe got to ask torch.cuda (a report without "cuda" never asked).
    torch_loaded = report.get("torch_version") is not None and "cuda" in report
    not_probed = "(not probed)" if "cuda" not in report else _failed(errors, "torch", "torch import failed")
    none_visible = xmlir == 0 or (xmlir is None and count == 0)
    below = "driver" if none_visible else "torch"
    rows = []

    available = cuda.get("available")
    rows.append(
        _row(
            "torch.cuda.is_available()",
            True,
            available
            if available is not None
            else (_failed(errors, "torch.cuda.is_available") if torch_loaded else not_probed),
            available is True,
            below,
        )
    )

    if count is None:
        rows.append(
            _row(
                "torch.cuda.device_count()",
                device_count,
                _failed(errors, "torch.cuda.device_count") if torch_loaded else not_probed,
                False,
                "torch",
            )
        )
    else:
        layer = "driver" if xmlir is None or int(xmlir) == int(count) else "torch"
        found = count if xmlir is None or int(xmlir) == int(count) else "%s (torch_xmlir counts %s)" % (count, xmlir)
        rows.append(_row("torch.cuda.device_count()", device_count, found, int(count) == int(device_count), layer))

    if "tensor" in cuda:
        found = "%s on %s" % (cuda.get("tensor"), cuda.get("tensor_device"))
    else:
        found = _failed(errors, "torch.cuda.tensor") if torch_loaded else not_probed
    rows.append(
        _row('torch.arange(4, device="cuda:0")', "[0, 1, 2, 3] on cuda:0", found, bool(cuda.get("tensor_ok")), below)
    )

    low, high = float(memory_gib[0]), float(memory_gib[1])
    nbytes = cuda.get("total_memory_bytes")
    expected = "%g-%g GiB" % (low, high)
    if nbytes is None:
        rows.append(
            _row(
                "torch.cuda.get_device_properties(0).total_memory",
                expected,
                _failed(errors, "torch.cuda.get_device_properties") if torch_loaded else not_probed,
                False,
                below,
            )
        )
    else:
        name = cuda.get("device_name")
        rows.append(
            _row(
                "torch.cuda.get_device_properties(0).total_memory",
                expected,
                "%s (%d bytes%s)" % (_gib(nbytes), int(nbytes), ", " + name if name else ""),
                low * GIB <= int(nbytes) <= high * GIB,
                below,
            )
        )
    return rows


def platform_rows(report, fields=None):
    """The rows of the platform class vllm-kunlun registers (layer plugin)."""
    errors = report.get("errors") or {}
    plat = report.get("platform") or {}
    fields = dict(PLATFORM_FIELDS if fields is None else fields)
    cls = plat.get("class")
    if cls is None or "platform" in errors:
        found = _failed(errors, "platform") if "platform" in errors else "(not probed)"
        if cls is not None:
            found = "%s %s" % (cls, found)
        return [_row("vllm.platform_plugins class", "vllm_kunlun.*", found, False, "plugin")]
    rows = [
        _row(
            "vllm.platform_plugins class",
            "vllm_kunlun.*",
            "%s (%s)" % (cls, plat.get("plugin")),
            str(cls).startswith("vllm_kunlun."),
            "plugin",
        )
    ]
    for key in sorted(fields):
        rows.append(_row("platform.%s" % key, fields[key], plat.get(key), plat.get(key) == fields[key], "plugin"))
    return rows


def quantization_rows(report, method):
    """The rows of the quantization method serving uses (layer plugin): vllm's general
    plugins load and get_quantization_config(method) answers for a listed method."""
    errors = report.get("errors") or {}
    quant = report.get("quantization")
    if quant is None:
        return [_row("vllm quantization %s" % method, "loads", "(not probed)", False, "plugin")]
    rows = [
        _row(
            "vllm.general_plugins",
            "load",
            "loaded" if quant.get("general_plugins") else _failed(errors, "vllm.general_plugins"),
            bool(quant.get("general_plugins")),
            "plugin",
        )
    ]
    if "config" in quant:
        found = "%s (%s)" % (quant["config"], quant.get("module"))
        if not quant.get("listed"):
            found += ", not in QUANTIZATION_METHODS"
    else:
        found = _failed(errors, "quantization")
    rows.append(
        _row(
            "vllm quantization %s" % method,
            "get_quantization_config() loads it",
            found,
            "config" in quant and bool(quant.get("listed")),
            "plugin",
        )
    )
    return rows


def judge(
    report,
    components,
    device_count,
    python_match="exact",
    known_bad_problems=None,
    memory_gib=MEMORY_GIB,
    platform_fields=None,
    quantization=None,
):
    """Rows {component, expected, found, ok, layer} for every check of the report.

    `components` are the pins (kunlun_stack_components); `known_bad_problems` the result
    of kunlun_stack.check_known_bad on found_versions(report) (Problem objects or dicts).
    `python_match`: "exact" compares the interpreter with the python pin as written,
    "minor" only its major.minor (the ABI the cp310 wheels need). `memory_gib`: the range
    (low, high) device 0's total_memory must be in; `platform_fields`: what the platform
    class must say (default PLATFORM_FIELDS); `quantization`: the method serving uses, which
    must load (probe_request asked for it). A component built from a source tree (a pin with
    `source`) is its commit: its installed version is shown, not compared (the public tree
    declares v1.0 / 0.11.0 where the notes say 0.15.1.dev0, docs/bundle.md).
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
        if entry.get("source"):
            rows.append(
                _row(
                    name,
                    "installed (%s: its declared version, not compared)" % entry["version"],
                    found or "(not installed)",
                    bool(found),
                )
            )
            continue
        rows.append(_row(name, entry["version"], found or "(not installed)", found == str(entry["version"])))

    torch_pin = (components.get("torch") or {}).get("version")
    if torch_pin:
        found = report.get("torch_version")
        rows.append(
            _row(
                "torch.__version__",
                torch_pin,
                found if found is not None else "(import failed: %s)" % errors.get("torch", "?"),
                found == str(torch_pin),
                "torch",
            )
        )

    found = report.get("devices")
    rows.append(
        _row(
            "torch_xmlir._XMLIRC._xpu_get_devices_number()",
            device_count,
            found if found is not None else "(failed: %s)" % errors.get("torch_xmlir", "?"),
            found is not None and int(found) == int(device_count),
            "driver",
        )
    )

    rows += cuda_rows(report, device_count, memory_gib)

    path = report.get("vllm_kunlun_file")
    if path is None:
        rows.append(
            _row(
                "vllm_kunlun.__file__",
                "in site-packages",
                "(import failed: %s)" % errors.get("vllm_kunlun", "?"),
                False,
                "plugin",
            )
        )
    else:
        rows.append(
            _row(
                "vllm_kunlun.__file__",
                "in site-packages",
                path,
                bool(report.get("vllm_kunlun_in_site_packages")),
                "plugin",
            )
        )

    ext = report.get("kunlun_extension")
    rows.append(
        _row(
            "from vllm_kunlun import _kunlun",
            "imports",
            "imports (%s)" % ext if ext is not None else "(failed: %s)" % errors.get("vllm_kunlun._kunlun", "?"),
            ext is not None,
            "plugin",
        )
    )

    rows += platform_rows(report, platform_fields)
    if quantization:
        rows += quantization_rows(report, quantization)

    commit_pin = (components.get("vllm_kunlun") or {}).get("commit")
    commit = report.get("vllm_kunlun_commit")
    if commit_pin and commit:
        rows.append(_row("vllm_kunlun commit", commit_pin, commit, str(commit) == str(commit_pin), "plugin"))

    for problem in known_bad_problems or []:
        data = problem.as_dict() if hasattr(problem, "as_dict") else dict(problem)
        rows.append(_row("known-bad combination", "absent", data.get("found", ""), False))
    return rows


def broken_layers(rows):
    """The layers of the failed rows, lowest first."""
    failed = set(r.get("layer", "image") for r in rows if not r["ok"])
    return [layer for layer in LAYERS if layer in failed]


def findings(report):
    """(cuda, platform): the probe's torch.cuda and platform findings, as the module returns them."""
    cuda = report.get("cuda") or {}
    plat = report.get("platform") or {}
    return (
        {
            "available": cuda.get("available"),
            "device_count": cuda.get("device_count"),
            "tensor_ok": bool(cuda.get("tensor_ok")),
            "total_memory_bytes": cuda.get("total_memory_bytes"),
            "device_name": cuda.get("device_name"),
        },
        {
            "class": plat.get("class"),
            "device_name": plat.get("device_name"),
            "dispatch_key": plat.get("dispatch_key"),
            "dist_backend": plat.get("dist_backend"),
        },
    )


def summary(report):
    """One line: what torch.cuda and the platform showed, e.g. "torch.cuda: available, 8 devices,
    cuda:0 tensor ok, device 0 96.0 GiB; platform cuda/CUDA/nccl"."""
    cuda, plat = findings(report)
    parts = [
        "available" if cuda["available"] else "NOT available",
        "%s devices" % cuda["device_count"] if cuda["device_count"] is not None else "device count unknown",
        "cuda:0 tensor ok" if cuda["tensor_ok"] else "cuda:0 tensor FAILED",
        "device 0 %s" % _gib(cuda["total_memory_bytes"])
        if cuda["total_memory_bytes"] is not None
        else "device 0 memory unknown",
    ]
    if plat["class"] and "platform" not in (report.get("errors") or {}):
        platform = "platform %s/%s/%s" % (plat["device_name"], plat["dispatch_key"], plat["dist_backend"])
    else:
        platform = "platform not loaded"
    return "torch.cuda: %s; %s" % (", ".join(parts), platform)


def format_table(rows):
    """Plain-text table `layer | component | expected | found` of the given rows."""
    head = ("layer", "component", "expected", "found")
    body = [(r.get("layer", "image"), r["component"], r["expected"], r["found"]) for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(3)]
    lines = ["%-*s | %-*s | %-*s | %s" % (widths[0], a, widths[1], b, widths[2], c, d) for a, b, c, d in [head] + body]
    lines.insert(1, "-" * min(160, max(len(line) for line in lines)))
    return "\n".join(lines)
