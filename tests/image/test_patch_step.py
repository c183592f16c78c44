"""The Dockerfile's install steps, run as written (bash) outside Docker: the patch step on
the stand-in torch and vllm-kunlun trees and on scripts that print what the vendor's
patch_torch251.py prints (its results line, a line of 64 "=", exit 1 when a patch failed);
which quantization module goes into place; the rewrite of the torch installer's setup.sh;
and where the vllm-kunlun build runs in tarballs with and without a top-level directory."""

import io
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from image_helpers import PINS, ROOT

ARTIFACTS = ROOT / "kunlun_fleet/sim/artifacts"
VENV_PYTHON = PINS["kunlun_stack_components"]["python"]["venv"] + "/bin/python"
RULE = "=" * 64


def render(site):
    """The RUN lines of the Dockerfile the role renders for this site's bundle (continuations
    joined)."""
    site.vars["image_registry"] = PINS["kunlun_stack_base_image"].split("/")[0]
    out_file = site.tmp / "Dockerfile"
    playbook = site.tmp / "render.yml"
    playbook.write_text(
        "- hosts: image_builders[0]\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: image, tasks_from: validate.yml}\n"
        "    - ansible.builtin.copy: {content: '{{ image_dockerfile }}', dest: '%s', mode: '0644'}\n"
        "      delegate_to: localhost\n" % out_file
    )
    rc, out = site.run(playbook, "-e", "ansible_python_interpreter=%s" % sys.executable)
    assert rc == 0, out[-3000:]
    text = out_file.read_text().replace("\\\n", " ")
    return [line[4:] for line in text.splitlines() if line.startswith("RUN ")]


def the_run(runs, marker):
    found = [r for r in runs if marker in r]
    assert len(found) == 1, (marker, runs)
    return found[0]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The stand-in bundle's site (its vllm-kunlun tarball as git archive --prefix writes
    it: one top-level directory) and the RUN lines for it."""
    from image_helpers import Site

    site = Site(tmp_path_factory.mktemp("render"))
    return site, render(site)


@pytest.fixture(scope="module")
def runs(rendered):
    return rendered[1]


@pytest.fixture(scope="module")
def patch_run(runs):
    return the_run(runs, "patch_torch251.py")


def stage(tmp_path, break_two=False, quant=None):
    """site-packages with the stand-in torch and vllm_kunlun, and a `python` for it.
    quant: {path under vllm_kunlun/: text} replacing the tree's quantization files."""
    site = tmp_path / "site"
    shutil.copytree(ARTIFACTS / "torch_src", site)
    shutil.copytree(ARTIFACTS / "vllm_kunlun_src/vllm_kunlun", site / "vllm_kunlun")
    vq = site / "vllm" / "model_executor" / "layers" / "quantization"
    vq.mkdir(parents=True)
    (vq / "__init__.py").write_text("# vllm's own\ndef get_quantization_config(q):\n    return q\n")
    if quant is not None:
        shutil.rmtree(site / "vllm_kunlun" / "ops" / "quantization")
        for rel, text in quant.items():
            (site / "vllm_kunlun" / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / "vllm_kunlun" / rel).write_text(text)
    if break_two:
        cfg = site / "torch" / "_inductor" / "config.py"
        cfg.write_text(cfg.read_text().replace('"ATEN,TRITON,CPP"', '"ATEN,TRITON"'))
        (site / "torch" / "utils" / "_triton.py").unlink()
    py = tmp_path / "python"
    py.write_text(
        '#!/bin/sh\nif [ "$1" = -c ]; then echo %s; exit 0; fi\nPYTHONPATH=%s exec %s "$@"\n'
        % (site, site, sys.executable)
    )
    py.chmod(0o755)
    return site, py


def run_step(line, py, cwd=None):
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", line.replace(VENV_PYTHON, str(py))], capture_output=True, text=True, cwd=cwd
    )


def fake_script(site, stdout, rc):
    """patch_torch251.py replaced by one that prints `stdout` and exits `rc`."""
    (site / "vllm_kunlun/patches/patch_torch251.py").write_text(
        "import sys\nsys.stdout.write(%r)\nsys.exit(%d)\n" % (stdout, rc)
    )


def vendor_output(applied, skipped, failed, fail_files=()):
    """What the vendor's script prints (vLLM-Kunlun 8986d8c, vllm_kunlun/patches/patch_torch251.py)."""
    lines = [
        RULE,
        "  vLLM Compatibility Patch for PyTorch 2.5.1",
        "  Total patches: 11",
        "",
        "  NOTE: These patches are TEMPORARY. Remove them after",
        "        upgrading to PyTorch 2.9+.",
        RULE,
    ]
    for name in fail_files:
        lines += [
            "",
            "Patch: %s (lines 378-380)" % name,
            "  Description: x",
            "  FAIL: Original code not found. The file may have been modified or the vLLM version may differ.",
        ]
    lines += ["", RULE, "  Results: %d applied  |  %d skipped  |  %d failed  |  11 total" % (applied, skipped, failed)]
    if applied:
        lines += ["  Original files backed up as .bak", "  To revert: python patch_torch251.py --revert"]
    return "\n".join(lines + [RULE]) + "\n"


def quant_of(site):
    return (site / "vllm/model_executor/layers/quantization/__init__.py").read_text()


def test_patch_step_passes_on_torch_251_and_copies_eval_frame(patch_run, tmp_path):
    site, py = stage(tmp_path)
    proc = run_step(patch_run, py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # the vendor's script's own lines, in the build log
    assert "  Results: 11 applied  |  0 skipped  |  0 failed  |  11 total" in lines
    assert lines[lines.index("  Results: 11 applied  |  0 skipped  |  0 failed  |  11 total") + 3] == RULE
    assert (site / "torch/_dynamo/eval_frame.py").read_text() == (
        site / "vllm_kunlun/patches/eval_frame.py"
    ).read_text()


def test_patch_step_fails_the_build_when_patches_fail(patch_run, tmp_path):
    site, py = stage(tmp_path, break_two=True)
    proc = run_step(patch_run, py)
    assert proc.returncode == 1
    assert (
        "expected a results line with 11 applied and 0 failed and exit status 0, saw Results: 9 applied  "
        "|  0 skipped  |  2 failed  |  11 total and exit status 1." in proc.stderr
    ), proc.stderr
    assert "torch/_inductor/config.py (lines 4): Original code not found" in proc.stderr
    assert "torch/utils/_triton.py (lines 19-20): File not found" in proc.stderr
    # nothing was copied over torch
    assert (site / "torch/_dynamo/eval_frame.py").read_text() != (
        site / "vllm_kunlun/patches/eval_frame.py"
    ).read_text()


def test_the_vendor_s_results_line_passes(patch_run, tmp_path):
    """The vendor's output, whose last line is a rule of 64 "=" (the defect: a check of the
    last line for "11 applied / 0 failed" refused every real build)."""
    site, py = stage(tmp_path)
    fake_script(site, vendor_output(11, 0, 0), 0)
    proc = run_step(patch_run, py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "torch/_dynamo/eval_frame.py").read_text() == (
        site / "vllm_kunlun/patches/eval_frame.py"
    ).read_text()


@pytest.mark.parametrize(
    "stdout, rc, saw",
    [
        # the counts match, the script says otherwise: its exit status is honoured
        (
            vendor_output(11, 0, 0),
            1,
            "saw Results: 11 applied  |  0 skipped  |  0 failed  |  11 total and exit status 1.",
        ),
        # a second run on patched files: nothing applied
        (
            vendor_output(0, 11, 0),
            0,
            "saw Results: 0 applied  |  11 skipped  |  0 failed  |  11 total and exit status 0.",
        ),
        (
            vendor_output(10, 0, 1, ["vllm/attention/layer.py"]),
            1,
            "saw Results: 10 applied  |  0 skipped  |  1 failed  |  11 total and exit status 1. Failed: "
            "vllm/attention/layer.py (lines 378-380): Original code not found.",
        ),
        # the line this project once took for the script's: no results line at all
        ("11 applied / 0 failed\n", 0, "saw no results line (last line: 11 applied / 0 failed) and exit status 0."),
    ],
)
def test_the_check_says_what_it_expected_and_what_it_saw(patch_run, tmp_path, stdout, rc, saw):
    site, py = stage(tmp_path)
    fake_script(site, stdout, rc)
    proc = run_step(patch_run, py)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "patch_torch251.py: expected a results line with 11 applied and 0 failed and exit status 0, " in proc.stderr
    assert saw in proc.stderr, proc.stderr
    assert "the installed ones are not" in proc.stderr


def test_the_0_15_1_era_quantization_file_keeps_vllm_s_module(patch_run, tmp_path):
    """The public 0.15.1-era tree has vllm_kunlun/ops/quantization/__init__.py, empty: it
    is not copied over vllm's quantization module (which it would empty), and the log
    says so."""
    site, py = stage(tmp_path)
    assert (site / "vllm_kunlun/ops/quantization/__init__.py").read_text() == ""
    assert not (site / "vllm_kunlun/quantization").exists()
    proc = run_step(patch_run, py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "vllm-kunlun quantization: vllm_kunlun/ops/quantization/__init__.py is no replacement of vllm's "
        "quantization module (it defines no get_quantization_config); vllm's own module kept" in proc.stdout
    )
    assert quant_of(site).startswith("# vllm's own")


@pytest.mark.parametrize(
    "quant, copied",
    [
        # the later top-level directory (2026-03-31) wins over ops/
        (
            {
                "quantization/__init__.py": "def get_quantization_config(q):\n    return 'kunlun'\n",
                "ops/quantization/__init__.py": "",
            },
            "vllm_kunlun/quantization/__init__.py",
        ),
        (
            {"ops/quantization/__init__.py": "def get_quantization_config(q):\n    return 'kunlun'\n"},
            "vllm_kunlun/ops/quantization/__init__.py",
        ),
        ({}, None),
    ],
)
def test_the_quantization_module_that_exists_is_copied(patch_run, tmp_path, quant, copied):
    site, py = stage(tmp_path, quant=quant)
    proc = run_step(patch_run, py)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if copied:
        assert (
            "vllm-kunlun quantization: copied %s over vllm/model_executor/layers/quantization/__init__.py" % copied
            in proc.stdout
        )
        assert quant_of(site) == quant[copied.split("/", 1)[1]]
    else:
        assert (
            "vllm-kunlun quantization: the tree has no vllm_kunlun/quantization/__init__.py nor "
            "vllm_kunlun/ops/quantization/__init__.py; vllm's own module kept" in proc.stdout
        )
        assert quant_of(site).startswith("# vllm's own")


SETUP_SH = """#!/bin/bash
set -e
pip install --no-deps a.whl
pip3 install b.whl
uv pip install c.whl
    pip install --upgrade d.whl
if [ -n "$X" ]; then pip install e.whl; fi
V=$(pip --version) && pip3 list | grep torch
sudo pip install f.whl
echo "installing with pip into ${CONDA_PREFIX}"
"${CONDA_PREFIX}/bin/python" -m pip install g.whl
pip-compile h.in; pipx run i
"""
SETUP_SH_UV = """#!/bin/bash
set -e
uv pip install --no-deps a.whl
uv pip install b.whl
uv pip install c.whl
    uv pip install --upgrade d.whl
if [ -n "$X" ]; then uv pip install e.whl; fi
V=$(uv pip --version) && uv pip list | grep torch
sudo uv pip install f.whl
echo "installing with pip into ${VIRTUAL_ENV}"
"${VIRTUAL_ENV}/bin/python" -m pip install g.whl
pip-compile h.in; pipx run i
"""


def test_setup_sh_rewrite_touches_only_pip_commands(runs, tmp_path):
    """The torch .run's setup.sh: every pip/pip3 command becomes `uv pip`, once; `uv pip`,
    words that contain pip and pip as an argument stay as they are."""
    line = the_run(runs, "xpytorch_unpack/setup.sh")
    sed = re.search(r"(sed -i -E '.*?' )/tmp/xpytorch_unpack/setup.sh", line).group(1)
    script = tmp_path / "setup.sh"
    script.write_text(SETUP_SH)
    proc = subprocess.run(["bash", "-c", sed + str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert script.read_text() == SETUP_SH_UV


def tarball(path, files, top="", commit=None):
    """A source tarball of `files` ({name: text}), under `top`/ when given; with `commit`
    in git archive's pax global header."""
    kw = {"format": tarfile.PAX_FORMAT, "pax_headers": {"comment": commit}} if commit else {}
    with tarfile.open(path, "w:gz", **kw) as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo((top + "/" if top else "") + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def build_step_calls(line, tarball, tmp_path):
    """The build step run with `tarball` in its context: the directories setup.py ran in."""
    work = tmp_path / "ctx"
    work.mkdir()
    shutil.copy(tarball, work)
    py = tmp_path / "python"
    log = tmp_path / "calls"
    py.write_text(
        '#!/bin/sh\n[ -f setup.py ] || { echo "no setup.py in $PWD" >&2; exit 1; }\necho "$PWD $*" >> %s\n' % log
    )
    py.chmod(0o755)
    proc = run_step(line.replace("/tmp/vllm-kunlun", str(tmp_path / "vk")), py, cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return log.read_text().splitlines()


def test_the_vllm_kunlun_build_runs_in_the_tarball_s_top_directory(rendered, tmp_path):
    """git archive with --prefix (the stand-in's tarball, as the vendor's) and every sdist
    put the tree in one directory: the build step runs setup.py there."""
    site, runs = rendered
    tarball = site.bundle / site.files()["vllm_kunlun"]
    with tarfile.open(tarball) as tar:
        (top,) = {m.name.split("/", 1)[0] for m in tar.getmembers()}
    where = str(tmp_path / "vk" / top)
    assert build_step_calls(the_run(runs, "setup.py build"), tarball, tmp_path) == [
        "%s setup.py build" % where,
        "%s setup.py install" % where,
    ]


def test_the_vllm_kunlun_build_runs_at_the_root_of_a_tarball_without_a_top_directory(tmp_path):
    """git archive without --prefix puts the tree at the root: the build step runs setup.py
    there (the Dockerfile rendered for such a bundle)."""
    from kunlun_fleet.sim import bundle as sim
    from image_helpers import Site

    site = Site(tmp_path / "site")
    (stale,) = [p for p in site.vendor.iterdir() if p.name.startswith("vllm-kunlun-0.15.1.dev0-")]
    stale.unlink()
    tarball(
        site.vendor / "vllm-kunlun-0.15.1.dev0-4885de2.tar.gz",
        {"setup.py": "# setup.py\n", "pyproject.toml": '[project]\nname = "vllm-kunlun"\nversion = "0.15.1.dev0"\n'},
        "",
        sim.VLLM_KUNLUN_COMMIT_IDS["4885de2"],
    )
    site.rebuild()
    line = the_run(render(site), "setup.py build")
    where = str(tmp_path / "vk")
    assert build_step_calls(line, site.bundle / site.files()["vllm_kunlun"], tmp_path) == [
        "%s setup.py build" % where,
        "%s setup.py install" % where,
    ]
