"""kunlun_fleet/upgrade/run.py: which playbook runs when, on which hosts, with which stack, and
what the report says, for each way an upgrade ends. The playbooks themselves run on the sim
fleet (tests/upgrade/test_upgrade_sim.py); here each run is a stand-in that records its call
and plays its part (the plan's and the measurement's files, an exit code)."""

import json
from pathlib import Path

import pytest

from kunlun_fleet import runner
from kunlun_fleet.upgrade import report
from kunlun_fleet.upgrade import run as upgrade_run

HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
OLD, NEW = "0.15.1-4885de2", "0.15.1-7c1e0a2"


def plan(unchanged=False, hosts=None, driver_hosts=()):
    hosts = hosts or {h: OLD for h in HOSTS}
    return {
        "drivers": {h: "5.0.21.26" for h in HOSTS},
        "to_driver": "5.0.21.27" if driver_hosts else "5.0.21.26",
        "driver_hosts": list(driver_hosts),
        "from_stack": OLD,
        "to_stack": NEW,
        "to_status": "candidate",
        "hosts": hosts,
        "canary": "" if unchanged else "kf-node-1",
        "baseline": "" if unchanged else "kf-node-2",
        "rest": HOSTS[1:],
        "unchanged": unchanged,
    }


def measure(passed):
    gate = {"passed": passed, "gates": [], "failed": [] if passed else ["throughput"], "message": "PASS: 6 gates"}
    if not passed:
        gate["message"] = "FAIL (throughput): canary output 32.0 tok/s is 7 % of the baseline's 455 (needs >= 70 %)"
    return {
        "passed": passed,
        "message": gate["message"],
        "gate": gate,
        "settings": {"thresholds": {"throughput_min_ratio": 0.7}},
    }


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """runner.Run replaced: each run appends (label, playbook, extra vars, limit, check) and
    answers from `script` (label -> (rc, files to write from its extra vars))."""
    calls, script = [], {}

    class FakeRun:
        def __init__(self, command, playbook, args=(), inventory=None, limit=None, label=None, **_):
            extra = json.loads(args[args.index("-e") + 1])
            self.label, self.extra = label, extra
            calls.append((label, playbook, extra, limit, "--check" in args))
            self.dir = tmp_path / "runs" / ("%d-%s" % (len(list((tmp_path / "runs").glob("*"))) + 1, label))

        def run(self):
            self.dir.mkdir(parents=True)  # one per run
            rc, writes = script.get(self.label, (runner.OK, {}))
            for key, content in writes.items():
                Path(self.extra[key]).write_text(json.dumps(content))
            summary = {"hosts": {}}
            if rc != runner.OK:
                summary["hosts"]["kf-node-1"] = {"first_failure": {"task": "a task", "message": "it failed"}}
            (self.dir / "summary.json").write_text(json.dumps(summary))
            return rc

    monkeypatch.setattr(runner, "Run", FakeRun)
    inventory = tmp_path / "inv"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "group_vars" / "all" / "sim.yml").write_text('a: 1\nkunlun_stack_stack: "%s"\nb: 2\n' % OLD)
    return {"calls": calls, "script": script, "inventory": inventory, "base": tmp_path}


def up_dir(fake):
    """The report directory of the last upgrade."""
    return sorted((fake["base"] / "reports").glob("upgrade-*"))[-1]


def go(fake, **kwargs):
    rc, up = upgrade_run.upgrade(str(fake["inventory"]), NEW, base=fake["base"], **kwargs)
    return rc, up.results, [c[0] for c in fake["calls"]]


def test_pass_promotes_the_rest_and_names_the_stack_in_the_inventory(fake):
    fake["script"].update(
        {
            "upgrade-plan": (runner.OK, {"upgrade_plan_file": plan()}),
            "upgrade-measure": (runner.OK, {"upgrade_measure_file": measure(True)}),
        }
    )
    rc, results, labels = go(fake)
    assert rc == runner.OK and results["outcome"] == "promoted"
    assert labels == [
        "upgrade-plan",
        "upgrade-image",
        "upgrade-canary",
        "upgrade-measure",
        "upgrade-promote",
        "upgrade-read-after",
    ]
    calls = {c[0]: c for c in fake["calls"]}
    # Distributed ahead without promoting; the canary alone on the target's tag; then every host.
    assert calls["upgrade-image"][2] == {"kunlun_stack_stack": NEW, "image_promote": False}
    assert calls["upgrade-canary"][2:4] == ({"kunlun_stack_stack": NEW, "serve_image_tag": NEW}, "kf-node-1")
    assert calls["upgrade-measure"][2]["upgrade_baseline"] == "kf-node-2"
    # One run tags the target's image current on every host and rolls it out.
    assert calls["upgrade-promote"][1:4] == ("playbooks/promote.yml", {"kunlun_stack_stack": NEW}, None)
    text = (fake["inventory"] / "group_vars/all/sim.yml").read_text()
    assert text == 'a: 1\nkunlun_stack_stack: "%s"\nb: 2\n' % NEW
    assert results["steps"][-1]["name"] == "inventory" and results["steps"][-1]["result"] == "ok"
    assert report.load(Path(up_dir(fake)) / "results.json")["outcome"] == "promoted"


def test_fail_restores_the_canary_alone_and_changes_nothing_else(fake):
    fake["script"].update(
        {
            "upgrade-plan": (runner.OK, {"upgrade_plan_file": plan()}),
            "upgrade-measure": (runner.FAILED, {"upgrade_measure_file": measure(False)}),
        }
    )
    rc, results, labels = go(fake)
    assert rc == runner.FAILED and results["outcome"] == "rolled-back"
    assert labels == [
        "upgrade-plan",
        "upgrade-image",
        "upgrade-canary",
        "upgrade-measure",
        "upgrade-restore",
        "upgrade-read-after",
    ]
    restore = fake["calls"][4]
    # The inventory's stack (no -e), the canary alone.
    assert restore[2] == {} and restore[3] == "kf-node-1"
    assert "throughput" in results["reason"] and "455" in results["reason"]
    assert 'kunlun_stack_stack: "%s"' % OLD in (fake["inventory"] / "group_vars/all/sim.yml").read_text()


def test_a_canary_that_fails_readiness_is_restored(fake):
    fake["script"].update(
        {"upgrade-plan": (runner.OK, {"upgrade_plan_file": plan()}), "upgrade-canary": (runner.FAILED, {})}
    )
    rc, results, labels = go(fake)
    assert results["outcome"] == "rolled-back" and "it failed" in results["reason"]
    assert "upgrade-measure" not in labels and "upgrade-restore" in labels


def test_refused_and_unchanged_and_check(fake):
    fake["script"]["upgrade-plan"] = (runner.FAILED, {})
    rc, results, labels = go(fake)
    assert rc == runner.REFUSED and results["outcome"] == "refused" and labels == ["upgrade-plan"]
    assert results["from_stack"] == OLD
    assert results["reason"] == "kf-node-1: a task: it failed"
    fake["calls"].clear()
    fake["script"]["upgrade-plan"] = (runner.OK, {"upgrade_plan_file": plan(unchanged=True)})
    rc, results, labels = go(fake)
    assert rc == runner.OK and results["outcome"] == "unchanged"
    # Nothing ran after the plan: its reading is the state after, read once.
    assert labels == ["upgrade-plan"]
    fake["calls"].clear()
    fake["script"]["upgrade-plan"] = (runner.OK, {"upgrade_plan_file": plan()})
    rc, results, labels = go(fake, check=True)
    assert rc == runner.OK and results["outcome"] == "would-upgrade"
    assert labels == ["upgrade-plan", "upgrade-image", "upgrade-canary"]
    assert all(c[4] for c in fake["calls"][1:])
    assert [s["result"] for s in results["steps"][-2:]] == ["would-run", "would-run"]


def test_a_stack_with_another_driver_rolls_the_driver_canary_first_then_the_rest(fake):
    after = dict(plan(driver_hosts=HOSTS), hosts={h: NEW for h in HOSTS}, drivers={h: "5.0.21.27" for h in HOSTS})
    fake["script"].update(
        {
            "upgrade-plan": (runner.OK, {"upgrade_plan_file": plan(driver_hosts=HOSTS)}),
            "upgrade-measure": (runner.OK, {"upgrade_measure_file": measure(True)}),
            "upgrade-read-after": (runner.OK, {"upgrade_plan_file": after}),
        }
    )
    rc, results, labels = go(fake)
    assert rc == runner.OK and results["outcome"] == "promoted"
    assert labels == [
        "upgrade-plan",
        "upgrade-image",
        "upgrade-canary-driver",
        "upgrade-canary",
        "upgrade-measure",
        "upgrade-promote-driver",
        "upgrade-promote",
        "upgrade-read-after",
    ]
    # The report names each host's driver before and after (the after-reading's).
    assert [(h["driver_before"], h["driver_after"], h["changed"]) for h in results["hosts"]] == [
        ("5.0.21.26", "5.0.21.27", True)
    ] * 3
    calls = {c[0]: c for c in fake["calls"]}
    # The canary's driver alone before it is switched and measured; the rest's after the PASS.
    assert calls["upgrade-canary-driver"][1:4] == ("playbooks/driver.yml", {"kunlun_stack_stack": NEW}, "kf-node-1")
    assert calls["upgrade-promote-driver"][1:4] == ("playbooks/driver.yml", {"kunlun_stack_stack": NEW}, None)


def test_a_failed_canary_with_another_driver_gets_its_driver_back_too(fake):
    fake["script"].update(
        {
            "upgrade-plan": (runner.OK, {"upgrade_plan_file": plan(driver_hosts=HOSTS)}),
            "upgrade-measure": (runner.FAILED, {"upgrade_measure_file": measure(False)}),
        }
    )
    rc, results, labels = go(fake)
    assert rc == runner.FAILED and results["outcome"] == "rolled-back"
    assert labels[-3:] == ["upgrade-restore", "upgrade-restore-driver", "upgrade-read-after"]
    restore_driver = [c for c in fake["calls"] if c[0] == "upgrade-restore-driver"][0]
    # The inventory's stack (its driver), the canary alone; no other host's driver touched.
    assert restore_driver[1:4] == ("playbooks/driver.yml", {}, "kf-node-1")
    assert "upgrade-promote-driver" not in labels
    # A canary whose new driver failed its pass: its driver put back (its image never changed;
    # the serve stage would refuse a canary the pass held out), nothing measured.
    fake["calls"].clear()
    fake["script"]["upgrade-canary-driver"] = (runner.FAILED, {})
    rc, results, labels = go(fake)
    assert results["outcome"] == "rolled-back" and "did not take XRE 5.0.21.27" in results["reason"]
    assert labels == [
        "upgrade-plan",
        "upgrade-image",
        "upgrade-canary-driver",
        "upgrade-restore-driver",
        "upgrade-read-after",
    ]
    # --check says the driver comes first, on which hosts.
    fake["calls"].clear()
    del fake["script"]["upgrade-canary-driver"]
    rc, results, labels = go(fake, check=True)
    assert results["outcome"] == "would-upgrade"
    assert labels == ["upgrade-plan", "upgrade-image", "upgrade-canary-driver", "upgrade-canary"]
    assert "XRE 5.0.21.27 on kf-node-1, kf-node-2, kf-node-3 first" in results["reason"]


def test_set_inventory_stack(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    written = upgrade_run.set_inventory_stack(inv, NEW)
    assert written == inv / "group_vars/all/kunlun_stack_stack.yml"
    assert 'kunlun_stack_stack: "%s"' % NEW in written.read_text()
    assert upgrade_run.set_inventory_stack(inv, OLD) == written and OLD in written.read_text()
    assert upgrade_run.set_inventory_stack(tmp_path / "nothing", NEW) is None
