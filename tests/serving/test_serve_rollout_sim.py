"""The serve stage's rollout on the 3-host sim fleet (converged and serving): an unchanged
fleet is checked on every host in one parallel pass and nothing is drained, restarted or
batched; a changed configuration rolls host by host, the canary (kf-node-1) first, each
batch behind the capacity gate, and the fleet ends serving its own configuration again.

Fleet lane: it restarts every host (like the e2e rolling restart), so it runs where no
other suite uses kf-node-2 and kf-node-3."""

import json
import os
import re
import subprocess

import pytest
import yaml

from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, recap, ssh

pytestmark = [pytest.mark.sim, pytest.mark.slow]

HOSTS = ("kf-node-1", "kf-node-2", "kf-node-3")
SIM_ENV = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars/all/sim.yml")))["serve_extra_env"]
RESTART_TASK = "TASK [serve : Restart | (Re)start kunlun-serve]"
GATE_TASK = "TASK [serve : Rollout | Capacity before this batch]"


def serve(*extra):
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, "playbooks/serve.yml", *extra],
                          cwd=REPO, env=dict(_env(), ANSIBLE_CALLBACK_RESULT_FORMAT="json"), text=True,
                          capture_output=True, timeout=1800)
    return proc.returncode, proc.stdout + proc.stderr


def with_env(env):
    return ["-e", json.dumps({"serve_extra_env": env})]


def invocations():
    return {h: ssh(i, "systemctl show --property InvocationID --value kunlun-serve.service").stdout.strip()
            for i, h in enumerate(HOSTS, 1)}


def restarted_in_order(out):
    """The hosts of each `(Re)start` task, in the order the run printed them."""
    order = []
    for block in out.split(RESTART_TASK)[1:]:
        order += re.findall(r"^changed: \[(kf-node-\d)\]", block.split("\nTASK [")[0], re.M)
    return order


@pytest.fixture
def serving_fleet(sim_fleet):
    """Every host on the sim inventory's own configuration (a rollout if it was not)."""
    rc, out = serve(*with_env(SIM_ENV))
    assert rc == 0, out[-4000:]
    yield
    rc, out = serve(*with_env(SIM_ENV))
    assert rc == 0, out[-4000:]
    assert "no host needs a restart" in serve(*with_env(SIM_ENV))[1]


def test_unchanged_fleet_restarts_nothing_and_runs_no_batch(serving_fleet):
    before = invocations()
    rc, out = serve(*with_env(SIM_ENV))
    assert rc == 0, out[-4000:]
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap(out).values()), out[-2000:]
    assert "rollout: no host needs a restart; every host was checked" in out, out[-3000:]
    # The batched play matched no host: no gate, no drain, no restart.
    assert "skipping: no hosts matched" in out.split("PLAY [Serve | Roll out")[1], out[-3000:]
    assert GATE_TASK not in out and RESTART_TASK not in out and "Take the host out" not in out
    # ... and every host was really checked: a completion on each, each in the gateway.
    ready = out.split("TASK [serve : Ready | /v1/models lists the model and a completion returns text]")[1]
    assert sorted(re.findall(r"^ok: \[(kf-node-\d)\]", ready.split("\nTASK [")[0], re.M)) == list(HOSTS)
    assert invocations() == before

    # Check mode agrees: nothing would change, no host would restart.
    rc, out = serve("--check", "--diff", *with_env(SIM_ENV))
    assert rc == 0, out[-4000:]
    assert all(r["changed"] == 0 for r in recap(out).values()), out[-2000:]
    assert "would be (re)started" not in out


def test_changed_configuration_rolls_host_by_host_canary_first(serving_fleet):
    before = invocations()
    changed = dict(SIM_ENV, KF_ROLLOUT_TEST="1")

    # Check mode names every host that would restart and changes nothing.
    rc, out = serve("--check", "--diff", *with_env(changed))
    assert rc == 0, out[-4000:]
    assert "rollout: 3 of 3 host(s) need a restart (kf-node-1, kf-node-2, kf-node-3)" in out, out[-3000:]
    assert out.count("kunlun-serve would be (re)started on kunlun-serving:current") == 3, out[-3000:]
    assert "+KF_ROLLOUT_TEST=1" in out
    assert invocations() == before
    assert all("KF_ROLLOUT_TEST" not in ssh(i, "cat /etc/kunlun-serve/serve.env").stdout for i in (1, 2, 3))

    rc, out = serve(*with_env(changed))
    assert rc == 0, out[-4000:]
    # Default bound on 3 hosts: one host, or 10% rounded down -> batches of one.
    assert "a canary, then at most 1 host(s) out of service at once (serve_max_unavailable=10% of 3)" in out, out[-3000:]
    assert restarted_in_order(out) == list(HOSTS), out[-4000:]
    # One gate per batch, each naming its one host and the load against the rest.
    gates = re.findall(r"capacity: .*", out)
    assert len([g for g in gates if "taking out" in g]) >= 3, gates
    for host in HOSTS:
        assert any("taking out %s " % host in g for g in gates), (host, gates)
    assert out.count(GATE_TASK) == 3
    after = invocations()
    assert all(after[h] != before[h] for h in HOSTS), (before, after)
    assert all("KF_ROLLOUT_TEST=1" in ssh(i, "cat /etc/kunlun-serve/serve.env").stdout for i in (1, 2, 3))
    assert all(ssh(i, "test -e /etc/kunlun-serve/restart-pending", check=False).returncode != 0 for i in (1, 2, 3))
