"""The fleet the phase-1 suites leave, run again as an operator's scheduler would (suite
"rerun-sim", lane "fleet", after the e2e's tail: tests/suites.py): site.yml in the execution
environment, the job an AWX template makes, and `site.yml --check --diff` beside it. Both must
find nothing to do: the second run changes nothing (no restart, no image moved through the
builder's registry), check mode announces nothing.

The fleet here is the one `kunlun-fleet demo` delivered in the e2e (tests/e2e/test_site.py),
then benched, monitored (servers stopped and started again) and put through the image role's
scenario (its own idempotence: molecule/image). These two runs moved out of the e2e in stop 43:
both are the controller's CPU, and here, at the run's tail, the machine has cores to spare,
where in the e2e they shared them with every lane beside it (docs/performance.md). The
execution environment is built by the e2e, beside its first run; here its build is a cache hit
(or the build, when this suite runs alone)."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from kunlun_fleet import ee
from kunlun_fleet.sim.config import SIM_HOME
from kunlun_fleet.sim.testing import recap, ssh

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
RESTART_TASK = "TASK [serve : Restart | (Re)start kunlun-serve]"
pytestmark = pytest.mark.sim


def keep(name, text):
    """The run's output under reports/ (the recaps quoted in closing notes and reviews)."""
    (ROOT / "reports").mkdir(exist_ok=True)
    (ROOT / "reports" / name).write_text(text)


@pytest.fixture(scope="module")
def ee_image():
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "kunlun_fleet.ee", "build"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def converged_runs(sim_fleet, ee_image, tmp_path_factory):
    """The second run and check mode on the converged fleet, side by side: both find a fleet
    that needs nothing (the second run must change nothing, asserted below), so they run at
    once instead of one after the other (each is mostly the controller's CPU). Check mode
    keeps its own fact cache: the two never write the same files.

    The second run is the one an AWX job makes: site.yml through ansible-navigator in the
    execution environment (execution-environment.yml), which must find the fleet the
    runner delivered as converged as the runner left it."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", "site.yml"]
    check_env = dict(env, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path_factory.mktemp("check-facts")))
    # The sim inventory names files outside the project: the SSH key and the bundle (under
    # the sim's home) and this machine's CA certificates (group_vars/all/machine.yml). The
    # EE reaches the sim hosts as the controller does (the host's network).
    ee_cmd = ee.navigator_command(
        ee_image,
        "site.yml",
        "inventories/sim",
        mounts=[SIM_HOME, "/usr/local/share/ca-certificates"],
        container_options=["--network=host"],
        pass_env=["ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_FORCE_COLOR", "ANSIBLE_CALLBACK_RESULT_FORMAT"],
    )
    # The builder's clock before both runs: its registry's log since then (read below).
    stamp = ssh(1, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    time.sleep(1)
    # The engine's events, followed live from before the run (its history is a short ring
    # buffer that the other lanes' containers overwrite within minutes).
    events = subprocess.Popen(
        ["docker", "events", "--filter", "type=container", "--filter", "event=start", "--filter", "image=" + ee_image]
        + ["--format", "{{.Actor.Attributes.name}}"],
        env=ee.docker_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    procs = {
        "second": subprocess.Popen(
            ee_cmd, cwd=ROOT, env=ee.docker_env() | env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ),
        "check": subprocess.Popen(
            cmd + ["--check", "--diff"],
            cwd=ROOT,
            env=check_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    }
    outs = {name: proc.communicate(timeout=3600)[0] for name, proc in procs.items()}
    # ansible-runner marks each event in a container's output with an erased escape
    # sequence (invisible on a terminal): gone, the text is ansible-playbook's.
    outs["second"] = ee.plain_output(outs["second"])
    events.terminate()
    started_containers = events.communicate(timeout=60)[0].split()
    keep("e2e-second-run.log", outs["second"])
    keep("e2e-check-converged.log", outs["check"])
    found = {name: (procs[name].returncode, outs[name]) for name in procs}
    found["ee_image"], found["ee_containers"] = ee_image, started_containers
    found["registry_log"] = ssh(1, "journalctl -u kunlun-registry --since '%s' --no-pager -o cat" % stamp).stdout
    return found


def test_second_run_in_the_execution_environment_changes_nothing(converged_runs):
    rc, out = converged_runs["second"]
    assert rc == 0, out[-6000:]
    # It ran in the EE: the engine started a container of that image during the run.
    assert converged_runs["ee_containers"], "no container of %s started during the run" % converged_runs["ee_image"]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "second run changed: %s\n%s" % (changed, out[-4000:])
    # The serve stage checked every host for real (a completion each) and rolled nothing:
    # no batch, no drain, no restart.
    assert "rollout: no host needs a restart; every host was checked" in out, out[-3000:]
    assert RESTART_TASK not in out and "Take the host out" not in out
    ready = out.split("TASK [serve : Ready | /v1/models lists the model and a completion returns text]")[1]
    assert sorted(re.findall(r"^ok: \[(kf-node-\d)\]", ready.split("\nTASK [")[0], re.M)) == HOSTS, ready[:2000]
    # The image stage moved nothing either: the builder's registry logged no push and no
    # blob or manifest fetch during the re-run (nor during the check run beside it).
    log = converged_runs["registry_log"]
    assert not re.search(r'"(PUT|POST|PATCH) /v2/', log), log[-3000:]
    assert not re.search(r'"GET /v2/[^"]*/blobs/', log), log[-3000:]
    assert not re.search(r'"(GET|HEAD) /v2/[^"]*" .*"docker/', log), log[-3000:]


def test_check_diff_changes_nothing(converged_runs):
    rc, out = converged_runs["check"]
    assert rc == 0, out[-6000:]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "check mode reports changes on a converged fleet: %s\n%s" % (changed, out[-4000:])
    assert "would be (re)started" not in out
