"""`kunlun-fleet upgrade` on the served 3-host fleet the phase-1 suites leave (docs/upgrades.md),
in file order, each test starting from where the one before left the fleet:

- an upgrade to the stack already served: unchanged, nothing restarted;
- a known-bad stack (0.25.1-2fda97b) refused by name, its reason shown, nothing changed;
- the CPU-sampler candidate (0.15.1-b3f9d41: ready, 32 tok/s single stream, above the 30 tok/s
  line) under load through the endpoint: its image distributed ahead to every host, the
  canary switched and measured against the baseline, caught by the throughput gate, put back
  on its image; no other host ever changed, no request lost, the inventory untouched, the
  report naming the gate with both figures;
- `--check` to the stack on another XRE (0.15.1-4885de2-xre27): what would happen, the canary's
  driver pass named, nothing built, pulled, tagged, drained, installed or restarted.

The numerics candidate (0.15.1-e5a7c83) caught by the golden-output gate, a good candidate
(0.15.1-7c1e0a2) promoted under load, the rollback playbook after it and `--to` the previous
stack back: tests/upgrade/test_promotion_sim.py, right after this file in the same suite
(upgrade-sim), on the fleet this file leaves. The golden-output gate's verdict on the
numerics stack's engine itself: tests/artifacts/test_stack_variants.py.

The driver's own rolling pass (a host held out and brought back): test_driver_rolling_sim.py,
last in the suite. The orchestration's branches: tests/unit/test_upgrade_run.py; the stand-in
stacks' behaviour itself: tests/artifacts/test_stack_variants.py."""

import pytest
from upgradekit import (
    CPU_SAMPLER,
    KNOWN_BAD,
    OTHER_XRE,
    ROLLED_BACK_STEPS,
    STACK_FILE,
    VALIDATED,
    endpoint,
    fleet_state,
    serving_images,
    stack_of,
    step_output,
    upgrade,
)

from kunlun_fleet.loadgen import Load
from kunlun_fleet.sim.testing import loaded_driver, ssh

pytestmark = [pytest.mark.sim, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(fleet_on_the_pinned_driver):
    """The fleet as phase 1 leaves it: every host on the validated stack and its XRE. An upgrade
    to that stack is the first test: it must change nothing. Returns the fleet's state after
    that upgrade (what the tests after compare with), its results and the state before it."""
    before = fleet_state()
    rc, out, results, _ = upgrade("--to", VALIDATED)
    assert rc == 0 and results["outcome"] == "unchanged", out[-4000:]
    return fleet_state(), results, before


def test_an_upgrade_to_the_stack_served_changes_nothing(served):
    after, results, before = served
    assert [s["name"] for s in results["steps"]] == ["plan"]
    assert all(h["stack_before"] == h["stack_after"] == VALIDATED for h in results["hosts"])
    assert not any(h["changed"] for h in results["hosts"]), results["hosts"]
    # Nothing restarted, no image or tag moved on any host.
    assert after == before


def test_a_known_bad_stack_is_refused_by_name_and_nothing_changes(served):
    rc, out, results, _ = upgrade("--to", KNOWN_BAD)
    assert rc == 3 and results["outcome"] == "refused", out[-3000:]
    assert "stack %s: known-bad" % KNOWN_BAD in results["reason"] and "causal_conv1d" in results["reason"]
    assert [s["name"] for s in results["steps"]] == ["plan"]
    assert fleet_state() == served[0]
    tags = ssh(1, "docker images --format '{{.Tag}}' kunlun-serving").stdout.split()
    assert KNOWN_BAD not in tags, tags


def test_the_cpu_sampler_candidate_is_caught_by_the_canary_and_rolled_back_under_load(served):
    served = served[0]
    inventory_before = STACK_FILE.read_text()
    with Load(*endpoint(), clients=4, max_tokens=24) as load:
        rc, out, results, report = upgrade("--to", CPU_SAMPLER)
    print("upgrade under load: %s" % load.summary())
    assert rc == 2 and results["outcome"] == "rolled-back", out[-6000:]
    # Nothing lost through the endpoint while the canary was drained, switched, measured and put back.
    assert load.failed == [], load.failed[:5]
    assert load.ok > 0
    assert [(s["name"], s["result"]) for s in results["steps"]] == ROLLED_BACK_STEPS
    canary, baseline = results["canary"], results["baseline"]
    assert (canary, baseline) == ("kf-node-1", "kf-node-2")
    # Caught by the comparison, not by readiness or the 30 tok/s line: the canary step (the
    # rollout's readiness and single-stream gate) passed; its 32 tok/s capacity is then shared
    # with the endpoint's load, where the baseline's grows with the batch.
    figures = results["figures"]
    assert "throughput" in results["gate"]["failed"], results["gate"]
    gate = next(g for g in results["gate"]["gates"] if g["name"] == "throughput")
    assert figures["canary"]["output_tok_s"] < 0.7 * figures["baseline"]["output_tok_s"], figures
    # The run says which gate failed, with both figures.
    assert gate["message"] in results["reason"]
    assert "%.0f" % figures["baseline"]["output_tok_s"] in gate["message"], gate["message"]
    assert results["outputs"]["passed"] is True
    # Only the canary ever changed, and it serves its image again; the inventory still names the validated stack.
    after = fleet_state()
    assert after["kf-node-1"][0] == served["kf-node-1"][0] and after["kf-node-1"][1] != served["kf-node-1"][1]
    assert {h: after[h] for h in ("kf-node-2", "kf-node-3")} == {h: served[h] for h in ("kf-node-2", "kf-node-3")}
    assert all(after[h][2] == served[h][2] for h in after), "a host's current tag moved"
    assert all(h["stack_after"] == VALIDATED and not h["changed"] for h in results["hosts"]), results["hosts"]
    assert STACK_FILE.read_text() == inventory_before
    # The candidate's image was distributed ahead to every host, under its stack's tag.
    for i in (1, 2, 3):
        assert stack_of(i, "kunlun-serving:" + CPU_SAMPLER) == CPU_SAMPLER
    # The report: the page, the operator's summary naming the failed gate.
    assert (report / "report.html").is_file()
    assert "FAIL" in (report / "report.md").read_text() and "throughput" in (report / "report.md").read_text()


def test_check_mode_says_what_would_happen_and_changes_nothing(served):
    """To the stack on another XRE: the plan, the image and the canary's driver pass and switch
    in check mode; nothing built, measured or changed."""
    before, inventory_before, images_before = fleet_state(), STACK_FILE.read_text(), serving_images()
    rc, out, results, report = upgrade("--to", OTHER_XRE, "--check")
    assert rc == 0 and results["outcome"] == "would-upgrade" and results["check"], out[-4000:]
    assert [(s["name"], s["result"]) for s in results["steps"]] == [
        ("plan", "ok"),
        ("image", "ok"),
        ("canary-driver", "ok"),
        ("canary", "ok"),
        ("measure", "would-run"),
        ("promote", "would-run"),
    ]
    assert results["reason"] == (
        "would build %s, switch canary kf-node-1, measure it against kf-node-2, then promote to kf-node-2, "
        "kf-node-3 (XRE 5.0.21.27 on kf-node-1, kf-node-2, kf-node-3 first, one host at a time)" % OTHER_XRE
    ), results["reason"]
    # The canary's driver pass, in check mode, names the host it would drain and stops there.
    driver = " ".join(step_output(results, "canary-driver").split())
    assert "kf-node-1 (serving on XRE 5.0.21.26, the pin is 5.0.21.27) would be drained" in driver, driver[-3000:]
    # Nothing changed: serving, the drivers, the inventory, every host's serving images and
    # their tags (nothing built, pulled or tagged).
    assert fleet_state() == before
    assert [loaded_driver(i) for i in (1, 2, 3)] == ["5.0.21.26"] * 3
    assert STACK_FILE.read_text() == inventory_before
    assert serving_images() == images_before
    assert "would-upgrade" in (report / "report.md").read_text()
