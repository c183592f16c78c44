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

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "stack_proof"
PINS = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())
COMPONENTS = PINS["kunlun_stack_components"]
KNOWN_BAD = PINS["kunlun_stack_known_bad"]


def recorded(name):
    """A probe report recorded from the probe's run in the stand-in image venv."""
    return json.loads((FIXTURES / name).read_text())


def evaluate(report, python_match="minor", device_count=8):
    problems = check_known_bad(sp.found_versions(report), KNOWN_BAD)
    rows = sp.judge(report, COMPONENTS, device_count, python_match, problems)
    return rows, [r for r in rows if not r["ok"]]


# ---------------------------------------------------------------- the judge, on recordings

def test_good_report_passes_every_check():
    rows, failed = evaluate(recorded("good.json"))
    assert failed == []
    names = [r["component"] for r in rows]
    for comp in ("python", "torch", "kunlun_ops", "triton", "xspeedgate_ops", "cocopod", "vllm",
                 "vllm_kunlun", "transformers", "torch.__version__",
                 "torch_xmlir._XMLIRC._xpu_get_devices_number()", "vllm_kunlun.__file__",
                 "from vllm_kunlun import _kunlun", "vllm_kunlun commit"):
        assert comp in names


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


def test_seven_devices_fail_with_the_count():
    _, failed = evaluate(recorded("seven_devices.json"))
    assert [(r["component"], r["expected"], r["found"]) for r in failed] == [
        ("torch_xmlir._XMLIRC._xpu_get_devices_number()", "8", "7")]


def test_known_bad_transformers_is_named_twice():
    report = recorded("good.json")
    report["versions"]["transformers"] = "5.5.3"
    _, failed = evaluate(report)
    assert [r["component"] for r in failed] == ["transformers", "known-bad combination"]
    assert failed[0]["expected"] == "5.2.0" and failed[0]["found"] == "5.5.3"
    assert "max_pixels" in failed[1]["found"]


def test_missing_package_and_failed_imports_are_reported_with_the_error():
    report = recorded("broken.json")
    _, failed = evaluate(report)
    by = {r["component"]: r for r in failed}
    assert by["cocopod"]["found"] == "(not installed)"
    assert "ImportError" in by["from vllm_kunlun import _kunlun"]["found"]
    assert by["vllm_kunlun.__file__"]["found"].startswith("/src/vllm-kunlun/")


def test_torch_xpu_is_not_what_counts():
    """A report has no torch.xpu field at all: the count comes from torch_xmlir only."""
    assert "torch.xpu" not in sp.PROBE_SOURCE.replace("never consulted", "")
    assert "_xpu_get_devices_number()" in sp.PROBE_SOURCE


def test_parse_ignores_noise_and_refuses_no_report():
    line = sp.PROBE_MARKER + json.dumps({"python": "3.10.19"})
    assert sp.parse_probe_output("warning from an import\n" + line + "\n")["python"] == "3.10.19"
    with pytest.raises(ValueError):
        sp.parse_probe_output("Traceback (most recent call last):\n")


def test_table_lines_up():
    rows = [{"component": "torch", "expected": "2.5.1", "found": "2.4.0", "ok": False},
            {"component": "known-bad combination", "expected": "absent", "found": "x", "ok": False}]
    lines = sp.format_table(rows).splitlines()
    assert lines[0].split("|")[0].strip() == "component"
    assert lines[2] == "torch                 | 2.5.1    | 2.4.0"
    assert len({line.index("|") for line in lines if "|" in line}) == 1


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

    cmd = stack_proof.probe_command("/usr/bin/docker", "img:1", "/opt/vllm_kunlun/bin/python",
                                    ["/dev/xpu0", "/dev/xpu1", "/dev/xpuctrl"], {"B": "2", "A": "1"}, "{}")
    assert "--privileged" not in cmd and cmd[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert cmd[cmd.index("--network") + 1] == "none"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--device"] == [
        "/dev/xpu0:/dev/xpu0", "/dev/xpu1:/dev/xpu1", "/dev/xpuctrl:/dev/xpuctrl"]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--env"] == ["A=1", "B=2"]
    assert cmd[cmd.index("--entrypoint") + 1] == "/opt/vllm_kunlun/bin/python"
    assert cmd[-4:] == ["img:1", "-c", sp.PROBE_SOURCE, "{}"]


def test_host_devices_numeric_order(tmp_path):
    import stack_proof

    for name in ("xpu10", "xpu2", "xpu0", "xpuctrl", "xpu1x", "xpu9"):
        (tmp_path / name).touch()
    assert stack_proof.host_devices(str(tmp_path)) == [
        str(tmp_path / n) for n in ("xpu0", "xpu2", "xpu9", "xpu10", "xpuctrl")]


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
    if a in ("--env", "--device", "--entrypoint", "--network", "--workdir", "--label"):
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
from standin_helpers import NO_PY310, install_stack, python310  # noqa: E402 (path set just above)

PY310 = python310()


@pytest.fixture(scope="module")
def stack_venv(tmp_path_factory):
    """A CPython 3.10 venv holding the stand-in stack, installed in the image's order."""
    from kunlun_fleet.sim import bundle

    tmp = tmp_path_factory.mktemp("proof")
    out = tmp / "bundle"
    bundle.build(str(out), force=True, log=lambda *_: None)
    stack = install_stack(out, tmp, COMPONENTS, PY310)
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
    args = {"image": "kunlun-serving:test", "components": copy.deepcopy(COMPONENTS), "known_bad": KNOWN_BAD,
            "device_count": 8, "python_match": "minor", "python": venv_info["python"],
            "env": PINS["kunlun_stack_serving_env"], "devices": paths + [str(devs / "xpuctrl")]}
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
    r = run_module(capsys, _module_args(fake_docker, 8))
    assert r.get("failed") is not True, r.get("msg")
    assert r["proven"] is True and r["changed"] is False
    rep = r["report"]
    assert rep["devices"] == 8 and rep["torch_version"] == "2.5.1"
    assert rep["vllm_kunlun_in_site_packages"] and rep["kunlun_extension"].endswith(".so")
    assert rep["versions"]["vllm_kunlun"] == "0.15.1.dev0" and rep["versions"]["transformers"] == "5.2.0"
    assert rep["executable"].startswith(str(fake_docker["venv"]))


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_finds_seven_devices_and_fails_with_the_table(fake_docker, capsys):
    r = run_module(capsys, _module_args(fake_docker, 7))
    assert r["failed"] is True and r["proven"] is False
    assert "1 of 14 checks failed" in r["msg"]
    assert "torch_xmlir._XMLIRC._xpu_get_devices_number() | 8        | 7" in r["msg"]
    assert r["report"]["devices"] == 7


@pytest.mark.slow
@pytest.mark.skipif(PY310 is None, reason=NO_PY310)
def test_probe_python_exact_names_the_patch_release(fake_docker, capsys):
    r = run_module(capsys, _module_args(fake_docker, 8, python_match="exact"))
    found = subprocess.run([PY310, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True).stdout.strip()
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
    proc = subprocess.run([fake_docker["python"], "-c", sp.PROBE_SOURCE, sp.probe_request(COMPONENTS)],
                          cwd=str(fake_docker["src"]), capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "KUNLUN_SIM_DEV_DIR": str(fake_docker["tmp"])})
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
    r = run_module(capsys, {"image": "img:1", "components": COMPONENTS, "devices": [],
                            "python": "/opt/vllm_kunlun/bin/python"})
    assert r["failed"] and "the probe did not run in image img:1" in r["msg"]


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
        proc = subprocess.run([venv_info["python"], "-c", sp.PROBE_SOURCE, sp.probe_request(COMPONENTS)],
                              cwd="/", capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "KUNLUN_SIM_DEV_DIR": str(dev),
                                   "XPU_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
        (FIXTURES / name).write_text(json.dumps(sp.parse_probe_output(proc.stdout), indent=1, sort_keys=True) + "\n")
    shutil.copy(FIXTURES / "good.json", FIXTURES / "broken.json")
