"""The stand-in bundle: layout and names from the pins, manifest, and a real install."""

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kunlun_fleet.sim import bundle
from standin_helpers import NO_PY310, bundle_files, make_dev_dir, python310, shared_stack

SMALL = ("kunlun_ops", "triton", "xspeedgate_ops", "cocopod", "vllm")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "bundle"
    result = bundle.build(str(out), force=True, log=lambda *_: None)
    return out, result


def test_every_pin_is_indexed_under_the_vendor_s_or_the_index_s_name(built, pins):
    """bundle.yml (kunlun-fleet bundle build's index) maps every pin to its file; the files
    keep the names the vendor and the package index give them."""
    out, _ = built
    files = bundle_files(out)
    for name in pins["kunlun_stack_components"]:
        if name != "python":
            assert (out / files[name]).is_file(), name
    assert files["vllm"] == "wheels/vllm-0.15.1-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert files["torch"] == "torch/xpytorch-cp310-torch251-ubuntu2004-x64.run"
    model = pins["kunlun_stack_model"]
    assert (out / "models" / model["directory"] / "config.json").is_file()
    assert files["model"] == "models/%s.sha256" % model["directory"]
    if os.path.exists(bundle.XRE_MODULE):
        assert files["driver"] == "drivers/xre-Linux-x86_64-%s.run" % pins["kunlun_stack_driver"]["version"]


def test_manifest_verifies_with_sha256sum(built):
    out, _ = built
    proc = subprocess.run(["sha256sum", "-c", "--strict", "MANIFEST.sha256"], cwd=out, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (out / "MANIFEST.sha256").read_text().splitlines()
    paths = [line.split("  ", 1)[1] for line in lines]
    assert paths == sorted(paths)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256")
    assert paths == on_disk


def test_tampering_is_caught(built, tmp_path):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    target = copy / "models" / "Qwen3.8-27B-W8A8-INT8-Dynamic" / "config.json"
    target.write_text(target.read_text().replace("262144", "1048576"))
    assert bundle.verify(str(copy)) == ["checksum mismatch: models/Qwen3.8-27B-W8A8-INT8-Dynamic/config.json"]


def test_rebuild_is_skipped_and_bytes_are_stable(built, tmp_path):
    out, first = built
    again = bundle.build(str(out), log=lambda *_: None)
    assert again["changed"] is False
    other = bundle.build(str(tmp_path / "other"), force=True, log=lambda *_: None)
    assert other["changed"] is True
    assert (tmp_path / "other" / "MANIFEST.sha256").read_text() == (out / "MANIFEST.sha256").read_text()


def test_bundle_wheelhouse_holds_the_router_and_its_dependencies(built, pins):
    """The gateway's router and every one of its requirements are in the wheelhouse (pip
    --no-index finds them all) and in the manifest. Installed from it, offline, by the
    gateway scenario's converge (molecule/gateway) and the e2e (gateway_install_from: bundle)."""
    out, _ = built
    gw = pins["kunlun_stack_gateway_router"]
    router = out / bundle_files(out)["gateway_router"]
    assert router.is_file()
    manifest = (out / "MANIFEST.sha256").read_text()
    wheels = sorted(p.name for p in (out / "wheelhouse").glob("*.whl"))
    for name in wheels:
        assert "  wheelhouse/%s\n" % name in manifest
    names = {w.split("-")[0].lower() for w in wheels}
    # vllm-router's own requirements (METADATA Requires-Dist), all there for pip --no-index.
    with zipfile.ZipFile(router) as zf:
        meta = zf.read("vllm_router-%s.dist-info/METADATA" % gw["version"]).decode()
    required = [
        line.split(":", 1)[1].strip().split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert required
    for req in required:
        assert req.lower().replace("-", "_") in names, (req, names)


def test_foreign_files_are_kept_and_listed(built, tmp_path):
    out, _ = built
    copy = tmp_path / "b"
    shutil.copytree(out, copy)
    (copy / "images").mkdir()
    (copy / "images" / "vllm-kunlun-exp-base.tar").write_bytes(b"not really a tar")
    bundle.build(str(copy), force=True, log=lambda *_: None)
    assert (copy / "images" / "vllm-kunlun-exp-base.tar").exists()
    assert "images/vllm-kunlun-exp-base.tar" in (copy / "MANIFEST.sha256").read_text()


def test_model_files_match_the_pins(built, pins):
    out, _ = built
    model = pins["kunlun_stack_model"]
    d = out / "models" / model["directory"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == model["model_type"]
    assert cfg["max_position_embeddings"] == model["max_position_embeddings"]
    assert cfg["dtype"] == model["dtype"]
    assert cfg["quantization_config"]["quant_method"] == model["quant_method"]
    assert "rope_scaling" not in cfg
    assert cfg["num_hidden_layers"] == 64
    assert cfg["layer_types"].count("linear_attention") == 48
    assert cfg["layer_types"].count("full_attention") == 16
    tok = json.loads((d / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "BPE" and "<|im_end|>" in {t["content"] for t in tok["added_tokens"]}
    for shard in d.glob("*.safetensors"):
        raw = shard.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        assert 8 + n + end == len(raw)
    proc = subprocess.run(
        ["sha256sum", "-c", "--strict", str(out / bundle_files(out)["model"])], cwd=d, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("pkg", SMALL)
def test_wheel_metadata_and_record(built, pins, pkg):
    out, _ = built
    comp = pins["kunlun_stack_components"][pkg]
    with zipfile.ZipFile(out / bundle_files(out)[pkg]) as zf:
        names = zf.namelist()
        dist_info = [n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA")]
        assert len(dist_info) == 1
        meta = zf.read(f"{dist_info[0]}/METADATA").decode()
        assert f"\nVersion: {comp['version']}\n" in meta
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info[0]}/RECORD").decode())))
        for path, digest, size in rows:
            if not digest:
                continue
            data = zf.read(path)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want and int(size) == len(data), path
        assert sorted(r[0] for r in rows) == sorted(names)


def test_patch_script_reports_failures_on_a_wrong_torch(built, tmp_path):
    """A torch that is not the 2.5.1 stand-in: the patches fail and say so."""
    out, _ = built
    run = next((out / "torch").glob("*.run"))
    subprocess.run(["bash", str(run), "--noexec", "--target", str(tmp_path / "x")], check=True, capture_output=True)
    site = tmp_path / "site"
    with zipfile.ZipFile(next((tmp_path / "x").glob("torch-*.whl"))) as zf:
        zf.extractall(site)
    cfg = site / "torch" / "_inductor" / "config.py"
    cfg.write_text(cfg.read_text().replace('"ATEN,TRITON,CPP"', '"ATEN,TRITON"'))
    (site / "torch" / "utils" / "_triton.py").unlink()
    subprocess.run(
        ["tar", "-xzf", str(next((out / "src").glob("*.tar.gz"))), "-C", str(tmp_path), "--strip-components=1"],
        check=True,
    )
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "vllm_kunlun/patches/patch_torch251.py")],
        env=dict(os.environ, PYTHONPATH=str(site)),
        capture_output=True,
        text=True,
    )
    # as the vendor's script: a block per patch, the results line, a rule of 64 "=", exit 1
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[-4:] == [
        "  Results: 9 applied  |  0 skipped  |  2 failed  |  11 total",
        "  Original files backed up as .bak",
        "  To revert: python patch_torch251.py --revert",
        "=" * 64,
    ]
    assert "Patch: torch/_inductor/config.py (lines 4)" in lines
    assert "  FAIL: File not found: %s" % (site / "torch/utils/_triton.py") in lines
    assert (
        lines.count("  FAIL: Original code not found. The file may have been modified or the vLLM version may differ.")
        == 1
    )


def test_patch_script_reports_a_second_run_as_skipped_and_reverts(built, tmp_path):
    """The vendor's script counts a patch already in place as skipped (0 applied on a
    second run, exit 0), keeps a .bak of each file it changed and --revert puts it back."""
    out, _ = built
    run = next((out / "torch").glob("*.run"))
    subprocess.run(["bash", str(run), "--noexec", "--target", str(tmp_path / "x")], check=True, capture_output=True)
    site = tmp_path / "site"
    with zipfile.ZipFile(next((tmp_path / "x").glob("torch-*.whl"))) as zf:
        zf.extractall(site)
    subprocess.run(
        ["tar", "-xzf", str(next((out / "src").glob("*.tar.gz"))), "-C", str(tmp_path), "--strip-components=1"],
        check=True,
    )
    script = str(tmp_path / "vllm_kunlun/patches/patch_torch251.py")
    env = dict(os.environ, PYTHONPATH=str(site))
    original = (site / "torch/cuda/__init__.py").read_text()

    def run_script(*args):
        return subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True)

    first, second = run_script(), run_script()
    assert first.returncode == 0 and second.returncode == 0
    assert first.stdout.splitlines()[-4:] == [
        "  Results: 11 applied  |  0 skipped  |  0 failed  |  11 total",
        "  Original files backed up as .bak",
        "  To revert: python patch_torch251.py --revert",
        "=" * 64,
    ]
    assert second.stdout.splitlines()[-2:] == [
        "  Results: 0 applied  |  11 skipped  |  0 failed  |  11 total",
        "=" * 64,
    ]
    assert (site / "torch/cuda/__init__.py.bak").read_text() == original
    reverted = run_script("--revert")
    assert reverted.returncode == 0 and reverted.stdout.splitlines()[-1] == "Revert complete."
    assert (site / "torch/cuda/__init__.py").read_text() == original


PY310 = python310()


@pytest.fixture
def patched_stack(tmp_path_factory):
    """The stack installed in the image's order, with pip (the venv's) where the image uses
    uv (standin_helpers.shared_stack: one install per test process), and vllm-kunlun's fixes
    applied as the image build applies them; put back after the test, since the other stack
    tests use the same venv."""
    stack = shared_stack(tmp_path_factory, PY310)
    py, sh = stack["python"], stack["sh"]
    site = Path(sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    script = site / "vllm_kunlun" / "patches" / "patch_torch251.py"
    eval_frame = site / "torch" / "_dynamo" / "eval_frame.py"
    torch_eval_frame = eval_frame.read_bytes()
    try:
        patch = sh(py, str(script))
        shutil.copy(site / "vllm_kunlun" / "patches" / "eval_frame.py", eval_frame)
        yield dict(stack, site=site, patch=patch)
    finally:
        eval_frame.write_bytes(torch_eval_frame)
        assert sh(py, str(script), "--revert").splitlines()[-1] == "Revert complete."


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_install_the_stack_into_a_venv(patched_stack, pins, tmp_path):
    """The image's install sequence gives every pinned version, the patches' expected
    results, torch's CUDA-compatible devices and vllm's server and console script."""
    comps = pins["kunlun_stack_components"]
    venv, py, env, sh = patched_stack["venv"], patched_stack["python"], patched_stack["env"], patched_stack["sh"]
    site = patched_stack["site"]
    expect = pins["kunlun_stack_patch_expect"]
    assert (
        "  Results: %d applied  |  0 skipped  |  %d failed  |  11 total" % (expect["applied"], expect["failed"])
        in patched_stack["patch"].splitlines()
    )
    # the 0.15.1-era tree's quantization file (vllm_kunlun/ops/quantization/__init__.py) is
    # empty: vllm's own module stays (the image build's rule)
    assert (site / "vllm_kunlun" / "ops" / "quantization" / "__init__.py").read_text() == ""

    dev = make_dev_dir(tmp_path / "dev", 8)
    probe = (
        "import importlib.metadata as m, json, torch, torch_xmlir, vllm, vllm_kunlun\n"
        "from vllm_kunlun import _kunlun\n"
        "import torch._dynamo.eval_frame as ef\n"
        "import vllm.model_executor.layers.quantization as q\n"
        "names = ['torch', 'kunlun_ops', 'triton', 'xspeedgate_ops', 'cocopod', 'vllm', 'vllm-kunlun', "
        "'transformers']\n"
        "print(json.dumps({'versions': {n: m.version(n) for n in names}, 'torch': torch.__version__,\n"
        "  'xpu': torch.xpu.device_count(), 'devices': torch_xmlir._XMLIRC._xpu_get_devices_number(),\n"
        "  'file': vllm_kunlun.__file__, 'kunlun': _kunlun.__file__, 'ef': ef._PATCHED_BY,\n"
        "  'q': q.get_quantization_config('compressed-tensors'), 'vllm': vllm.__version__,\n"
        "  'cuda': [torch.cuda.is_available(), torch.cuda.device_count(),\n"
        "           torch.arange(4, device='cuda:0').cpu().tolist(), str(torch.arange(4, device='cuda:0').device),\n"
        "           torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_properties(0).name]}))\n"
    )
    probe_env = dict(env, KUNLUN_SIM_DEV_DIR=str(dev), XPU_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    got = json.loads(sh(py, "-c", probe, cwd=tmp_path, env=probe_env).strip().splitlines()[-1])
    want = {
        "torch": comps["torch"]["version"],
        "kunlun_ops": comps["kunlun_ops"]["version"],
        "triton": comps["triton"]["version"],
        "xspeedgate_ops": comps["xspeedgate_ops"]["version"],
        "cocopod": comps["cocopod"]["version"],
        "vllm": comps["vllm"]["version"],
        "vllm-kunlun": comps["vllm_kunlun"]["version"],
        "transformers": comps["transformers"]["version"],
    }
    assert got["versions"] == want
    assert got["torch"] == "2.5.1" and got["vllm"] == "0.15.1"
    assert got["xpu"] == 0 and got["devices"] == 8
    # CUDA-compatible mode: the 8 XPUs are torch.cuda's, 96 GiB each (xpu-smi's 98304 MiB)
    assert got["cuda"] == [True, 8, [0, 1, 2, 3], "cuda:0", 98304 * 1024 * 1024, "P800 OAM"]
    assert got["file"].startswith(str(site)) and got["kunlun"].endswith(".so")
    assert got["ef"] and got["q"] == "compressed-tensors"
    # the installed wheel's server: argparse like vllm, `vllm` console script
    proc = subprocess.run(
        [py, "-m", "vllm.entrypoints.openai.api_server", "--bogus"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr
    assert sh(str(venv / "bin" / "vllm"), "--version").strip() == "0.15.1"


# uv comes with the controller toolchain (requirements.txt), in the venv beside pytest.
UV = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")


@pytest.mark.skipif(PY310 is None or UV is None, reason="needs uv (make setup) and " + NO_PY310)
def test_uv_install_path(built, pins, tmp_path):
    """The image's uv route: the vendor's sed recipe for the .run, and cocopod's variable."""
    out, _ = built
    comps = pins["kunlun_stack_components"]
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "-p", PY310, str(venv)], check=True)
    # setup.sh (after the sed) calls `uv` by name, as the image build does.
    env = dict(
        os.environ,
        VIRTUAL_ENV=str(venv),
        UV_OFFLINE="1",
        PATH=os.path.dirname(UV) + os.pathsep + os.environ.get("PATH", ""),
    )
    subprocess.run(
        ["bash", str(out / bundle_files(out)["torch"]), "--noexec", "--target", str(tmp_path / "xpytorch_unpack")],
        check=True,
        capture_output=True,
    )
    setup = tmp_path / "xpytorch_unpack" / "setup.sh"
    setup.write_text(setup.read_text().replace("pip", "uv pip").replace("CONDA_PREFIX", "VIRTUAL_ENV"))
    proc = subprocess.run(["bash", str(setup)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(
        [UV, "pip", "install", "--no-deps", str(out / bundle_files(out)["cocopod"])],
        env=dict(env, UV_SKIP_WHEEL_FILENAME_CHECK="1"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    probe = "import importlib.metadata as m; print(m.version('torch'), m.version('cocopod'))"
    got = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True)
    assert got.stdout.split() == [comps["torch"]["version"], comps["cocopod"]["version"]]
