"""The stand-in stack fails the way the real one does (issue 12, part 2).

A CPython 3.10 venv holds the stand-in stack installed from a freshly built bundle, in the
image's order (standin_helpers.shared_stack: one install per test process); the api_server
is run from that venv, so it loads its platform plugin (vllm_kunlun), torch, the `_kunlun`
extension, kunlun_ops and transformers like vllm 0.15.1 with vllm-kunlun does. Each bad
combination (swapped into that venv, then put back) must stop it at start with the real
error; the good one must serve. A card in error (a node with no driver behind it) must
change what the runtime counts. The kit must make that node.
"""

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kunlun_fleet.sim import bundle
from kunlun_fleet.sim.artifacts.model import build_model_dir
from standin_helpers import (
    ARTIFACTS,
    ROOT,
    Server,
    bundle_files,
    load_pins,
    make_dead_node,
    make_dev_dir,
    python310,
    run_server_once,
    server_env,
    shared_stack,
    venv_env,
)

# Installs the stack into a CPython 3.10 venv (shared with the other stack tests).
pytestmark = pytest.mark.slow
PINS = load_pins()
COMPONENTS = PINS["kunlun_stack_components"]
PY310 = python310()
API_KEY = "k-123"


def serving_args(model_dir, **over):
    s = dict(PINS["kunlun_stack_serving"])
    s.update(over)
    return [
        "--model",
        str(model_dir),
        "--tensor-parallel-size",
        str(s["tensor_parallel_size"]),
        "--dtype",
        s["dtype"],
        "--quantization",
        s["quantization"],
        "--max-model-len",
        str(s["max_model_len"]),
        "--mamba-ssm-cache-dtype",
        s["mamba_ssm_cache_dtype"],
        "--gpu-memory-utilization",
        str(s["gpu_memory_utilization"]),
        "--max-num-seqs",
        str(s["max_num_seqs"]),
        "--api-key",
        API_KEY,
    ]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert PY310, "the stand-in stack needs a CPython 3.10 interpreter (the image's)"
    tmp = tmp_path_factory.mktemp("failing-stack")
    # The shared stack's bundle, with the bad artifacts written beside its own files.
    out = shared_stack(tmp_path_factory, PY310)["bundle"]
    variant = bundle.build_vllm_kunlun_variant(str(out), "2fda97b")
    tf553 = bundle.fetch_transformers_version("5.5.3", str(out))
    model = tmp / "models" / PINS["kunlun_stack_model"]["directory"]
    build_model_dir(str(model), PINS)
    dev = make_dev_dir(tmp / "dev8", 8)
    return {"tmp": tmp, "bundle": out, "variant": variant, "tf553": tf553, "model": model, "dev": dev}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return shared_stack(tmp_path_factory, PY310)


def site_packages(stack) -> Path:
    return Path(stack["sh"](stack["python"], "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())


def start_fails(stack, work, dev=None, **over):
    proc = run_server_once(
        serving_args(work["model"], **over),
        venv_env(dev or work["dev"], XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"),
        python=stack["python"],
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    return out


# ----------------------------------------------------------------------------- good stack
def test_good_stack_loads_its_plugin_and_serves(good, work, tmp_path):
    env = venv_env(work["dev"], XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    srv = Server(
        serving_args(work["model"]) + ["--served-model-name", "m"], env, tmp_path / "good.log", python=good["python"]
    )
    try:
        srv.wait_ready(60)
        req = urllib.request.Request(
            srv.base + "/v1/completions",
            method="POST",
            data=json.dumps({"model": "m", "prompt": "hello", "max_tokens": 3}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        assert body["usage"]["completion_tokens"] == 3
        log = srv.output()
        assert "- kunlun -> vllm_kunlun:register" in log
        assert "Platform plugin kunlun is activated" in log
        assert "Platform stack: torch 2.5.1, kunlun_ops 0.1.58+ee39020a, vllm_kunlun._kunlun 0.15.1.dev0/4885de2" in log
        assert "Profile run: 17 custom ops, image processor max_pixels=1003520" in log
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- bad stacks
def test_transformers_5_5_3_stops_vllm_at_start(good, work):
    sh, py = good["sh"], good["python"]
    try:
        sh(py, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(work["bundle"] / work["tf553"]))
        out = start_fails(good, work)
        assert "EngineCore failed to start." in out
        assert "AttributeError: 'Qwen2VLImageProcessor' object has no attribute 'max_pixels'" in out
        assert ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}") in out
        assert "Application startup complete." not in out
    finally:
        sh(
            py,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--force-reinstall",
            str(work["bundle"] / bundle_files(work["bundle"])["transformers"]),
        )


def test_missing_kunlun_extension_stops_vllm_at_start(good, work):
    pkg = site_packages(good) / "vllm_kunlun"
    ext = sorted(pkg.glob("_kunlun*.so"))
    assert len(ext) == 1, ext
    aside = ext[0].with_name(ext[0].name + ".aside")
    ext[0].rename(aside)
    try:
        out = start_fails(good, work)
        assert "ImportError: cannot import name '_kunlun' from 'vllm_kunlun'" in out
        assert "Resolved architecture" not in out  # stopped before the model is looked at
    finally:
        aside.rename(ext[0])


def test_vllm_kunlun_2fda97b_with_kunlun_ops_0_1_58_stops_vllm_at_start(good, work):
    # The variant over the good stack, the way the image-engine suite makes its bad image (the
    # package and its metadata out, the variant's tree built and installed); the good one's
    # files are moved aside and put back, rather than a whole second stack installed.
    sh, py = good["sh"], good["python"]
    site = site_packages(good)
    aside = work["tmp"] / "good-vllm-kunlun"
    aside.mkdir()
    good_files = [site / "vllm_kunlun", *site.glob("vllm_kunlun-*")]
    for path in good_files:
        path.rename(aside / path.name)
    try:
        src = work["tmp"] / "v2fda97b"
        src.mkdir()
        sh("tar", "-xzf", str(work["bundle"] / work["variant"]), "-C", str(src), "--strip-components=1")
        sh(py, "setup.py", "build", cwd=src)
        sh(py, "setup.py", "install", cwd=src)
        got = sh(
            py,
            "-c",
            "import importlib.metadata as m, vllm_kunlun; from vllm_kunlun import _kunlun; "
            "print(m.version('vllm-kunlun'), vllm_kunlun.__commit__, *_kunlun.version())",
            cwd="/",
        ).split()
        assert got == ["0.25.1.dev0", "2fda97b", "0.25.1.dev0", "2fda97b"]
        out = start_fails(good, work)
        assert "Platform plugin kunlun is activated" in out
        assert "EngineCore failed to start." in out
        assert "TypeError: causal_conv1d_update() got an unexpected keyword argument 'silu_activation'" in out
        assert "Engine core initialization failed" in out
    finally:
        for path in [site / "vllm_kunlun", *site.glob("vllm_kunlun-*")]:
            shutil.rmtree(path)
        for path in good_files:
            (aside / path.name).rename(path)


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_operator_tables_give_the_notes_counts():
    """kunlun_ops 0.1.58 against each commit's calls: 4885de2 fits, 2fda97b has a
    causal_conv1d keyword mismatch, 11 missing operators and 3 other keyword mismatches."""
    ops = _load(ARTIFACTS / "kunlun_ops_src/kunlun_ops/_op_table.py", "op_table").OPS

    def mismatches(calls):
        missing = [op for op, _ in calls if op not in ops]
        keywords = {op: sorted(set(kw) - set(ops[op])) for op, kw in calls if op in ops and set(kw) - set(ops[op])}
        return missing, keywords

    good = _load(ARTIFACTS / "vllm_kunlun_src/vllm_kunlun/ops/_calls.py", "calls_good").CALLS
    assert mismatches(good) == ([], {})
    bad = _load(ARTIFACTS / "vllm_kunlun_variants/2fda97b/vllm_kunlun/ops/_calls.py", "calls_bad").CALLS
    missing, keywords = mismatches(bad)
    assert len(missing) == 11
    assert "causal_conv1d_update" in keywords
    assert len([op for op in keywords if not op.startswith("causal_conv1d")]) == 3


# ----------------------------------------------------------------------------- device in error
@pytest.fixture(scope="module")
def dev_error(work):
    dev = make_dev_dir(work["tmp"] / "dev-error3", 8)
    make_dead_node(dev / "xpu3")
    return dev


def test_device_in_error_is_not_counted_by_the_runtime(good, dev_error, work):
    probe = (
        "import torch, torch_xmlir; print(torch_xmlir._XMLIRC._xpu_get_devices_number(), "
        "torch.cuda.device_count(), torch.xpu.device_count())"
    )
    env = venv_env(dev_error, XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    assert good["sh"](good["python"], "-c", probe, env=env, cwd="/").split() == ["7", "7", "0"]
    env = venv_env(work["dev"], XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    assert good["sh"](good["python"], "-c", probe, env=env, cwd="/").split() == ["8", "8", "0"]


CUDA_PROBE = r"""
import json, torch
def attempt(f):
    try:
        return f()
    except Exception as exc:
        return "%s: %s" % (type(exc).__name__, exc)
print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count(),
                  attempt(lambda: torch.arange(4, device="cuda:0").cpu().tolist()),
                  attempt(lambda: torch.arange(4, device="cuda:7").tolist()),
                  attempt(lambda: torch.cuda.get_device_properties(0).total_memory),
                  attempt(lambda: torch.arange(4, device="xpu:0").tolist()),
                  attempt(lambda: torch.xpu.get_device_properties(0)),
                  torch.xpu.is_available(), torch.xpu.device_count()]))
"""


def test_torch_cuda_answers_from_the_devices_the_runtime_opens(good, dev_error, work, tmp_path):
    """torch.cuda in CUDA-compatible mode counts what torch_xmlir counts, and fails like the real
    one: a device in error leaves 7 (cuda:7 is then past the count), no device leaves none.
    torch.xpu (Intel's) never has a device."""
    xpu_fails = [
        "RuntimeError: PyTorch is not linked with support for xpu devices",
        "AssertionError: Torch not compiled with XPU enabled",
        False,
        0,
    ]
    gib96 = 98304 * 1024 * 1024

    def run(dev):
        env = venv_env(dev, XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
        return json.loads(good["sh"](good["python"], "-c", CUDA_PROBE, env=env, cwd="/").strip().splitlines()[-1])

    assert run(work["dev"]) == [True, 8, [0, 1, 2, 3], [0, 1, 2, 3], gib96] + xpu_fails
    assert (
        run(dev_error) == [True, 7, [0, 1, 2, 3], "RuntimeError: CUDA error: invalid device ordinal", gib96] + xpu_fails
    )
    none = tmp_path / "no-dev"
    none.mkdir()
    assert run(none) == [False, 0] + ["RuntimeError: No CUDA GPUs are available"] * 3 + xpu_fails


def test_device_in_error_stops_vllm_naming_the_device(good, dev_error, work):
    out = start_fails(good, work, dev=dev_error)
    assert f"XPU 3 ({dev_error / 'xpu3'}) failed to initialize: [Errno 6] No such device or address" in out
    assert "World size (8) is larger than the number of available GPUs (7)" in out


def test_device_in_error_stops_the_source_tree_server_too(dev_error, work):
    proc = run_server_once(serving_args(work["model"]), server_env(dev_error))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "XPU 3 (" in out and "No such device or address" in out
    assert "available GPUs (7)" in out


def test_kit_makes_the_node_of_a_device_in_error_unopenable(tmp_path):
    """The kit's modprobe (the driver) with xpu_error_device=3: /dev/xpu3 exists on a
    major no driver serves (open: ENXIO); every other node is the null device."""
    root = tmp_path / "root"
    rel = os.uname().release
    (root / "lib/modules" / rel / "extra").mkdir(parents=True)
    for m in ("kunlun", "kunlun_peermem"):
        (root / "lib/modules" / rel / "extra" / (m + ".ko")).write_text(f"name={m}\nversion=5.0.21.26\n")
    (root / "etc/kunlun-kit").mkdir(parents=True)
    (root / "etc/kunlun-kit/faults").write_text("xpu_error_device=3\n")
    modprobe = ROOT / "kunlun_fleet/sim/kit/rootfs/usr/local/sbin/modprobe"
    proc = subprocess.run(
        [sys.executable, str(modprobe), "kunlun"],
        env=dict(os.environ, XRE_PREFIX=str(root)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    for i in range(8):
        st = os.stat(root / "dev" / f"xpu{i}")
        assert stat.S_ISCHR(st.st_mode)
        want = (61, 3) if i == 3 else (1, 3)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == want, i
    with pytest.raises(OSError) as err:
        os.open(root / "dev" / "xpu3", os.O_RDWR)
    assert err.value.errno == 6  # ENXIO
    os.close(os.open(root / "dev" / "xpu0", os.O_RDWR))
    shutil.rmtree(root / "dev")
