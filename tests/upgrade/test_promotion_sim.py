"""The promotion path on the served 3-host sim fleet (suite upgrade-sim, after
test_upgrade_sim.py and before the driver's rolling pass, which leaves another XRE:
docs/upgrades.md, "Tests"), in file order, each test starting from where the one before left
the fleet (the validated stack on its pinned XRE, as test_upgrade_sim.py, the e2e or a demo
leaves it; on a fleet a driver pass left, tests/upgrade/conftest.py puts the pin back first):

- the numerics candidate (0.15.1-e5a7c83): as fast, its greedy outputs diverge at token 6; the
  golden-output gate alone fails it and the canary goes back, the others untouched;
- a good candidate (0.15.1-7c1e0a2) promoted under load through the endpoint: the canary
  measured and passed, the rest promoted, every host serving it with the validated stack's
  image kept as `previous`, the inventory's stack line set, no request lost, and the canary
  not restarted again by the promotion;
- the rollback playbook on one host after that promotion: it serves the previous stack's image
  again, the others untouched;
- `--to` the previous stack: the way back, promoted the same way, every host on the very image
  it served before, the inventory byte for byte as it was.

The rollback playbook is proved here only, on the image a real promotion kept as `previous`
(the e2e leaves it out). On a served fleet (after `kunlun-fleet demo` or the e2e):
    .venv/bin/python tests/suites.py --only upgrade-sim

The upgrades before these (the stack served, a known-bad stack, the CPU-sampler candidate,
`--check`): tests/upgrade/test_upgrade_sim.py."""

import re
import subprocess

import pytest
from upgradekit import (
    GOOD,
    HOSTS,
    NUMERICS,
    ROLLED_BACK_STEPS,
    ROOT,
    STACK_FILE,
    VALIDATED,
    ask,
    endpoint,
    fleet_state,
    image_id,
    stack_of,
    step_output,
    upgrade,
)

from kunlun_fleet.loadgen import Load
from kunlun_fleet.sim.testing import INVENTORY

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def test_the_numerics_candidate_is_caught_by_the_golden_check(fleet_on_the_pinned_driver):
    """As fast as the stack it replaces, its greedy outputs diverge at the 6th token: the
    outputs gate alone fails it, and the canary goes back to the fleet's stack."""
    before, inventory_before = fleet_state(), STACK_FILE.read_text()
    rc, out, results, report = upgrade("--to", NUMERICS)
    assert rc == 2 and results["outcome"] == "rolled-back", out[-6000:]
    assert [(s["name"], s["result"]) for s in results["steps"]] == ROLLED_BACK_STEPS
    assert (results["canary"], results["baseline"]) == ("kf-node-1", "kf-node-2")
    assert results["gate"]["failed"] == ["outputs"], results["gate"]
    outputs = results["outputs"]
    assert outputs["passed"] is False and outputs["tolerance"] == {"min_agreeing_tokens": 0}, outputs["tolerance"]
    assert {d["diverges_at"] for d in outputs["divergences"]} == {6}, outputs["divergences"]
    assert "diverges at token 6" in results["reason"], results["reason"]
    # The canary serves the fleet's stack again; the others never changed; the inventory neither.
    after = fleet_state()
    assert after["kf-node-1"][0] == before["kf-node-1"][0] and after["kf-node-1"][1] != before["kf-node-1"][1]
    assert {h: after[h] for h in HOSTS[1:]} == {h: before[h] for h in HOSTS[1:]}
    assert STACK_FILE.read_text() == inventory_before
    assert "outputs" in (report / "report.md").read_text()


@pytest.fixture(scope="module")
def promoted(fleet_on_the_pinned_driver):
    """A good candidate promoted under load through the endpoint."""
    before, inventory_before = fleet_state(), STACK_FILE.read_text()
    with Load(*endpoint(), clients=4, max_tokens=24) as load:
        rc, out, results, report = upgrade("--to", GOOD)
    print("promotion under load: %s" % load.summary())
    return {
        "rc": rc,
        "out": out,
        "results": results,
        "report": report,
        "load": load,
        "before": before,
        "inventory_before": inventory_before,
        "after": fleet_state(),
    }


def test_a_good_candidate_is_promoted_to_every_host_under_load(promoted):
    rc, out, results = promoted["rc"], promoted["out"], promoted["results"]
    assert rc == 0 and results["outcome"] == "promoted", out[-6000:]
    # The canary passed every gate; then the rest, then the inventory's line. Same XRE: no driver step.
    assert [(s["name"], s["result"]) for s in results["steps"]] == [
        ("plan", "ok"),
        ("image", "ok"),
        ("canary", "ok"),
        ("measure", "ok"),
        ("promote", "ok"),
        ("inventory", "ok"),
    ]
    assert results["gate"]["passed"] and results["outputs"]["passed"], results["gate"]
    assert all(h["stack_before"] == VALIDATED and h["stack_after"] == GOOD and h["changed"] for h in results["hosts"])
    # No request lost through the endpoint while each host was drained and switched.
    load = promoted["load"]
    assert load.failed == [], load.failed[:5]
    assert load.ok > 0
    before, after = promoted["before"], promoted["after"]
    for i, host in enumerate(HOSTS, 1):
        # Each host serves the candidate's image (a new start), tagged current; the image it
        # served before is kept as previous, for the way back.
        assert after[host][1] != before[host][1], host
        assert after[host][0] == after[host][2] == image_id(i, "kunlun-serving:" + GOOD), host
        assert stack_of(i, after[host][0]) == GOOD
        assert image_id(i, "kunlun-serving:previous") == before[host][0], host
    # The inventory names the new stack, and only that line changed.
    lines = STACK_FILE.read_text().splitlines()
    old = promoted["inventory_before"].splitlines()
    assert [(a, b) for a, b in zip(old, lines, strict=True) if a != b] == [
        ('kunlun_stack_stack: "%s"' % VALIDATED, 'kunlun_stack_stack: "%s"' % GOOD)
    ]
    report = (promoted["report"] / "report.md").read_text()
    assert "PASS" in report and GOOD in report
    # The promotion restarts the rest only: the canary already serves the stack's image (the
    # unit pins the image by ID; the tag it was started from is not part of it).
    promote = step_output(results, "promote").split("TASK [serve : Restart | (Re)start kunlun-serve]")[1:]
    restarted = re.findall(r"^changed: \[(kf-node-\d)\]", "".join(b.split("\nTASK [")[0] for b in promote), re.M)
    assert restarted == HOSTS[1:], restarted


def test_the_rollback_playbook_serves_the_previous_stack_on_a_host(promoted):
    """playbooks/rollback.yml on one host (`kunlun-fleet stage rollback --limit`, an operator's
    batch) after the promotion: it serves the image tagged previous, the validated stack's,
    through the same drain and gates; the others stay. (Hosts one after another under load,
    each behind the capacity gate and drained: the driver stage's rolling pass,
    test_driver_rolling_sim.py; the serve rollout's batches from its plan:
    tests/unit/test_rollout_capacity.py.)"""
    others = {h: promoted["after"][h] for h in HOSTS[:2]}
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), "stage", "rollback", "-i", INVENTORY, "--limit", "kf-node-3", "--plain"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=1800,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    state = fleet_state()
    assert state["kf-node-3"][0] == promoted["before"]["kf-node-3"][0]
    assert stack_of(3, state["kf-node-3"][0]) == VALIDATED
    assert {h: state[h] for h in HOSTS[:2]} == others
    assert ask(*endpoint())


def test_to_the_previous_stack_is_the_way_back(promoted):
    """`--to` the stack served before the promotion: the same canary, gate and promotion, onto
    the images every host kept; the inventory as it was, byte for byte."""
    rc, out, results, _ = upgrade("--to", VALIDATED)
    assert rc == 0 and results["outcome"] == "promoted", out[-6000:]
    assert [s["name"] for s in results["steps"]] == [
        "plan",
        "image",
        "canary",
        "measure",
        "promote",
        "inventory",
    ]
    assert all(h["stack_after"] == VALIDATED for h in results["hosts"]), results["hosts"]
    after = fleet_state()
    for host in HOSTS:
        # The very image each host served before the round trip, now current again.
        assert after[host][0] == after[host][2] == promoted["before"][host][0], host
    assert STACK_FILE.read_text() == promoted["inventory_before"]
