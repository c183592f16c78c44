"""stack_proof: the judge on recorded probe reports, the module's command line and refusals,
and the probe itself run by a CPython 3.10 venv holding the stand-in stack (the image's
install sequence), driven through the module with a docker stand-in that runs the
`docker run` it is given against that venv."""

import copy
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible.module_utils import stack_proof as sp
from ansible.module_utils.kunlun_stack import check_known_bad
from module_docs import documented_spec
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stack_proof"
PINS = stack_pins()
COMPONENTS = PINS["kunlun_stack_components"]
KNOWN_BAD = PINS["kunlun_stack_known_bad"]


def recorded(name):
    """A probe report recorded from the probe's run in the stand-in image venv."""
    return json.loads((FIXTURES / name).read_text())


def evaluate(report, python_match="minor", device_count=8, **kw):
    problems = check_known_bad(sp.found_versions(report), KNOWN_BAD)
    rows = sp.judge(report, COMPONENTS, device_count, python_match, problems, **kw)
    return rows, [r for r in rows if not r["ok"]]


def failed_by_layer(failed):
    return [(r["layer"], r["component"]) for r in failed]


# ---------------------------------------------------------------- the judge, on recordings

CUDA_ROWS = (
    "torch.cuda.is_available()",
    "torch.cuda.device_count()",
    'torch.arange(4, device="cuda:0")',
    "torch.cuda.get_device_properties(0).total_memory",
)
PLATFORM_ROWS = ("vllm.platform_plugins class", "platform.device_name", "platform.dist_backend")


def test_good_report_passes_every_check():
    rows, failed = evaluate(recorded("good.json"))
    assert failed == []
    assert sp.broken_layers(rows) == []
    names = [r["component"] for r in rows]
    for comp in (
        (
            "python",
            "torch",
            "kunlun_ops",
            "triton",
            "xspeedgate_ops",
            "cocopod",
            "vllm",
            "vllm_kunlun",
            "transformers",
            "torch.__version__",
            "torch_xmlir._XMLIRC._xpu_get_devices_number()",
            "vllm_kunlun.__file__",
            "from vllm_kunlun import _kunlun",
            "vllm_kunlun commit",
        )
        + CUDA_ROWS
        + PLATFORM_ROWS
    ):
        assert comp in names
    by = {r["component"]: r for r in rows}
    assert by["torch.cuda.device_count()"]["found"] == "8"
    assert by['torch.arange(4, device="cuda:0")']["found"] == "[0, 1, 2, 3] on cuda:0"
    assert by["torch.cuda.get_device_properties(0).total_memory"]["found"].startswith("96.0 GiB (103079215104 bytes")
    assert by["torch.cuda.get_device_properties(0).total_memory"]["expected"] == "80-100 GiB"
    assert [(by[c]["expected"], by[c]["found"]) for c in PLATFORM_ROWS[1:]] == [("cuda", "cuda"), ("nccl", "nccl")]
    assert "platform.dispatch_key" not in by  # shown in the summary, not a check
    assert {r["layer"] for r in rows} == {"image", "driver", "torch", "plugin"}
    assert sp.summary(recorded("good.json")) == (
        "torch.cuda: available, 8 devices, cuda:0 tensor ok, device 0 96.0 GiB; platform cuda/CUDA/nccl"
    )
    cuda, platform = sp.findings(recorded("good.json"))
    assert cuda == {
        "available": True,
        "device_count": 8,
        "tensor_ok": True,
        "total_memory_bytes": 103079215104,
        "device_name": "P800 OAM",
    }
    assert platform == {
        "class": "vllm_kunlun.platforms.kunlun.KunlunPlatform",
        "device_name": "cuda",
        "dispatch_key": "CUDA",
        "dist_backend": "nccl",
    }


def test_cuda_not_available_names_the_torch_layer():
    """torch_xmlir sees the 8 devices, torch.cuda says it has none: torch is not in CUDA-compatible mode."""
    report = recorded("good.json")
    report["cuda"]["available"] = False
    rows, failed = evaluate(report)
    assert failed_by_layer(failed) == [("torch", "torch.cuda.is_available()")]
    assert failed[0]["found"] == "False"
    assert sp.broken_layers(rows) == ["torch"]
    assert sp.summary(report).startswith("torch.cuda: NOT available, 8 devices")


def test_cuda_counting_fewer_than_the_runtime_is_torch():
    report = recorded("good.json")
    report["cuda"].update(available=False, device_count=0)
    _, failed = evaluate(report)
    assert failed_by_layer(failed) == [("torch", "torch.cuda.is_available()"), ("torch", "torch.cuda.device_count()")]
    assert failed[1]["found"] == "0 (torch_xmlir counts 8)"


def test_seven_devices_fail_with_the_count():
    rows, failed = evaluate(recorded("seven_devices.json"))
    assert [(r["layer"], r["component"], r["expected"], r["found"]) for r in failed] == [
        ("driver", "torch_xmlir._XMLIRC._xpu_get_devices_number()", "8", "7"),
        ("driver", "torch.cuda.device_count()", "8", "7"),
    ]
    assert sp.broken_layers(rows) == ["driver"]


def test_no_device_visible_is_the_driver_for_every_cuda_check():
    """Nothing visible: torch.cuda fails as the real one does, and it is all the driver's."""
    report = recorded("good.json")
    report["devices"] = 0
    report["cuda"] = {"available": False, "device_count": 0, "tensor_ok": False}
    report["errors"].update(
        {
            "torch.cuda.tensor": "RuntimeError: No CUDA GPUs are available",
            "torch.cuda.get_device_properties": "RuntimeError: No CUDA GPUs are available",
        }
    )
    rows, failed = evaluate(report)
    assert failed_by_layer(failed) == [("driver", "torch_xmlir._XMLIRC._xpu_get_devices_number()")] + [
        ("driver", c) for c in CUDA_ROWS
    ]
    assert failed[3]["found"] == "(failed: RuntimeError: No CUDA GPUs are available)"
    assert sp.broken_layers(rows) == ["driver"]


def test_tensor_on_cuda0_failing_is_torch():
    report = recorded("good.json")
    report["cuda"] = {k: v for k, v in report["cuda"].items() if k not in ("tensor", "tensor_device")}
    report["cuda"]["tensor_ok"] = False
    report["errors"]["torch.cuda.tensor"] = "RuntimeError: CUDA error: invalid device ordinal"
    _, failed = evaluate(report)
    assert failed_by_layer(failed) == [("torch", 'torch.arange(4, device="cuda:0")')]
    assert failed[0]["found"] == "(failed: RuntimeError: CUDA error: invalid device ordinal)"
    report["cuda"].update(tensor=[0, 0, 0, 0], tensor_device="cuda:0")
    _, failed = evaluate(report)
    assert [(r["layer"], r["found"]) for r in failed] == [("torch", "[0, 0, 0, 0] on cuda:0")]
    assert "cuda:0 tensor FAILED" in sp.summary(report)


def test_device_memory_out_of_range_is_torch():
    report = recorded("good.json")
    report["cuda"]["total_memory_bytes"] = 32 * 1024**3
    _, failed = evaluate(report)
    assert [(r["layer"], r["component"], r["expected"], r["found"]) for r in failed] == [
        (
            "torch",
            "torch.cuda.get_device_properties(0).total_memory",
            "80-100 GiB",
            "32.0 GiB (34359738368 bytes, P800 OAM)",
        )
    ]
    # the range is the module's option: 96 GiB is outside 100-120, inside 90-96
    _, failed = evaluate(recorded("good.json"), memory_gib=(100, 120))
    assert [r["expected"] for r in failed] == ["100-120 GiB"]
    assert evaluate(recorded("good.json"), memory_gib=(90, 96))[1] == []
    report["cuda"].pop("total_memory_bytes")
    report["errors"]["torch.cuda.get_device_properties"] = "AssertionError: Invalid device id"
    _, failed = evaluate(report)
    assert [(r["layer"], r["found"]) for r in failed] == [("torch", "(failed: AssertionError: Invalid device id)")]


def test_platform_dispatch_key_is_shown_not_gated_unless_asked():
    # The public 0.15.1-era KunlunPlatform sets no dispatch_key: vLLM's default "CPU".
    report = recorded("good.json")
    report["platform"]["dispatch_key"] = "CPU"
    rows, failed = evaluate(report)
    assert failed == []
    assert sp.summary(report).endswith("platform cuda/CPU/nccl")
    # the expected fields are the module's option: an operator can ask for it
    rows, failed = evaluate(
        report, platform_fields={"device_name": "cuda", "dispatch_key": "CUDA", "dist_backend": "nccl"}
    )
    assert [(r["layer"], r["component"], r["expected"], r["found"]) for r in failed] == [
        ("plugin", "platform.dispatch_key", "CUDA", "CPU")
    ]
    assert sp.broken_layers(rows) == ["plugin"]


def test_platform_of_another_plugin_or_not_importable_is_the_plugin_layer():
    report = recorded("good.json")
    report["platform"]["class"] = "vllm_other.platform.OtherPlatform"
    _, failed = evaluate(report)
    assert failed_by_layer(failed) == [("plugin", "vllm.platform_plugins class")]
    report = recorded("good.json")
    report["platform"] = {}
    report["errors"]["platform"] = "LookupError: no vllm.platform_plugins entry point names a platform class"
    _, failed = evaluate(report)
    assert [(r["layer"], r["found"]) for r in failed] == [
        ("plugin", "(failed: LookupError: no vllm.platform_plugins entry point names a platform class)")
    ]
    assert sp.summary(report).endswith("; platform not loaded")


def test_report_without_cuda_findings_fails_every_cuda_check():
    """A probe that never looked (an older report) cannot pass."""
    report = recorded("good.json")
    del report["cuda"], report["platform"]
    _, failed = evaluate(report)
    assert [r["component"] for r in failed] == list(CUDA_ROWS) + ["vllm.platform_plugins class"]
    assert all(r["found"] == "(not probed)" for r in failed)


def test_python_exact_fails_on_another_patch_release_minor_passes():
    report = recorded("good.json")
    report["python"] = "3.10.12"
    _, failed = evaluate(report, python_match="exact")
    assert [(r["component"], r["expected"]) for r in failed] == [("python", "3.10.19")]
    assert failed[0]["found"].startswith("3.10.12 ")
    assert evaluate(report, python_match="minor")[1] == []
    report["python"] = "3.11.2"
    _, failed = evaluate(report, python_match="minor")
    assert [r["component"] for r in failed] == ["python"]


def test_known_bad_transformers_is_named_twice():
    report = recorded("good.json")
    report["versions"]["transformers"] = "5.5.3"
    _, failed = evaluate(report)
    assert [r["component"] for r in failed] == ["transformers", "known-bad combination"]
    assert failed[0]["expected"] == "5.2.0" and failed[0]["found"] == "5.5.3"
    assert "max_pixels" in failed[1]["found"]


def test_missing_package_and_failed_imports_are_reported_with_the_error():
    report = recorded("broken.json")
    rows, failed = evaluate(report)
    by = {r["component"]: r for r in failed}
    assert by["cocopod"]["found"] == "(not installed)"
    assert "ImportError" in by["from vllm_kunlun import _kunlun"]["found"]
    assert by["vllm_kunlun.__file__"]["found"].startswith("/src/vllm-kunlun/")
    # the platform class is named by the entry point but does not import without _kunlun
    plat = by["vllm.platform_plugins class"]
    assert plat["layer"] == "plugin"
    assert plat["found"].startswith("vllm_kunlun.platforms.kunlun.KunlunPlatform (failed: ImportError")
    assert sp.broken_layers(rows) == ["plugin", "image"]


def test_torch_xpu_is_not_what_counts():
    """A report has no torch.xpu field at all: the count comes from torch_xmlir and torch.cuda."""
    assert "xpu." not in sp.PROBE_SOURCE.replace("_XMLIRC._xpu_get_devices_number", "")
    assert "_xpu_get_devices_number()" in sp.PROBE_SOURCE
    for call in (
        "torch.cuda.is_available()",
        "torch.cuda.device_count()",
        'torch.arange(4, device="cuda:0")',
        "torch.cuda.get_device_properties(0)",
        '"vllm.platform_plugins"',
    ):
        assert call in sp.PROBE_SOURCE


def test_parse_ignores_noise_and_refuses_no_report():
    line = sp.PROBE_MARKER + json.dumps({"python": "3.10.19"})
    assert sp.parse_probe_output("warning from an import\n" + line + "\n")["python"] == "3.10.19"
    with pytest.raises(ValueError):
        sp.parse_probe_output("Traceback (most recent call last):\n")


def test_table_lines_up():
    rows = [
        {"component": "torch", "expected": "2.5.1", "found": "2.4.0", "ok": False, "layer": "image"},
        {"component": "known-bad combination", "expected": "absent", "found": "x", "ok": False},
        {"component": "torch.cuda.device_count()", "expected": "8", "found": "7", "ok": False, "layer": "driver"},
    ]
    lines = sp.format_table(rows).splitlines()
    assert [c.strip() for c in lines[0].split("|")] == ["layer", "component", "expected", "found"]
    assert lines[2] == "image  | torch                     | 2.5.1    | 2.4.0"
    assert lines[3].startswith("image  | known-bad combination ")
    assert lines[4] == "driver | torch.cuda.device_count() | 8        | 7"
    assert len({tuple(i for i, ch in enumerate(line) if ch == "|") for line in lines if "|" in line}) == 1


def test_request_lists_every_versioned_pin_but_python():
    req = json.loads(sp.probe_request(COMPONENTS))
    assert sorted(req["distributions"]) == sorted(n for n in COMPONENTS if n != "python")


# ---------------------------------------------------------------- the module


def run_module(capsys, args, check=False):
    import stack_proof
    from ansible.module_utils.testing import patch_module_args

    if check:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            stack_proof.main()
    return json.loads(capsys.readouterr().out)


def test_command_is_unprivileged_and_passes_each_node():
    import stack_proof

    cmd = stack_proof.probe_command(
        "/usr/bin/docker",
        "img:1",
        "/opt/vllm_kunlun/bin/python",
        ["/dev/xpu0", "/dev/xpu1", "/dev/xpuctrl"],
        {"B": "2", "A": "1"},
        "{}",
    )
    assert "--privileged" not in cmd and cmd[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert cmd[cmd.index("--network") + 1] == "none"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--device"] == [
        "/dev/xpu0:/dev/xpu0",
        "/dev/xpu1:/dev/xpu1",
        "/dev/xpuctrl:/dev/xpuctrl",
    ]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--env"] == ["A=1", "B=2"]
    assert cmd[cmd.index("--entrypoint") + 1] == "/opt/vllm_kunlun/bin/python"
    assert cmd[-4:] == ["img:1", "-c", sp.PROBE_SOURCE, "{}"]


def test_command_has_the_serving_container_s_options():
    import stack_proof

    cmd = stack_proof.probe_command(
        "/usr/bin/docker",
        "img:1",
        "/opt/vllm_kunlun/bin/python",
        ["/dev/xpu0"],
        {},
        "{}",
        "32g",
        ["SYS_PTRACE"],
        ["seccomp=unconfined"],
        ["/usr/local/bin/xpu-smi:/usr/local/bin/xpu-smi:ro"],
    )
    pairs = list(zip(cmd, cmd[1:], strict=False))
    for pair in (
        ("--shm-size", "32g"),
        ("--cap-add", "SYS_PTRACE"),
        ("--security-opt", "seccomp=unconfined"),
        ("--volume", "/usr/local/bin/xpu-smi:/usr/local/bin/xpu-smi:ro"),
    ):
        assert pair in pairs
    assert "--privileged" not in cmd and cmd[cmd.index("--network") + 1] == "none"


def test_the_image_role_proves_with_the_options_serve_renders():
    """roles/image's proof options against roles/serve's unit template: the same shm size,
    capability, seccomp profile, xpu-smi mount and environment (VLLM_HOST_IP and the extra
    variables included)."""
    image = yaml.safe_load((ROOT / "roles/image/defaults/main.yml").read_text())
    serve = yaml.safe_load((ROOT / "roles/serve/defaults/main.yml").read_text())
    unit = (ROOT / "roles/serve/templates/kunlun-serve.service.j2").read_text()
    env_file = (ROOT / "roles/serve/templates/serve.env.j2").read_text()
    for cap in image["image_proof_cap_add"]:
        assert "'--cap-add %s'" % cap in unit
    for opt in image["image_proof_security_opt"]:
        assert "'--security-opt %s'" % opt in unit
    assert (
        "'--shm-size ' ~ serve_shm_size" in unit
        and "serve_shm_size | default('%s')" % serve["serve_shm_size"] in image["image_proof_shm_size"]
    )
    assert "serve_xpu_smi ~ ':' ~ serve_xpu_smi ~ ':ro'" in unit
    assert "serve_xpu_smi | default('%s')" % serve["serve_xpu_smi"] in image["image_proof_volumes"][0]
    for part in (
        "kunlun_stack_serving_env_effective",
        "'VLLM_HOST_IP': kunlun_stack_serving_addresses[inventory_hostname]",
    ):
        assert part in env_file and part in image["image_proof_env"], part
    assert image["image_proof_quantization"].startswith("{{ kunlun_stack_serving_effective.quantization")
    for tasks in ("build.yml", "distribute.yml"):
        text = (ROOT / "roles/image/tasks" / tasks).read_text()
        for option in ("quantization", "shm_size", "cap_add", "security_opt", "volumes"):
            assert '    %s: "{{ image_proof_%s }}"' % (option, option) in text, (tasks, option)


def good_with(**change):
    report = copy.deepcopy(recorded("good.json"))
    report.update(change)
    return report


def test_a_source_component_is_its_commit_not_its_declared_version():
    """vllm-kunlun built from the public 0.15.1-era tree reports what pyproject.toml
    declares (0.11.0 at bd3b083), not the pin's 0.15.1.dev0: shown, not a failure."""
    report = good_with(versions=dict(recorded("good.json")["versions"], vllm_kunlun="0.11.0"))
    rows, failed = evaluate(report)
    assert failed == []
    row = [r for r in rows if r["component"] == "vllm_kunlun"][0]
    assert (row["expected"], row["found"]) == ("installed (0.15.1.dev0: its declared version, not compared)", "0.11.0")
    report = good_with(versions=dict(recorded("good.json")["versions"], vllm_kunlun=None))
    assert failed_by_layer(evaluate(report)[1]) == [("image", "vllm_kunlun")]
    # a wheel's version is still its pin's
    report = good_with(versions=dict(recorded("good.json")["versions"], vllm="0.15.2"))
    assert ("image", "vllm") in failed_by_layer(evaluate(report)[1])


QUANT_OK = {
    "method": "compressed-tensors",
    "general_plugins": True,
    "listed": True,
    "config": "vllm.model_executor.layers.quantization.compressed_tensors.CompressedTensorsConfig",
    "module": "/opt/vllm_kunlun/lib/python3.10/site-packages/vllm/model_executor/layers/quantization/__init__.py",
}


def test_the_serving_quantization_method_must_load():
    rows, failed = evaluate(good_with(quantization=QUANT_OK), quantization="compressed-tensors")
    assert failed == []
    by = {r["component"]: r for r in rows}
    assert by["vllm quantization compressed-tensors"]["found"].startswith("vllm.model_executor.layers.quantization.")
    assert by["vllm.general_plugins"]["found"] == "loaded"
    # vllm's module emptied (an empty file copied over it): nothing to load the method with
    broken = good_with(
        quantization={"method": "compressed-tensors", "general_plugins": True},
        errors={
            "quantization": "AttributeError: module 'vllm.model_executor.layers.quantization' has "
            "no attribute 'get_quantization_config'"
        },
    )
    rows, failed = evaluate(broken, quantization="compressed-tensors")
    assert failed_by_layer(failed) == [("plugin", "vllm quantization compressed-tensors")]
    assert "no attribute 'get_quantization_config'" in failed[0]["found"]
    # a method the module does not list, and a report that never probed it
    unlisted = dict(QUANT_OK, method="kl3-compressed-xline", listed=False)
    assert failed_by_layer(evaluate(good_with(quantization=unlisted), quantization="kl3-compressed-xline")[1]) == [
        ("plugin", "vllm quantization kl3-compressed-xline")
    ]
    assert evaluate(recorded("good.json"), quantization="compressed-tensors")[1][0]["found"] == "(not probed)"


def test_the_probe_never_reads_is_cuda():
    """vllm-kunlun's platform answers is_cuda() with False, in the working stack too
    (platforms/kunlun.py, 0.15.1 era): nothing the proof judges may come from it."""
    assert "is_cuda" not in sp.PROBE_SOURCE
    assert not any("is_cuda" in r["component"] for r in evaluate(recorded("good.json"))[0])


def test_the_probe_loads_the_quantization_method_as_vllm_does(tmp_path):
    """The probe run by Python on a tree whose vllm quantization module was emptied (what
    copying the 0.15.1-era vllm_kunlun/ops/quantization/__init__.py over it does), then on
    vllm's own: general plugins first, then get_quantization_config."""
    site = tmp_path / "site"
    quant = site / "vllm" / "model_executor" / "layers" / "quantization"
    quant.mkdir(parents=True)
    for pkg in ("vllm", "vllm/model_executor", "vllm/model_executor/layers"):
        (site / pkg / "__init__.py").write_text("")
    (site / "vllm" / "plugins").mkdir()
    (site / "vllm" / "plugins" / "__init__.py").write_text(
        "import os\ndef load_general_plugins():\n    open(os.environ['PLUGINS_LOADED'], 'w').close()\n"
    )
    (quant / "__init__.py").write_text("")
    request = sp.probe_request(COMPONENTS, "compressed-tensors")
    env = dict(os.environ, PYTHONPATH=str(site), PLUGINS_LOADED=str(tmp_path / "loaded"))

    def probe():
        proc = subprocess.run(
            [sys.executable, "-c", sp.PROBE_SOURCE, request], env=env, capture_output=True, text=True, cwd=str(tmp_path)
        )
        return sp.parse_probe_output(proc.stdout)

    report = probe()
    assert (tmp_path / "loaded").exists()
    assert "get_quantization_config" in report["errors"]["quantization"]
    row = sp.quantization_rows(report, "compressed-tensors")[-1]
    assert row["ok"] is False and row["layer"] == "plugin"
    (quant / "__init__.py").write_text(
        "QUANTIZATION_METHODS = ['awq', 'compressed-tensors']\n"
        "class CompressedTensorsConfig:\n    pass\n"
        "def get_quantization_config(q):\n    return CompressedTensorsConfig\n"
    )
    report = probe()
    assert report["quantization"]["config"] == "vllm.model_executor.layers.quantization.CompressedTensorsConfig"
    assert all(r["ok"] for r in sp.quantization_rows(report, "compressed-tensors"))


def test_host_devices_numeric_order(tmp_path):
    import stack_proof

    for name in ("xpu10", "xpu2", "xpu0", "xpuctrl", "xpu1x", "xpu9"):
        (tmp_path / name).touch()
    assert stack_proof.host_devices(str(tmp_path)) == [
        str(tmp_path / n) for n in ("xpu0", "xpu2", "xpu9", "xpu10", "xpuctrl")
    ]


FAKE_DOCKER = r'''#!/usr/bin/env python3
"""docker stand-in for the module test: `image inspect` knows one image, `run` executes the
probe with the scratch venv's python, the given --env and the --device nodes as its /dev."""
import os, re, subprocess, sys, tempfile
args = sys.argv[1:]
known = os.environ["FAKE_DOCKER_IMAGE"]
if args[:2] == ["image", "inspect"]:
    if args[-1] == known:
        print("sha256:" + "0" * 64); sys.exit(0)
    sys.stderr.write("Error: No such image: %s\n" % args[-1]); sys.exit(1)
assert args[0] == "run" and "--privileged" not in args, args
env = {"PATH": "/usr/bin:/bin"}
dev = tempfile.mkdtemp()
i = 1
while i < len(args):
    a = args[i]
    if a in ("--env", "--device", "--entrypoint", "--network", "--workdir", "--label", "--shm-size", "--cap-add",
             "--security-opt", "--volume"):
        v = args[i + 1]
        if a == "--env":
            k, _, val = v.partition("="); env[k] = val
        if a == "--device":
            open(os.path.join(dev, os.path.basename(v.split(":")[0])), "w").close()
        i += 2
    elif a == "--rm":
        i += 1
    else:
        break
image, rest = args[i], args[i + 1:]
env["KUNLUN_SIM_DEV_DIR"] = dev
sys.exit(subprocess.call([os.environ["FAKE_DOCKER_PYTHON"]] + rest, env=env, cwd="/"))
'''


sys.path.insert(0, str(ROOT / "tests" / "artifacts"))
from standin_helpers import NO_PY310, python310, shared_stack  # noqa: E402 (path set just above)

PY310 = python310()


@pytest.fixture(scope="module")
def stack_venv(tmp_path_factory):
    """A CPython 3.10 venv holding the stand-in stack, installed in the image's order (the
    one tests/artifacts uses too, installed once per test process)."""
    tmp = tmp_path_factory.mktemp("proof")
    stack = shared_stack(tmp_path_factory, PY310)
    fake = tmp / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(FAKE_DOCKER)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {"venv": stack["venv"], "python": stack["python"], "bin": fake.parent, "src": stack["src"], "tmp": tmp}


def _module_args(venv_info, nodes, **extra):
    devs = venv_info["tmp"] / ("dev%d" % nodes)
    devs.mkdir(exist_ok=True)
    paths = []
    for i in range(nodes):
        (devs / ("xpu%d" % i)).touch()
        paths.append(str(devs / ("xpu%d" % i)))
    (devs / "xpuctrl").touch()
    args = {
        "image": "kunlun-serving:test",
        "components": copy.deepcopy(COMPONENTS),
        "known_bad": KNOWN_BAD,
        "device_count": 8,
        "python_match": "minor",
        "python": venv_info["python"],
        "env": PINS["kunlun_stack_serving_env"],
        "devices": paths + [str(devs / "xpuctrl")],
    }
    args.update(extra)
    return args


@pytest.fixture
def fake_docker(stack_venv, monkeypatch):
    monkeypatch.setenv("PATH", "%s:%s" % (stack_venv["bin"], os.environ["PATH"]))
    monkeypatch.setenv("FAKE_DOCKER_IMAGE", "kunlun-serving:test")
    monkeypatch.setenv("FAKE_DOCKER_PYTHON", stack_venv["python"])
    return stack_venv


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_proves_the_standin_stack(fake_docker, capsys):
    r = run_module(
        capsys,
        _module_args(
            fake_docker,
            8,
            quantization="compressed-tensors",
            shm_size="32g",
            cap_add=["SYS_PTRACE"],
            security_opt=["seccomp=unconfined"],
        ),
    )
    assert r.get("failed") is not True, r.get("msg")
    assert r["proven"] is True and r["changed"] is False
    rep = r["report"]
    assert rep["devices"] == 8 and rep["torch_version"] == "2.5.1"
    assert rep["vllm_kunlun_in_site_packages"] and rep["kunlun_extension"].endswith(".so")
    assert rep["versions"]["vllm_kunlun"] == "0.15.1.dev0" and rep["versions"]["transformers"] == "5.2.0"
    assert rep["executable"].startswith(str(fake_docker["venv"]))
    assert r["layers"] == []
    assert r["cuda"] == {
        "available": True,
        "device_count": 8,
        "tensor_ok": True,
        "total_memory_bytes": 98304 * 1024 * 1024,
        "device_name": "P800 OAM",
    }
    assert r["platform"] == {
        "class": "vllm_kunlun.platforms.kunlun.KunlunPlatform",
        "device_name": "cuda",
        "dispatch_key": "CPU",
        "dist_backend": "nccl",
    }
    line = "torch.cuda: available, 8 devices, cuda:0 tensor ok, device 0 96.0 GiB; platform cuda/CPU/nccl"
    assert r["summary"] == line and r["msg"] == "image kunlun-serving:test proven: " + line
    assert 'torch  | torch.arange(4, device="cuda:0")' in r["table"]
    assert rep["errors"] == {}
    # the serving method, loaded as vLLM loads it (general plugins first), in vllm's own module
    assert rep["quantization"]["general_plugins"] is True and rep["quantization"]["listed"] is True
    assert "plugin | vllm quantization compressed-tensors" in r["table"]


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_finds_seven_devices_and_fails_with_the_table(fake_docker, capsys):
    r = run_module(capsys, _module_args(fake_docker, 7))
    assert r["failed"] is True and r["proven"] is False
    assert "2 of 21 checks failed; broken layer, lowest first: driver)" in r["msg"]
    assert "driver | torch_xmlir._XMLIRC._xpu_get_devices_number() | 8        | 7\n" in r["msg"]
    assert "driver | torch.cuda.device_count()                     | 8        | 7\n" in r["msg"]
    assert "- driver: the accelerators are not all usable" in r["msg"]
    assert r["report"]["devices"] == 7 and r["cuda"]["device_count"] == 7 and r["layers"] == ["driver"]


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_with_no_device_visible_fails_like_the_real_torch(fake_docker, capsys):
    """No node passed: torch.cuda counts 0 and a tensor on cuda:0 raises; the driver is named."""
    r = run_module(capsys, _module_args(fake_docker, 0))
    assert r["failed"] is True and r["layers"] == ["driver"]
    assert r["cuda"] == {
        "available": False,
        "device_count": 0,
        "tensor_ok": False,
        "total_memory_bytes": None,
        "device_name": None,
    }
    assert r["report"]["errors"]["torch.cuda.tensor"] == "RuntimeError: No CUDA GPUs are available"
    assert 'driver | torch.arange(4, device="cuda:0")' in r["msg"]
    assert "torch.cuda: NOT available, 0 devices, cuda:0 tensor FAILED, device 0 memory unknown" in r["msg"]


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_memory_range_and_platform_fields_are_options(fake_docker, capsys):
    r = run_module(capsys, _module_args(fake_docker, 8, device_memory_min_gib=97, device_memory_max_gib=120))
    assert r["failed"] is True and r["layers"] == ["torch"]
    assert [(row["component"], row["expected"]) for row in r["rows"] if not row["ok"]] == [
        ("torch.cuda.get_device_properties(0).total_memory", "97-120 GiB")
    ]
    # dispatch_key is checked only when asked for (the stand-in says "CPU", as the public class)
    r = run_module(capsys, _module_args(fake_docker, 8, platform_fields={"dispatch_key": "CUDA"}))
    assert r["failed"] is True and r["layers"] == ["plugin"]
    assert [(row["component"], row["expected"], row["found"]) for row in r["rows"] if not row["ok"]] == [
        ("platform.dispatch_key", "CUDA", "CPU")
    ]


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_python_exact_names_the_patch_release(fake_docker, capsys):
    r = run_module(capsys, _module_args(fake_docker, 8, python_match="exact"))
    found = subprocess.run(
        [PY310, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    if found == COMPONENTS["python"]["version"]:
        pytest.skip("not applicable: this interpreter is the pinned patch release, there is no mismatch to name")
    assert r["failed"] is True
    assert [row["component"] for row in r["rows"] if not row["ok"]] == ["python"]


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_catches_a_known_bad_pin_in_the_image(fake_docker, capsys):
    """The image holds transformers 5.2.0; pins asking for 5.5.3 fail on both counts."""
    comps = copy.deepcopy(COMPONENTS)
    comps["transformers"]["version"] = "5.5.3"
    r = run_module(capsys, _module_args(fake_docker, 8, components=comps))
    assert r["failed"] is True
    bad = {row["component"]: row for row in r["rows"] if not row["ok"]}
    assert bad["transformers"]["expected"] == "5.5.3" and bad["transformers"]["found"] == "5.2.0"
    # the image itself is not known-bad: only the pin departs
    assert "known-bad combination" not in bad


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_run_from_the_source_tree_is_not_fooled(fake_docker, capsys):
    """A vllm_kunlun directory in the working directory must not stand in for the installed one."""
    proc = subprocess.run(
        [fake_docker["python"], "-c", sp.PROBE_SOURCE, sp.probe_request(COMPONENTS)],
        cwd=str(fake_docker["src"]),
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "KUNLUN_SIM_DEV_DIR": str(fake_docker["tmp"])},
    )
    rep = sp.parse_probe_output(proc.stdout)
    assert rep["vllm_kunlun_in_site_packages"] is True
    assert not rep["vllm_kunlun_file"].startswith(str(fake_docker["src"]))


def test_missing_image_fails_and_check_mode_reports(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    monkeypatch.setenv("FAKE_DOCKER_IMAGE", "other:1")
    monkeypatch.setenv("FAKE_DOCKER_PYTHON", sys.executable)
    args = {"image": "kunlun-serving:abc", "components": COMPONENTS, "devices": []}
    r = run_module(capsys, args)
    assert r["failed"] and "image kunlun-serving:abc is not on this host" in r["msg"]
    assert "playbooks/image.yml" in r["msg"]
    r = run_module(capsys, args, check=True)
    assert not r.get("failed") and r["proven"] is False and "check mode" in r["msg"]


def test_probe_that_cannot_start_is_a_clear_failure(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    monkeypatch.setenv("FAKE_DOCKER_IMAGE", "img:1")
    monkeypatch.setenv("FAKE_DOCKER_PYTHON", str(tmp_path / "no-python"))
    r = run_module(
        capsys, {"image": "img:1", "components": COMPONENTS, "devices": [], "python": "/opt/vllm_kunlun/bin/python"}
    )
    assert r["failed"] and "the probe did not run in image img:1" in r["msg"]


def test_the_documentation_matches_the_argument_spec(monkeypatch):
    import stack_proof

    doc, _ = documented_spec(monkeypatch, stack_proof)
    assert doc["options"]["platform_fields"]["default"] == sp.PLATFORM_FIELDS
    assert (
        doc["options"]["device_memory_min_gib"]["default"],
        doc["options"]["device_memory_max_gib"]["default"],
    ) == sp.MEMORY_GIB
    assert set(yaml.safe_load(stack_proof.RETURN)) == {
        "proven",
        "rows",
        "table",
        "report",
        "devices",
        "layers",
        "cuda",
        "platform",
        "summary",
    }
    assert yaml.safe_load(stack_proof.EXAMPLES)


def test_no_interpreter_is_refused(capsys):
    comps = {k: v for k, v in COMPONENTS.items() if k != "python"}
    r = run_module(capsys, {"image": "img:1", "components": comps})
    assert r["failed"] and "components.python.venv" in r["msg"]


def record_fixtures(venv_info):  # pragma: no cover - used once to record the fixtures
    """Re-record good.json / seven_devices.json from the stand-in venv (manual helper)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, count in (("good.json", 8), ("seven_devices.json", 7)):
        dev = venv_info["tmp"] / ("rec%d" % count)
        dev.mkdir(exist_ok=True)
        for i in range(count):
            (dev / ("xpu%d" % i)).touch()
        proc = subprocess.run(
            [venv_info["python"], "-c", sp.PROBE_SOURCE, sp.probe_request(COMPONENTS)],
            cwd="/",
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "KUNLUN_SIM_DEV_DIR": str(dev), "XPU_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
        )
        (FIXTURES / name).write_text(json.dumps(sp.parse_probe_output(proc.stdout), indent=1, sort_keys=True) + "\n")
    shutil.copy(FIXTURES / "good.json", FIXTURES / "broken.json")
