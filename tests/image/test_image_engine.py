"""The rendered Dockerfile built for real (classic builder, no buildx) on the sim fleet's
engine from the stand-in bundle and base image, then proved from the inside with the
probe of stack_proof: 8 accelerator nodes pass, 7 fail on the count. Skipped when the sim
engine is down or the stand-in base image archive was not built."""

import os
import shutil
import subprocess
import sys

import pytest

from image_helpers import PINS, ROOT

pytestmark = [pytest.mark.sim, pytest.mark.slow]

SOCK = os.path.join(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"), "docker.sock")
BUNDLE = os.path.join(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"), "bundle")
ENV = dict(os.environ, DOCKER_HOST="unix://" + SOCK, DOCKER_API_VERSION="1.41", DOCKER_BUILDKIT="0")
TAG = "kunlun-serving:pytest-engine"


def docker(*args, **kw):
    return subprocess.run(["docker", *args], env=ENV, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def built_image(tmp_path_factory):
    if not os.path.exists(SOCK) or docker("info").returncode != 0:
        pytest.skip("the sim engine is not running (kunlun-fleet sim-up)")
    if docker("image", "inspect", PINS["kunlun_stack_base_image"]).returncode != 0:
        archive = os.path.join(BUNDLE, PINS["kunlun_stack_base_image_archive"])
        if not os.path.exists(archive):
            pytest.skip("no stand-in base image: python -m kunlun_fleet.sim.bundle build --with-base-image")
        assert docker("load", "-i", archive).returncode == 0
    from image_helpers import Site

    site = Site(tmp_path_factory.mktemp("engine"))
    site.bundle = type(site.bundle)(BUNDLE)
    site.vars = {"kunlun_stack_bundle_dir": BUNDLE, "image_registry": PINS["kunlun_stack_base_image"].split("/")[0]}
    ctx = site.tmp / "ctx"
    (ctx / "artifacts").mkdir(parents=True)
    for comp in PINS["kunlun_stack_components"].values():
        if "artifact" in comp:
            shutil.copy(os.path.join(BUNDLE, comp["artifact"]), ctx / "artifacts")
    playbook = site.tmp / "render.yml"
    playbook.write_text(
        "- hosts: image_builders[0]\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: image, tasks_from: validate.yml}\n"
        "    - ansible.builtin.copy: {content: '{{ image_dockerfile }}', dest: '%s/Dockerfile', mode: '0644'}\n"
        "      delegate_to: localhost\n" % ctx)
    rc, out = site.run(playbook, "-e", "ansible_python_interpreter=%s" % sys.executable)
    assert rc == 0, out[-3000:]
    proc = docker("build", "--no-cache", "-t", TAG, str(ctx), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "11 applied / 0 failed" in proc.stdout
    yield TAG
    docker("rmi", TAG)


def probe(image, nodes, tmp_path):
    sys.path.insert(0, str(ROOT / "library"))
    import stack_proof as mod
    from ansible.module_utils import stack_proof as sp
    from ansible.module_utils.kunlun_stack import check_known_bad

    devdir = tmp_path / "dev"
    devdir.mkdir()
    for name in ["xpu%d" % i for i in range(nodes)] + ["xpuctrl"]:
        subprocess.run(["mknod", str(devdir / name), "c", "1", "3"], check=True)
    comps = PINS["kunlun_stack_components"]
    devices = ["/dev/xpu%d" % i for i in range(nodes)] + ["/dev/xpuctrl"]
    cmd = mod.probe_command("docker", image, comps["python"]["venv"] + "/bin/python", devices,
                            PINS["kunlun_stack_serving_env"], sp.probe_request(comps))
    # the module passes /dev/xpuN:/dev/xpuN; here the host side is a scratch node
    cmd = ["%s/%s:%s" % (devdir, a.split(":")[0][5:], a.split(":")[1]) if a.startswith("/dev/xpu") else a for a in cmd]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    report = sp.parse_probe_output(proc.stdout)
    problems = check_known_bad(sp.found_versions(report), PINS["kunlun_stack_known_bad"])
    rows = sp.judge(report, comps, PINS["kunlun_stack_device_count"], "minor", problems)
    return report, [r for r in rows if not r["ok"]]


def test_labels_carry_every_pin(built_image):
    import json

    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", built_image).stdout)
    for name, comp in PINS["kunlun_stack_components"].items():
        assert labels["org.kunlun-fleet.pin.%s" % name] == comp["version"]
    assert labels["org.kunlun-fleet.pin.vllm_kunlun.commit"] == PINS["kunlun_stack_components"]["vllm_kunlun"]["commit"]


def test_the_built_image_proves(built_image, tmp_path):
    report, failed = probe(built_image, 8, tmp_path)
    assert failed == [], failed
    assert report["devices"] == 8 and report["kunlun_extension"].endswith(".so")
    assert report["executable"] == "/opt/vllm_kunlun/bin/python"


def test_seven_nodes_fail_the_proof(built_image, tmp_path):
    _, failed = probe(built_image, 7, tmp_path)
    assert [(r["component"], r["found"]) for r in failed] == [("torch_xmlir._XMLIRC._xpu_get_devices_number()", "7")]


def test_no_pip_in_the_venv(built_image):
    proc = docker("run", "--rm", "--entrypoint", "/bin/sh", built_image, "-c",
                  "test ! -e /opt/vllm_kunlun/bin/pip && command -v uv && ! ls /tmp/kunlun-artifacts")
    assert proc.returncode == 0, proc.stdout + proc.stderr
