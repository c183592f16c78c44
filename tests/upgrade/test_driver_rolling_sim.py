"""The driver stage's rolling pass on the served 3-host fleet (playbooks/driver.yml,
docs/upgrades.md): a driver upgrade across a serving fleet, one host at a time behind the
capacity gate, through the endpoint under load, with a host that fails held out.

- check mode names every host it would drain and changes nothing;
- XRE 5.0.21.26 -> 5.0.21.27 (the sim inventory's site stack 0.15.1-4885de2-xre27: the
  validated combination on another XRE) under load through the endpoint, first with a bar
  no stand-in reaches: kf-node-1 is drained, gets the new driver, fails the bar and is held
  out of the gateway with the reason (`kunlun-fleet status` names it), the pass stops, the
  two others keep serving untouched; then with the inventory's bar: kf-node-1 retried and
  back, kf-node-2 and kf-node-3 drained, upgraded (the kit's installer reloads the modules),
  every card verified, restarted, gated and back, each behind the capacity gate; no request
  lost through either run.

A run that finds every host on its pin changes nothing: the e2e's second run of site.yml
(tests/e2e/test_site.py: the driver stage's plays with every host serving).

The serve stage's refusal of a held-out host: tests/serving/test_serve_bad_input_sim.py; a
serving host with a reboot the policy forbids, refused and not drained:
tests/driver/test_driver_faults.py. The way back to XRE 5.0.21.26 is the same pass (a
driver that is not the pin) and is left out for the suite's time: this runs last on the
shared fleet's lane and leaves the fleet serving on XRE 5.0.21.27 (the phase-2 suites after
it do not run the driver stage; on a reused fleet tests/upgrade/conftest.py puts the pin back
first). The stack upgrades and the promotion path (test_upgrade_sim.py, test_promotion_sim.py)
run before it in the same suite, on the pinned XRE, so nothing puts the pin back in between."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet import vault
from kunlun_fleet.loadgen import Load
from kunlun_fleet.sim.config import host_address
from kunlun_fleet.sim.testing import INVENTORY, loaded_driver, ssh

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
XRE27_STACK, PIN, NEXT = "0.15.1-4885de2-xre27", "5.0.21.26", "5.0.21.27"
STOP_TASK = "TASK [driver : Rolling | Serving stopped]"

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def driver_play(*extra):
    # Results as JSON: one line each, so long messages (the capacity gate's) are not folded.
    env = dict(
        vault.vault_env(INVENTORY),
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", INVENTORY, "playbooks/driver.yml", *extra],
        cwd=ROOT,
        env=dict(os.environ, **env),
        text=True,
        capture_output=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout + proc.stderr


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
def on_the_pin(fleet_on_the_pinned_driver):
    """Every host serving on the pinned XRE (tests/upgrade/conftest.py), in the gateway."""
    assert fleet_on_the_pinned_driver == PIN
    assert all(listed(i, in_gateway()) for i in (1, 2, 3))
    return {i: started_at(i) for i in (1, 2, 3)}


def status_reasons():
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), "status", "-i", INVENTORY, "--json"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
    )
    return {r["host"]: r["reasons"] for r in json.loads(proc.stdout)["hosts"]}


def test_a_driver_upgrade_rolls_through_the_serving_fleet_under_load_holding_out_a_host_that_fails(on_the_pin):
    new_stack = ("-e", "kunlun_stack_stack=" + XRE27_STACK)
    # Check mode: every host named for the pass, nothing drained, stopped or installed.
    rc, out = driver_play(*new_stack, "--check", "--diff")
    assert rc == 0, out[-6000:]
    assert out.count("is upgraded in the rolling pass, one host at a time") == 3, out[-4000:]
    for host in HOSTS:
        assert re.search(r"%s \(serving on XRE %s, the pin is %s\) would be drained" % (host, PIN, NEXT), out), out[
            -4000:
        ]
    assert {i: started_at(i) for i in (1, 2, 3)} == on_the_pin
    assert [loaded_driver(i) for i in (1, 2, 3)] == [PIN] * 3

    with Load(*endpoint(), clients=4, max_tokens=24) as load:
        # A bar no stand-in reaches: kf-node-1 gets the driver, fails the bar, is held out.
        rc_held, out_held = driver_play(*new_stack, "-e", "driver_upgrade_min_tokens_per_s=100000")
        held = {
            "reason": ssh(1, "cat /etc/kunlun-serve/held-out").stdout,
            "drivers": [loaded_driver(i) for i in (1, 2, 3)],
            "active": ssh(1, "systemctl is-active kunlun-serve.service", check=False).stdout.strip(),
            "urls": in_gateway(),
            "starts": {i: started_at(i) for i in (2, 3)},
            "status": status_reasons(),
        }
        # Repaired (the inventory's bar): kf-node-1 retried and back, then the two others.
        rc, out = driver_play(*new_stack)
    print("driver rolling pass under load: %s" % load.summary())

    assert rc_held != 0, out_held[-4000:]
    assert "kf-node-1 is held out of the gateways, kunlun-serve.service stopped" in out_held, out_held[-4000:]
    assert "driver rolling pass to XRE %s" % NEXT in held["reason"] and "below the 100000" in held["reason"], held
    assert held["drivers"] == [NEXT, PIN, PIN] and held["active"] == "inactive", held
    assert not listed(1, held["urls"]) and listed(2, held["urls"]) and listed(3, held["urls"]), held
    # The pass stopped there: the two others untouched, serving on their driver.
    assert held["starts"] == {i: on_the_pin[i] for i in (2, 3)}, held
    # The operator's view names the host and the reason.
    assert any(r.startswith("held out of service: ") and "below the 100000" in r for r in held["status"]["kf-node-1"])
    assert held["status"]["kf-node-2"] == [] and held["status"]["kf-node-3"] == [], held["status"]

    assert rc == 0, out[-6000:]
    # Nothing lost through the endpoint, through either run.
    assert load.failed == [], load.failed[:5]
    assert "kf-node-1: held out by an earlier rolling pass" in out, out[-4000:]
    assert [loaded_driver(i) for i in (1, 2, 3)] == [NEXT] * 3
    assert ssh(1, "test -e /etc/kunlun-serve/held-out", check=False).returncode != 0
    assert all(listed(i, in_gateway()) for i in (1, 2, 3))
    # One host at a time in inventory order, each behind the capacity gate naming it; kf-node-1's
    # serving was already stopped (started again and gated), the others stopped by this run.
    assert stopped_in_order(out_held) == ["kf-node-1"] and stopped_in_order(out) == HOSTS[1:], out[-4000:]
    gates = re.findall(r"capacity: [^\"]*", out_held + out)
    for host in HOSTS:
        assert any(re.search(r"taking out %s\b" % host, g) for g in gates), (host, gates)
    # Each host back only after one stream reached the bar (the sim inventory's 15 tok/s).
    assert re.findall(r"(kf-node-\d): one stream at [\d.]+ tok/s", out) == HOSTS, out[-4000:]
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
