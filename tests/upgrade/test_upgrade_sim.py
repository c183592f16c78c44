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
  driver pass named, nothing built, pulled, tagged, drained, installed or restarted;
- a good candidate (0.15.1-7c1e0a2) promoted under load through the endpoint: the canary
  measured and passed, the rest promoted, every host serving it with the validated stack's
  image kept as `previous`, the inventory's stack line set, no request lost;
- the rollback playbook on one host after that promotion: it serves the previous stack's
  image again, the others untouched;
- `--to` the previous stack: the way back, promoted the same way, every host on the very image
  it served before, the inventory byte for byte as it was.

The numerics candidate (0.15.1-e5a7c83) runs the CPU-sampler candidate's steps and is not run
on the fleet, for the suite's time: the golden-output gate's verdict on its engine's answers is
tests/artifacts/test_stack_variants.py; on the fleet it ran green in CI (ci-20, ci-21) and on
the demo fleet (docs/upgrades.md; its code: commit 641513b).

The driver's own rolling pass (a host held out and brought back): test_driver_rolling_sim.py,
after this file. The orchestration's branches: tests/unit/test_upgrade_run.py; the stand-in
stacks' behaviour itself: tests/artifacts/test_stack_variants.py."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet import vault
from kunlun_fleet.loadgen import Load
from kunlun_fleet.sim.testing import INVENTORY, loaded_driver, ssh

ROOT = Path(__file__).resolve().parents[2]
VALIDATED, KNOWN_BAD, CPU_SAMPLER = "0.15.1-4885de2", "0.25.1-2fda97b", "0.15.1-b3f9d41"
GOOD, OTHER_XRE = "0.15.1-7c1e0a2", "0.15.1-4885de2-xre27"
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
STACK_FILE = Path(INVENTORY) / "group_vars" / "all" / "sim.yml"

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def upgrade(*args):
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), "upgrade", "-i", INVENTORY, "--plain", *args],
        cwd=ROOT,
        env=dict(env, ANSIBLE_NOCOLOR="1"),
        text=True,
        capture_output=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    line = [x for x in out.splitlines() if x.startswith("upgrade ")][-1]
    report = Path(line.rsplit("report: ", 1)[1]).parent
    return proc.returncode, out, json.loads((report / "results.json").read_text()), report


def fleet_state():
    """What serving is on each host: the unit's image, the service's start, the current tag."""
    state = {}
    for i in (1, 2, 3):
        out = ssh(
            i,
            "cat /etc/kunlun-serve/image; systemctl show -P ActiveEnterTimestampMonotonic kunlun-serve.service; "
            "docker image inspect --format '{{.Id}}' kunlun-serving:current",
        ).stdout.split()
        state["kf-node-%d" % i] = out
    return state


def endpoint():
    data = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return data["fleet_url"], data["model"], vault.read_api_key(INVENTORY)


def ask(url, model, key):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=2, timeout=120)
    return client.completions.create(model=model, prompt="Hi", max_tokens=8).choices[0].text


def stack_of(index, ref):
    """The stack label of an image on a host (the image role writes it at build)."""
    return ssh(
        index, "docker image inspect --format '{{ index .Config.Labels \"org.kunlun-fleet.stack\" }}' %s" % ref
    ).stdout.strip()


def serving_images():
    """{host: sorted "tag image-ID" lines} of the serving images on each host."""
    return {
        i: sorted(ssh(i, "docker images --no-trunc --format '{{.Tag}} {{.ID}}' kunlun-serving").stdout.splitlines())
        for i in (1, 2, 3)
    }


def image_id(index, ref):
    return ssh(index, "docker image inspect --format '{{.Id}}' %s" % ref, check=False).stdout.strip()


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
    # The steps: the image ahead, the canary switched, measured, restored; nothing promoted.
    assert [(s["name"], s["result"]) for s in results["steps"]] == [
        ("plan", "ok"),
        ("image", "ok"),
        ("canary", "ok"),
        ("measure", "failed"),
        ("restore", "ok"),
    ]
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


def step_output(results, name):
    """The playbook output of one step of an upgrade (its runner directory under reports/runs)."""
    step = next(s for s in results["steps"] if s["name"] == name)
    run = step["message"].rsplit("run ", 1)[1]
    return (ROOT / "reports" / "runs" / run / "artifacts" / "stdout").read_text()


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


@pytest.fixture(scope="module")
def promoted(served):
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
