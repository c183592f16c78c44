"""The suite runner (tests/suites.py) and the honest-runs plugin: an environment skip fails
a strict run, a justified one does not; every test belongs to one suite; the budget names
the suites that grew."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import suites  # noqa: E402 (path set just above)

SAMPLE = """
import pytest

def test_runs():
    assert True

def test_lacks_a_tool():
    pytest.skip("needs frobnicate (apt-get install frobnicate)")

@pytest.mark.skipif(True, reason="not applicable: only big-endian machines have this")
def test_justified():
    pass
"""


def run_sample(tmp_path, **env):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    log = tmp_path / "events.jsonl"
    # This test may itself run under make test (strict): the sample's strictness is env's.
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "KF_STRICT_SKIPS")}
    full.update(KF_SUITE_LOG=str(log), **env)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "kunlun_fleet.sim.honest_runs",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_sample.py"),
        ],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, {e["nodeid"].split("::")[-1]: e for e in events}


def test_a_plain_run_may_skip(tmp_path):
    proc, events = run_sample(tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert events["test_lacks_a_tool"]["outcome"] == "skipped"
    assert events["test_lacks_a_tool"]["reason"] == "needs frobnicate (apt-get install frobnicate)"
    assert events["test_runs"]["outcome"] == "passed"


@pytest.mark.parametrize("env", [{"KF_STRICT_SKIPS": "1"}, {"CI": "true"}])
def test_a_strict_run_fails_an_environment_skip_and_keeps_a_justified_one(tmp_path, env):
    proc, events = run_sample(tmp_path, **env)
    assert proc.returncode == 1, proc.stdout
    assert events["test_lacks_a_tool"]["outcome"] == "failed"
    assert "environment skip under make test / CI: needs frobnicate" in proc.stdout
    assert events["test_justified"]["outcome"] == "skipped"
    assert events["test_runs"]["outcome"] == "passed"


def test_every_test_is_in_exactly_one_suite(monkeypatch):
    ids = {suites.FAST: ["tests/unit/test_a.py::test_x", "tests/e2e/test_b.py::test_y"], suites.SLOW: []}
    monkeypatch.setattr(suites, "collect", lambda marks: ids[marks])
    unit = suites.Suite("unit", "local", ["tests/unit"], marks=suites.FAST)
    monkeypatch.setattr(suites, "ALL", [unit])
    with pytest.raises(SystemExit) as exc:
        suites.check_ownership([unit])
    assert "tests/e2e/test_b.py::test_y (-m fast) is in no suite" in str(exc.value)
    twice = suites.Suite("again", "local", ["tests/unit/test_a.py"], marks=suites.FAST)
    e2e = suites.Suite("e2e", "fleet", ["tests/e2e"], marks=suites.FAST)
    monkeypatch.setattr(suites, "ALL", [unit, twice, e2e])
    with pytest.raises(SystemExit) as exc:
        suites.check_ownership([unit, twice, e2e])
    assert "tests/unit/test_a.py::test_x (-m fast) is in suites unit, again" in str(exc.value)
    monkeypatch.setattr(suites, "ALL", [unit, e2e])
    assert suites.check_ownership([unit, e2e]) == {"unit": 1, "e2e": 1}


def test_a_suite_outcome_is_its_tests_worst_phase(tmp_path):
    log = tmp_path / "s.jsonl"
    lines = [
        {"nodeid": "a", "when": "call", "outcome": "passed"},
        {"nodeid": "a", "when": "teardown", "outcome": "failed"},
        {"nodeid": "b", "when": "setup", "outcome": "skipped", "reason": "no XFS"},
        {"nodeid": "c", "when": "call", "outcome": "passed"},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    r = suites.summarize(suites.Suite("s", "local", ["x"]), 0, 1.0, log)
    assert (r["passed"], r["failed"], r["skipped"], r["result"]) == (1, 1, 1, "FAILED")
    assert r["skips"] == [("b", "no XFS")]
    log.write_text("")
    assert suites.summarize(suites.Suite("s", "local", ["x"]), 0, 1.0, log)["result"] == "FAILED"  # ran nothing


def test_the_budget_names_the_suites_that_grew():
    a, b = suites.Suite("a", "l", ["x"]), suites.Suite("b", "l", ["y"])
    a.result, b.result = {"wall": 2000.0}, {"wall": 1700.0}
    assert suites.BUDGET_S == 45 * 60
    assert suites.over_budget([a, b], suites.BUDGET_S, {"a": 1000, "b": 1600}) is None
    msg = suites.over_budget([a, b], suites.BUDGET_S + 1, {"a": 1000, "b": 1600})
    assert "a: 2000 s (recorded 1000 s)" in msg and "b:" not in msg


def test_background_lanes_run_beside_the_phases_at_a_lower_priority(tmp_path, monkeypatch, capsys):
    """A background lane starts with phase 1 and may end after phase 2 has started; its
    suites run niced; one with ``after`` waits for that suite; every suite's CPU seconds
    are its own processes' (a busy loop counts, a sleep does not)."""

    def suite(name, lane, code):
        marker = tmp_path / name
        script = (
            "import os, time\ncpu = [l.split(':', 2)[2] for l in open('/proc/self/cgroup').read().splitlines()"
            " if l.split(':')[1] in ('cpu', 'cpu,cpuacct', '')][0]\n"
            "open(%r, 'a').write('start %%f nice %%d %%s\\n' %% (time.time(), os.nice(0), cpu))\n%s\n"
            "open(%r, 'a').write('end %%f\\n' %% time.time())\n" % (str(marker), code, str(marker))
        )
        return suites.Suite(name, lane, [], command=[sys.executable, "-c", script])

    busy = "t = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    phase1 = [suite("p1", "fleet", "time.sleep(0.5)")]
    phase2 = [suite("p2", "kf-node-1", "time.sleep(0.5)")]
    beside = [suite("bg", "local", busy + "\ntime.sleep(1.5)"), suite("late", "large", "")]
    beside[1].after = "p1"
    for s in beside:
        s.nice = 5
    monkeypatch.setattr(suites, "PHASES", [phase1, phase2])
    monkeypatch.setattr(suites, "BACKGROUND", beside)
    monkeypatch.setattr(suites, "ALL", phase1 + phase2 + beside)
    monkeypatch.setattr(suites, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(suites, "machine_problems", lambda: [])
    monkeypatch.setattr(suites, "check_ownership", lambda ss: {s.name: 1 for s in ss})
    assert suites.main(["--only", "p1,p2,bg,late"]) == 0

    def times(name):
        lines = [row.split() for row in (tmp_path / name).read_text().splitlines()]
        return float(lines[0][1]), int(lines[0][3]), float(lines[1][1]), lines[0][4]

    p1, p2, bg, late = times("p1"), times("p2"), times("bg"), times("late")
    assert bg[0] < p1[2], "the background lane did not start with phase 1"
    assert p2[0] < bg[2], "phase 2 waited for the background lane"
    assert late[0] >= p1[2], "a suite started before the suite it runs after ended"
    assert p1[1] == p2[1] == os.nice(0) and bg[1] == os.nice(0) + 5
    # Where this machine lets the runner make a CPU cgroup (root, cgroup v1's cpu
    # controller, as in CI), the background suites run in it and the phases' do not: under
    # autogroup scheduling nice alone orders nothing across sessions.
    if suites.background_cgroup() is not None:
        # (This test may itself run in a background lane: the phase's suite then stays in
        # the group it was started from, ours.)
        own = [
            entry.split(":", 2)[2]
            for entry in open("/proc/self/cgroup").read().splitlines()
            if entry.split(":")[1] in ("cpu", "cpu,cpuacct", "")
        ][0]
        assert bg[3].endswith("/" + suites.BACKGROUND_CGROUP), bg
        assert p1[3] == own, (p1, own)
    else:
        from kunlun_fleet.sim import cpu_groups

        assert os.geteuid() != 0 or cpu_groups.version() is None, "no CPU group made as root"
    assert beside[0].result["cpu"] >= 0.5 and phase1[0].result["cpu"] < 0.4
    out = capsys.readouterr().out
    assert "phase 1: " in out and "lane local (beside): " in out and "machine " in out


def test_phase_two_suites_leave_the_other_lanes_hosts_alone(tmp_path, monkeypatch):
    """Phase 2's lanes share the fleet phase 1 brought up: their suites get
    KF_SIM_FLEET_UP=1, so the sim_fleet fixture runs no sim-up (which would check, and fail
    on, a host another lane is rebooting); phase 1 and the lanes beside it do not."""
    assert all(s.fleet_up for phase in suites.PHASES[1:] for s in phase)
    assert not any(s.fleet_up for s in suites.PHASES[0] + suites.BACKGROUND)
    monkeypatch.setattr(suites, "REPORTS", tmp_path)
    monkeypatch.delenv("KF_SIM_FLEET_UP", raising=False)
    seen = {}
    for fleet_up in (False, True):
        s = suites.Suite(
            "env-%s" % fleet_up,
            "local",
            [],
            command=[sys.executable, "-c", "import os; print(os.environ.get('KF_SIM_FLEET_UP', '-'))"],
        )
        s.fleet_up = fleet_up
        suites.run_suite(s)
        seen[fleet_up] = (tmp_path / (s.name + ".log")).read_text().strip()
    assert seen == {False: "-", True: "1"}, seen


def test_an_on_demand_suite_runs_only_when_named(tmp_path, monkeypatch):
    """A run of everything leaves out the on-demand suites (tests the run has no room for);
    --only runs them."""
    # Every suite runs in the default run today (issue 48: the promotion path back in it).
    assert [s.name for s in suites.ALL if s.on_demand] == []

    def suite(name, **kw):
        return suites.Suite(
            name, "fleet", [], command=[sys.executable, "-c", "open(%r, 'w')" % str(tmp_path / name)], **kw
        )

    plain, extra = suite("plain"), suite("extra", on_demand=True)
    monkeypatch.setattr(suites, "PHASES", [[plain, extra]])
    monkeypatch.setattr(suites, "BACKGROUND", [])
    monkeypatch.setattr(suites, "ALL", [plain, extra])
    monkeypatch.setattr(suites, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(suites, "machine_problems", lambda: [])
    monkeypatch.setattr(suites, "check_ownership", lambda ss: {s.name: 1 for s in ss})
    assert suites.main([]) == 0
    assert (tmp_path / "plain").exists() and not (tmp_path / "extra").exists()
    assert suites.main(["--only", "extra"]) == 0
    assert (tmp_path / "extra").exists()


def test_why_a_suite_failed_is_in_the_runs_last_lines(tmp_path):
    # A failing molecule scenario's log: pytest's summary line and the message's first lines
    # (the failed task) are what the end of the run prints; passing noise is not.
    log = tmp_path / "molecule-x.log"
    log.write_text(
        "\n".join(
            [
                "." * 40,
                "____ test_scenario[gateway] ____",
                "E   AssertionError: molecule scenario gateway failed:",
                "E     TASK [Verify | Health checks put it back]",
                "E     fatal: [kf-node-1]: FAILED! => " + "x" * 400,
            ]
            + ["E     destroy output %d" % i for i in range(30)]
            + ["FAILED tests/molecule/test_scenarios.py::test_scenario[gateway] - AssertionError: molecule"]
        )
    )
    why = suites.why_failed(log)
    assert why[0].startswith("FAILED tests/molecule/test_scenarios.py::test_scenario[gateway]")
    assert why[2] == "TASK [Verify | Health checks put it back]"
    assert why[3].startswith("fatal: [kf-node-1]: FAILED!") and len(why[3]) == 300
    assert len(why) == 14
    # No pytest output at all (a command suite, a crash): the log's last lines.
    (tmp_path / "lint.log").write_text("\n".join("line %d" % i for i in range(50)))
    assert suites.why_failed(tmp_path / "lint.log") == ["line %d" % i for i in range(36, 50)]
    assert suites.why_failed(tmp_path / "absent.log")[0].startswith("(no log:")


def test_a_failed_scenarios_tasks_survive_destroys_output():
    sys.path.insert(0, str(ROOT / "tests" / "molecule"))
    from test_scenarios import failures

    out = "\n".join(
        [
            "CRITICAL 'molecule/default/molecule.yml' glob failed.  Exiting.",
            "TASK [Verify | One]",
            "ok: [kf-node-1]",
            "  │ TASK [Verify | Two]",
            'fatal: [kf-node-1]: FAILED! => {"msg": "boom"}',
            "TASK [Verify | Three]",
            "fatal: [kf-node-1]: FAILED! => ",
            "    changed: false",
            "    msg: tolerated",
            "",
            "...ignoring",
            "CRITICAL Idempotence test failed because of the following tasks:",
            "*  => gateway : Install | The unit",
            "TASK [Destroy | x]",
        ]
        + ["ok: [kf-node-1]"] * 500
    )
    assert failures(out).splitlines() == [
        "TASK [Verify | Two]",
        'fatal: [kf-node-1]: FAILED! => {"msg": "boom"}',
        "CRITICAL Idempotence test failed because of the following tasks:",
        "*  => gateway : Install | The unit",
    ]


def test_sim_host_cpu_sums_each_host_over_its_containers(tmp_path, monkeypatch):
    """The sim hosts' CPU: the groups' counters for the total (docker's and the beside
    fleets' group, made during the run), each container's last sample summed per host name
    (a reset host's two containers are one host)."""
    root, beside = tmp_path / "docker", tmp_path / "kunlun-sim-beside"
    first, second, other = "a" * 64, "b" * 64, "c" * 64
    for group, cid, ns in ((beside, first, 3e9), (beside, second, 2e9), (root, other, 1e9)):
        (group / cid).mkdir(parents=True)
        (group / cid / "cpuacct.usage").write_text("%d\n" % ns)
    (root / "cpuacct.usage").write_text("5000000000\n")
    (beside / "cpuacct.usage").unlink(missing_ok=True)
    sampler = suites.SimHostCpu(roots=[str(root), str(beside)], every=0.05)
    monkeypatch.setattr(
        sampler, "_names", lambda: sampler.names.update({first: "kf-node-4", second: "kf-node-4", other: "kf-node-1"})
    )
    sampler.start()
    (root / "cpuacct.usage").write_text("6000000000\n")
    (beside / "cpuacct.usage").write_text("5000000000\n")
    deadline = time.monotonic() + 10
    while len(sampler.last) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    total, per = sampler.finish()
    assert total == 6.0
    assert per == {"kf-node-4": 5.0, "kf-node-1": 1.0}


def _fake_hierarchy(root, kind):
    """A CPU hierarchy's control files as the kernel shows them, in a plain directory."""
    if kind == 1:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.shares").write_text("1024\n")
    else:
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (root / "cgroup.subtree_control").write_text("memory pids\n")


def test_cpu_groups_on_cgroup_v1_and_v2(tmp_path):
    from kunlun_fleet.sim import cpu_groups

    v1, v2, none = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    for path in (v1, v2, none):
        path.mkdir()
    _fake_hierarchy(v1, 1)
    _fake_hierarchy(v2, 2)
    assert [cpu_groups.version(str(p)) for p in (v1, v2, none)] == [1, 2, None]
    # v1: cpu.shares as asked, under the cpu controller's mount.
    assert cpu_groups.make("bg", 384, str(v1)) == ("/bg", str(v1 / "cpu" / "bg" / "cgroup.procs"))
    assert (v1 / "cpu" / "bg" / "cpu.shares").read_text() == "384"
    # v2: the cpu controller enabled for the top's children, the same fraction of the
    # default weight (384/1024 of 100), the group at the top of the hierarchy.
    assert cpu_groups.make("bg", 384, str(v2)) == ("/bg", str(v2 / "bg" / "cgroup.procs"))
    assert (v2 / "cgroup.subtree_control").read_text() == "+cpu"
    assert (v2 / "bg" / "cpu.weight").read_text() == "38"
    assert cpu_groups.weight_v2(128) == 12 and cpu_groups.weight_v2(1024) == 100
    # A v2 hierarchy without the cpu controller, or none at all: no group (nice alone).
    (v2 / "cgroup.controllers").write_text("memory pids\n")
    assert cpu_groups.make("other", 384, str(v2)) is None
    assert cpu_groups.make("bg", 384, str(none)) is None
