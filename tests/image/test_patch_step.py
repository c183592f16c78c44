"""The Dockerfile's patch step, run as written (bash) on the stand-in torch and
vllm-kunlun trees: it passes on torch 2.5.1 and copies the two files; on a torch where
two patches cannot apply it fails the build with the count it saw."""

import re
import shutil
import subprocess
import sys

import pytest

from image_helpers import PINS, ROOT

ARTIFACTS = ROOT / "kunlun_fleet/sim/artifacts"


@pytest.fixture(scope="module")
def patch_run(tmp_path_factory):
    """The RUN line of the patch step, from the Dockerfile the role renders."""
    from image_helpers import Site

    site = Site(tmp_path_factory.mktemp("render"))
    site.vars["image_registry"] = PINS["kunlun_stack_base_image"].split("/")[0]
    out_file = site.tmp / "Dockerfile"
    playbook = site.tmp / "render.yml"
    playbook.write_text(
        "- hosts: image_builders[0]\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: image, tasks_from: validate.yml}\n"
        "    - ansible.builtin.copy: {content: '{{ image_dockerfile }}', dest: '%s', mode: '0644'}\n"
        "      delegate_to: localhost\n" % out_file)
    rc, out = site.run(playbook, "-e", "ansible_python_interpreter=%s" % sys.executable)
    assert rc == 0, out[-3000:]
    text = out_file.read_text().replace("\\\n", " ")
    runs = [line[4:] for line in text.splitlines() if line.startswith("RUN ") and "patch_torch251.py" in line]
    assert len(runs) == 1
    return runs[0]


def stage(tmp_path, break_two):
    """site-packages with the stand-in torch and vllm_kunlun, and a `python` for it."""
    site = tmp_path / "site"
    shutil.copytree(ARTIFACTS / "torch_src", site)
    shutil.copytree(ARTIFACTS / "vllm_kunlun_src/vllm_kunlun", site / "vllm_kunlun")
    quant = site / "vllm" / "model_executor" / "layers" / "quantization"
    quant.mkdir(parents=True)
    (quant / "__init__.py").write_text("# vllm's own\n")
    if break_two:
        cfg = site / "torch" / "_inductor" / "config.py"
        cfg.write_text(cfg.read_text().replace('"ATEN,TRITON,CPP"', '"ATEN,TRITON"'))
        (site / "torch" / "utils" / "_triton.py").unlink()
    py = tmp_path / "python"
    py.write_text('#!/bin/sh\nif [ "$1" = -c ]; then echo %s; exit 0; fi\nPYTHONPATH=%s exec %s "$@"\n'
                  % (site, site, sys.executable))
    py.chmod(0o755)
    return site, py


def run_step(line, py):
    venv_python = PINS["kunlun_stack_components"]["python"]["venv"] + "/bin/python"
    cmd = line.replace(venv_python, str(py))
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)


def test_patch_step_passes_on_torch_251_and_copies_the_files(patch_run, tmp_path):
    site, py = stage(tmp_path, break_two=False)
    proc = run_step(patch_run, py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "11 applied / 0 failed"
    assert (site / "torch/_dynamo/eval_frame.py").read_text() == \
        (site / "vllm_kunlun/patches/eval_frame.py").read_text()
    assert (site / "vllm/model_executor/layers/quantization/__init__.py").read_text() == \
        (site / "vllm_kunlun/quantization/__init__.py").read_text()


def test_patch_step_fails_the_build_when_patches_fail(patch_run, tmp_path):
    site, py = stage(tmp_path, break_two=True)
    proc = run_step(patch_run, py)
    assert proc.returncode == 1
    assert re.search(r"patch_torch251.py did not report '11 applied / 0 failed' \(last line: 9 applied / 2 failed\)",
                     proc.stderr), proc.stderr
    # nothing was copied over torch
    assert (site / "torch/_dynamo/eval_frame.py").read_text() != (site / "vllm_kunlun/patches/eval_frame.py").read_text()
