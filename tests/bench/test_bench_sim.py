"""The bench on the 3-host sim fleet, as an operator runs it: `kunlun-fleet bench -i
inventories/sim` with a short sweep, after the e2e left the fleet served (suite
"bench-sim", lane "fleet", right after "e2e"). Checks mechanisms, never a figure: every
point measured through the gateway and on each host, the responses' usage and the servers'
token counters agree within 3%, the gateway spread the load over the three hosts, the three
report files, the key in no artifact. That --check measures nothing is tested once, in
tests/bench/test_bench_local.py (the servers' counters read before and after). The sim
inventory reports missed targets without failing the run (bench_fail_on_miss: false)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet import vault
from kunlun_fleet.sim.config import INVENTORY_DIR
from kunlun_fleet.sim.testing import host_curl, ssh

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sim
HOSTS = ("kf-node-1", "kf-node-2", "kf-node-3")
# A short sweep: the fleet at 64 concurrent plus the single-stream and long-context points
# (4 prompts of 32768 tokens), each host single-stream and at 16; 64 requests a point (one
# wave at 64), small outputs. Each point is mostly aiperf starting (docs/testing.md), so
# the sweep holds one point of each kind a test reads; the sweep's own logic (curves,
# plan, gates over many points) is tested on recorded results in tests/unit.
SWEEP = ["--concurrency", "64", "--host-concurrency", "16", "--requests", "64"]
EXTRA = {
    "bench_osl": 32,
    "bench_isl": 256,
    "bench_single_requests": 2,
    "bench_single_osl": 24,
    "bench_long_concurrency": 4,
    "bench_long_requests": 4,
    "bench_long_osl": 8,
    "bench_long_per_host": False,
    "bench_request_timeout": 300,
}


def bench(*args, timeout=600):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(ROOT / ".venv/bin/kunlun-fleet"), "bench", "-i", "inventories/sim", *args]
    return subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)


def run_dirs():
    """The bench's run directories (reports/bench-<timestamp>/), not the logs beside them."""
    return {p for p in (ROOT / "reports").glob("bench-*") if p.is_dir()}


@pytest.fixture(scope="module")
def served(sim_fleet):
    """The e2e leaves the three hosts serving; say so plainly when they are not. Asked on
    each host itself: the host firewall opens vLLM's port to the gateways and the
    monitoring hosts only (docs/security.md)."""
    for i in (1, 2, 3):
        found = ssh(i, host_curl("/health") + " -sf -o /dev/null", check=False)
        assert found.returncode == 0, (
            "kf-node-%d does not serve (curl exit %d on the host): this suite runs after the e2e, which leaves "
            "the fleet served; run `kunlun-fleet demo` first" % (i, found.returncode)
        )


@pytest.fixture(scope="module")
def run(served):
    before = run_dirs()
    proc = bench(*SWEEP, "-e", json.dumps(EXTRA))
    out = proc.stdout + proc.stderr
    (ROOT / "reports").mkdir(exist_ok=True)
    (ROOT / "reports" / "bench-sim.log").write_text(out)
    assert proc.returncode == 0, out[-6000:]
    new = sorted(run_dirs() - before)
    assert len(new) == 1, new
    return new[0], out


def test_the_report_is_written(run):
    run_dir, out = run
    for name in ("results.json", "report.html", "report.md", "raw.json"):
        assert (run_dir / name).is_file(), name
    assert "report: %s" % (run_dir / "report.html") in out


def test_every_point_measured_through_the_gateway_and_per_host(run):
    res = json.loads((run[0] / "results.json").read_text())
    labels = {p["label"] for p in res["points"]}
    assert {"fleet-single", "fleet-c64", "fleet-long"} <= labels
    for h in HOSTS:
        assert {h + "-single", h + "-c16"} <= labels
    assert res["meta"]["host_count"] == 3 and res["meta"]["inventory_host_count"] == 3
    assert set(res["meta"]["images"]) == set(HOSTS) and all(res["meta"]["images"].values())
    assert res["meta"]["stack"]["vllm"] == "0.15.1"


def test_client_and_servers_agree_and_nothing_failed(run):
    res = json.loads((run[0] / "results.json").read_text())
    for p in res["points"]:
        c = p["client"]
        assert p["measured"] and c["failed"] == 0 and c["completed"] == c["requests"] > 0, (p["label"], c["errors"])
        assert p["valid"] and abs(p["diff_pct"]) <= 3.0, (p["label"], p["validity"])
        assert abs(p["prompt_diff_pct"]) <= 3.0, (p["label"], p["validity"])
        # the figures are the usage; the stand-in's canonical words re-tokenize to the same count
        assert c["output_tokens"] == c["usage_output_tokens"] == c["retokenized_output_tokens"]
        assert c["responses_without_usage"] == 0
    for g in res["gates"]:
        if g["gate"] in ("points valid and served", "long context"):
            assert g["status"] == "PASS", g


def test_the_gateway_spread_the_fleet_points_over_the_three_hosts(run):
    res = json.loads((run[0] / "results.json").read_text())
    c64 = next(p for p in res["points"] if p["label"] == "fleet-c64")
    shares = {h: c64["servers"][h]["generation_tokens"] for h in HOSTS}
    assert all(v > 0 for v in shares.values()), shares
    assert sum(shares.values()) == c64["server_output_tokens"]


def test_gates_and_plan_are_judged(run):
    res = json.loads((run[0] / "results.json").read_text())
    assert {g["status"] for g in res["gates"]} <= {"PASS", "FAIL"}
    fleet = next(g for g in res["gates"] if g["gate"] == "fleet throughput")
    # the short sweep stops below 1000 concurrent: the fleet gate says so and fails
    assert fleet["status"] == "FAIL" and "not measured at 1000 or more" in fleet["detail"]
    assert res["plan"]["answers"] and res["plan"]["per_host_curve"]
    md = (run[0] / "report.md").read_text()
    assert "## Capacity plan" in md and "vllm bench serve" in md


def test_the_api_key_is_in_no_artifact_and_no_log(run):
    key = vault.read_api_key(INVENTORY_DIR)
    assert len(key) >= 16
    proc = subprocess.run(["grep", "-rl", key, str(run[0])], capture_output=True, text=True)
    assert proc.returncode == 1, "the API key is in " + proc.stdout
    assert key not in run[1]


def test_the_plan_command_reads_the_run(run):
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/kunlun-fleet"),
            "plan",
            "--concurrency",
            "64",
            "--ttft-p99",
            "60s",
            "--results",
            str(run[0] / "results.json"),
        ],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "64 concurrent requests, TTFT p99 <= 60 s:" in proc.stdout and "assumption:" in proc.stdout


def test_the_watchdog_was_paused_for_the_measurements_and_runs_again(run):
    """Its probes would count in the servers' counters the points are read against (the
    agreement above): stopped on the gateway for the measurements, started again after."""
    from kunlun_fleet.sim.testing import ssh

    _, out = run
    paused = out.split("Bench | Pause the watchdog where it runs")[1].split("TASK [")[0]
    resumed = out.split("Bench | The watchdog runs again where it ran")[1].split("TASK [")[0]
    assert "changed: [kf-node-1" in paused, paused
    assert "changed: [kf-node-1" in resumed, resumed
    assert ssh(1, "systemctl is-active kunlun-watchdog.service").stdout.strip() == "active"
