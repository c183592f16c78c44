"""The driver stage's rolling pass on the served 3-host fleet (playbooks/driver.yml,
docs/upgrades.md): a driver upgrade across a serving fleet, one host at a time behind the
capacity gate, through the endpoint under load.

- check mode names every host it would drain and changes nothing;
- XRE 5.0.21.26 -> 5.0.21.27 (the sim inventory's site stack 0.15.1-4885de2-xre27: the
  validated combination on another XRE) under load: each host drained, serving stopped, the
  kit's installer run (modules reloaded), every card verified, serving restarted and gated,
  back into the gateway, in inventory order, each behind the capacity gate; no request lost;
- the way back to the inventory's XRE 5.0.21.26 with a gate the first host cannot pass: it is
  held out of the gateway with the reason (`kunlun-fleet status` names it; the serve stage
  refuses it and points to the driver stage), the pass stops, the two others keep serving
  untouched; the next run brings it back and finishes the pass; a serving host with a reboot
  pending that the policy does not allow is refused, not drained; a run after that changes
  nothing.

It runs last on the shared fleet's lane and leaves the fleet as it found it (every host on
XRE 5.0.21.26, serving, in the gateway)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet import vault
from kunlun_fleet.loadgen import Load
from kunlun_fleet.sim.config import host_address
from kunlun_fleet.sim.testing import INVENTORY, recap, ssh

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
XRE27_STACK, PIN, NEXT = "0.15.1-4885de2-xre27", "5.0.21.26", "5.0.21.27"
STOP_TASK = "TASK [driver : Rolling | Serving stopped]"

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def driver_play(*extra):
    return driver_play_of("playbooks/driver.yml", *extra)


def driver_play_of(playbook, *extra):
    # Results as JSON: one line each, so long messages (the capacity gate's) are not folded.
    env = dict(
        vault.vault_env(INVENTORY),
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", INVENTORY, playbook, *extra],
        cwd=ROOT,
        env=dict(os.environ, **env),
        text=True,
        capture_output=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout + proc.stderr


def loaded_driver(index):
    """The driver version xpu-smi prints (the loaded module's)."""
    out = ssh(index, "xpu-smi").stdout
    return re.search(r"Driver Version:\s*(\S+)", out).group(1)


def started_at(index):
    return ssh(index, "systemctl show -P ActiveEnterTimestampMonotonic kunlun-serve.service").stdout.strip()


def in_gateway():
    """The worker URLs the gateway on kf-node-1 routes to (its admin API, on its loopback)."""
    return json.loads(ssh(1, "curl -sf http://127.0.0.1:8081/list_workers").stdout)["urls"]


def listed(index, urls):
    return any("//%s:" % host_address(index) in u for u in urls)


def stopped_in_order(out):
    """The hosts of each `Serving stopped` task, in the order the run printed them."""
    order = []
    for block in out.split(STOP_TASK)[1:]:
        order += re.findall(r"^changed: \[(kf-node-\d)\]", block.split("\nTASK [")[0], re.M)
    return order


def endpoint():
    data = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return data["fleet_url"], data["model"], vault.read_api_key(INVENTORY)


@pytest.fixture(scope="module")
def on_the_pin(sim_fleet):
    """Every host serving on the pinned XRE, in the gateway."""
    assert [loaded_driver(i) for i in (1, 2, 3)] == [PIN] * 3
    assert all(listed(i, in_gateway()) for i in (1, 2, 3))
    return {i: started_at(i) for i in (1, 2, 3)}


def test_a_driver_upgrade_rolls_through_the_serving_fleet_under_load(on_the_pin):
    # Check mode: every host named for the pass, nothing drained, stopped or installed.
    rc, out = driver_play("-e", "kunlun_stack_stack=" + XRE27_STACK, "--check", "--diff")
    assert rc == 0, out[-6000:]
    assert out.count("is upgraded in the rolling pass, one host at a time") == 3, out[-4000:]
    for host in HOSTS:
        assert re.search(r"%s \(serving on XRE %s, the pin is %s\) would be drained" % (host, PIN, NEXT), out), out[
            -4000:
        ]
    assert {i: started_at(i) for i in (1, 2, 3)} == on_the_pin
    assert [loaded_driver(i) for i in (1, 2, 3)] == [PIN] * 3

    with Load(*endpoint(), clients=4, max_tokens=24) as load:
        rc, out = driver_play("-e", "kunlun_stack_stack=" + XRE27_STACK)
    print("driver rolling pass under load: %s" % load.summary())
    assert rc == 0, out[-6000:]
    # Nothing lost through the endpoint while each host in turn was drained and upgraded.
    assert load.failed == [], load.failed[:5]
    assert [loaded_driver(i) for i in (1, 2, 3)] == [NEXT] * 3
    assert all(listed(i, in_gateway()) for i in (1, 2, 3))
    # One host at a time in inventory order, each behind the capacity gate naming it.
    assert stopped_in_order(out) == HOSTS, out[-4000:]
    gates = re.findall(r"capacity: [^\"]*", out)
    for host in HOSTS:
        assert any(re.search(r"taking out %s\b" % host, g) for g in gates), (host, gates)
    # Each host back only after one stream reached the bar (the sim inventory's 15 tok/s).
    assert len(re.findall(r"kf-node-\d: one stream at [\d.]+ tok/s", out)) == 3, out[-4000:]
    # The load ran through the whole pass: served before the first restart and after each host's new start.
    after = {i: started_at(i) for i in (1, 2, 3)}
    assert all(after[i] != on_the_pin[i] for i in after)
    starts = sorted(int(after[i]) / 1e6 for i in after)
    assert load.served_at and min(load.served_at) < starts[0], (load.served_at[:3], starts)
    for host_start in starts:
        assert any(t > host_start for t in load.served_at), ("nothing served after a start", host_start)
    # The driver stage's facts name the new driver (what status and the upgrade plan read).
    facts = json.loads(ssh(2, "cat /etc/ansible/facts.d/xpu.fact").stdout)
    assert facts["driver"] == NEXT and facts["pin"] == NEXT and facts["count"] == 8


def test_a_host_that_fails_its_gate_is_held_out_and_the_rest_keep_serving(on_the_pin):
    # The way back to the inventory's XRE, with a bar no stand-in reaches: kf-node-1 gets
    # XRE 5.0.21.26 and then fails the gate that would put it back.
    before = {i: started_at(i) for i in (2, 3)}
    rc, out = driver_play("-e", "driver_upgrade_min_tokens_per_s=100000")
    assert rc != 0, out[-4000:]
    assert "kf-node-1 is held out of the gateways, kunlun-serve.service stopped" in out, out[-4000:]
    assert "below the 100000" in out, out[-4000:]
    reason = ssh(1, "cat /etc/kunlun-serve/held-out").stdout
    assert "driver rolling pass to XRE %s" % PIN in reason and "below the 100000" in reason, reason
    assert loaded_driver(1) == PIN
    assert ssh(1, "systemctl is-active kunlun-serve.service", check=False).stdout.strip() == "inactive"
    urls = in_gateway()
    assert not listed(1, urls) and listed(2, urls) and listed(3, urls), urls
    # The pass stopped there: the two others untouched, still serving on the new driver.
    assert {i: started_at(i) for i in (2, 3)} == before
    assert [loaded_driver(i) for i in (2, 3)] == [NEXT] * 2
    # The serve stage leaves it to the driver stage, which checks the driver before serving.
    rc, out = driver_play_of("playbooks/serve.yml", "--limit", "kf-node-1", "--check")
    assert rc != 0 and "kf-node-1 is held out of service: " in out and "run playbooks/driver.yml" in out, out[-3000:]
    # The operator's view names the host and the reason.
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), "status", "-i", INVENTORY, "--json"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
    )
    doc = json.loads(proc.stdout)
    rows = {r["host"]: r for r in doc["hosts"]}
    assert any(r.startswith("held out of service: ") and "below the 100000" in r for r in rows["kf-node-1"]["reasons"])
    assert rows["kf-node-2"]["healthy"] and rows["kf-node-3"]["healthy"], rows

    # Repaired (the bar back to the inventory's): the held-out host is retried and back, the pass finishes.
    rc, out = driver_play()
    assert rc == 0, out[-6000:]
    assert "kf-node-1: held out by an earlier rolling pass" in out, out[-4000:]
    # kf-node-1 first (its serving was already stopped: started again and gated), then the two others.
    assert stopped_in_order(out) == HOSTS[1:], out[-4000:]
    assert [h for h in re.findall(r"(kf-node-\d): one stream at [\d.]+ tok/s", out)] == HOSTS, out[-4000:]
    assert [loaded_driver(i) for i in (1, 2, 3)] == [PIN] * 3
    assert ssh(1, "test -e /etc/kunlun-serve/held-out", check=False).returncode != 0
    assert all(listed(i, in_gateway()) for i in (1, 2, 3))
    # A serving host with a reboot pending that the policy does not allow is refused as
    # before, not drained (check mode: nothing would change anyway).
    ssh(3, "touch /var/run/reboot-required")
    try:
        rc, out = driver_play("--limit", "kf-node-3", "--check")
    finally:
        ssh(3, "rm -f /var/run/reboot-required")
    assert rc != 0 and "needs a reboot" in out and "It was not rebooted" in out, out[-3000:]
    assert "would be drained" not in out, out[-3000:]
    # Idempotent: on the pin and serving, a run drains nothing and changes nothing.
    served = {i: started_at(i) for i in (1, 2, 3)}
    rc, out = driver_play()
    assert rc == 0, out[-6000:]
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap(out).values()), recap(out)
    assert {i: started_at(i) for i in (1, 2, 3)} == served
