"""Issue 6 item 5 end to end on the 3-host sim fleet: one build, three hosts hold the
image, the proof passes on each, a second run builds and sends nothing.

The hosts are reset first, then storage, engine and driver are converged, then the image
stage runs."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.sim.testing import recap, sim

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sim, pytest.mark.slow]
PINS = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
# The stand-in base image's Python is 3.10.x, not the pinned 3.10.19 (kunlun_fleet/sim/base_image.py).
EXTRA = ["-e", "image_proof_python_match=minor"]


def playbook(name, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", "playbooks/%s" % name,
                           *extra], cwd=ROOT, env=env, text=True, capture_output=True, timeout=3600)
    return proc.returncode, proc.stdout + proc.stderr


def adhoc(host, module, args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible"), "-i", "inventories/sim", host, "-m", module, "-a", args],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)
    # The JSON document follows the task-timing callback's lines (ansible.cfg enables it).
    start = proc.stdout.find("{")
    assert start >= 0, proc.stdout + proc.stderr
    result, _ = json.JSONDecoder().raw_decode(proc.stdout[start:])
    return result["plays"][0]["tasks"][0]["hosts"][host]


@pytest.fixture(scope="module")
def first_run(sim_fleet):
    # Bare hosts (other suites may have converged them); sim-up already built the bundle,
    # base image archive included.
    for host in HOSTS:
        sim("sim-reset", host)
    for stage in ("storage.yml", "engine.yml", "driver.yml"):
        rc, out = playbook(stage)
        assert rc == 0, "%s failed:\n%s" % (stage, out[-4000:])
    rc, out = playbook("image.yml", *EXTRA)
    assert rc == 0, out[-6000:]
    return out


def test_built_once_and_sent_to_the_two_others(first_run):
    # Task headers only (the timing summary at the end names slow tasks again).
    assert first_run.count("TASK [image : Build | Build the image") == 1
    streamed = re.findall(r"changed: \[(kf-node-\d) -> localhost\]", first_run.split("Stream the image")[1].split("TASK")[0])
    assert sorted(streamed) == ["kf-node-2", "kf-node-3"]


def test_every_host_holds_the_tag_and_proves_it(first_run):
    tag = re.search(r"serving image (kunlun-serving:[0-9a-f]{16})", first_run).group(1)
    ids = set()
    for host in HOSTS:
        info = adhoc(host, "community.docker.docker_image_info", "name=%s" % tag)
        assert len(info["images"]) == 1, host
        ids.add(info["images"][0]["Id"])
        proof = adhoc(host, "stack_proof", json.dumps({
            "image": tag, "components": PINS["kunlun_stack_components"], "python_match": "minor",
            "known_bad": PINS["kunlun_stack_known_bad"], "env": PINS["kunlun_stack_serving_env"]}))
        assert proof.get("proven") is True, proof.get("msg")
    assert len(ids) == 1


def test_second_run_builds_and_sends_nothing(first_run):
    rc, out = playbook("image.yml", *EXTRA)
    assert rc == 0, out[-4000:]
    assert all(v["changed"] == 0 for v in recap(out).values()), recap(out)


def test_check_mode_changes_nothing(first_run):
    rc, out = playbook("image.yml", "--check", "--diff", *EXTRA)
    assert rc == 0, out[-4000:]
    assert all(v["changed"] == 0 for v in recap(out).values()), recap(out)
