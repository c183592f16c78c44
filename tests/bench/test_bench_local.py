"""The bench for real on this machine, no sim host: aiperf from the bench venv against
local stand-in servers (and a round-robin proxy as the fleet endpoint), through the
project's module and playbook. Checks mechanisms: the responses' usage and the servers'
counters agree (output and prompt tokens), a host that dies mid-bench fails the gates and
is named, nothing hangs, the API key is in no artifact, check mode measures nothing, too
many streams are refused before any load (fleet points only). Never a wall time or a tok/s
figure. That a re-tokenized count above the usage leaves a point valid, and usage off the
counters makes it invalid, is proved on the counts recorded against a real vLLM 0.15.1
(tests/unit/test_bench_results.py: bench_point with a replaying aiperf)."""

import json
import os
import resource
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import benchkit as bk

pytestmark = pytest.mark.slow
ROOT = bk.ROOT


@pytest.fixture(autouse=True)
def _venv():
    if not bk.AIPERF.exists():
        pytest.skip(bk.NO_VENV)


def generation_tokens(srv):
    with urllib.request.urlopen(srv.base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:generation_tokens_total{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:generation_tokens_total")


def assert_no_key(*places):
    for place in places:
        if isinstance(place, Path):
            proc = subprocess.run(["grep", "-rl", bk.API_KEY, str(place)], capture_output=True, text=True)
            assert proc.returncode == 1, "the API key is in %s" % proc.stdout
        else:
            assert bk.API_KEY not in place


def test_one_point_client_and_servers_agree(tmp_path):
    """bench_point through Ansible: 32 streams, 64 requests against one stand-in. aiperf
    0.13 itself reads the stand-in's usage chunks: its export carries the usage beside its
    own count of the text."""
    (srv,) = bk.start_servers(tmp_path, 1, KUNLUN_SIM_TOKENS_PER_SECOND="200")
    try:
        model = bk.model_dir(tmp_path / "models")
        play = tmp_path / "point.yml"
        play.write_text(
            json.dumps(
                [
                    {
                        "hosts": "localhost",
                        "gather_facts": False,
                        "tasks": [
                            {
                                "bench_point": {
                                    "aiperf": str(bk.AIPERF),
                                    "url": srv.base,
                                    "model": bk.SERVED,
                                    "tokenizer": str(model),
                                    "api_key": bk.API_KEY,
                                    "concurrency": 32,
                                    "requests": 64,
                                    "isl": 256,
                                    "osl": 48,
                                    "timeout": 120,
                                    "metrics": [{"host": "h1", "url": srv.base + "/metrics"}],
                                    "artifact_dir": str(tmp_path / "point"),
                                    "label": "h1-c32",
                                },
                                "register": "r",
                            },
                            {
                                "ansible.builtin.copy": {
                                    "content": "{{ r | to_json }}",
                                    "dest": str(tmp_path / "r.json"),
                                    "mode": "0600",
                                }
                            },
                        ],
                    }
                ]
            )
        )
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run(
            [
                str(ROOT / ".venv/bin/ansible-playbook"),
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                "ansible_python_interpreter=%s" % (ROOT / ".venv/bin/python"),
                str(play),
            ],
            cwd=str(ROOT),
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        r = json.loads((tmp_path / "r.json").read_text())
        c = r["client"]
        assert (c["requests"], c["completed"], c["failed"]) == (64, 64, 0)
        assert c["output_tokens"] == c["usage_output_tokens"] == r["server_output_tokens"] == 64 * 48
        assert r["servers"]["h1"]["generation_tokens"] == 64 * 48 and r["servers"]["h1"]["completed"] == 64
        # the usage's prompt tokens against the engine's prompt counter: equal
        assert c["usage_prompt_tokens"] == r["server_prompt_tokens"] == r["servers"]["h1"]["prompt_tokens"] > 0
        assert c["responses_without_usage"] == 0
        # with the bench the only client, usage and counters agree exactly
        assert r["valid"] is True and r["diff_pct"] == 0.0 and r["prompt_diff_pct"] == 0.0, r["validity"]
        # the stand-in emits canonical tokens: the client's re-tokenized count is the same here
        assert c["retokenized_output_tokens"] == 64 * 48 and r["retokenized_diff_pct"] == 0.0
        assert c["ttft_ms"]["p99"] >= c["ttft_ms"]["p50"] > 0 and c["tpot_ms"]["p50"] > 0
        lg = r["load_generator"]
        assert lg["cpu_s"] > 0 and lg["cpu_count"] == os.cpu_count() and isinstance(lg["client_bound"], bool)
        assert r["aiperf_rc"] == 0
        assert_no_key(tmp_path / "point", proc.stdout + proc.stderr)
        # the key reached aiperf through its environment only: the config names the variable
        assert "${KF_BENCH_API_KEY}" in (tmp_path / "point" / "aiperf-config.yaml").read_text()
    finally:
        srv.stop()


@pytest.fixture()
def fleet(tmp_path):
    servers = bk.start_servers(tmp_path, 2, KUNLUN_SIM_TOKENS_PER_SECOND="200")
    proxy = bk.Proxy([("127.0.0.1", s.port) for s in servers])
    yield tmp_path, servers, proxy
    proxy.stop()
    for s in servers:
        s.stop()


SMALL = dict(
    bench_concurrency=[1, 8],
    bench_requests=16,
    bench_isl=128,
    bench_osl=24,
    bench_single_requests=2,
    bench_single_osl=16,
    bench_long_isl=2048,
    bench_long_osl=8,
    bench_long_concurrency=2,
    bench_long_requests=2,
    bench_long_per_host=False,
    bench_fleet_min_concurrency=8,
    bench_request_timeout=60,
    # One aiperf worker, the server's token counts (no client re-tokenizing): less CPU a
    # point. These tests check gates and refusals; the counts, test_one_point_client_and_servers_agree.
    bench_workers=1,
    bench_retokenize=False,
)


def test_a_host_dying_mid_bench_fails_the_gates_names_it_and_nothing_hangs(fleet):
    tmp, servers, proxy = fleet
    model = bk.model_dir(tmp / "models")
    # The fewest points that still show it (each is an aiperf start, ~10 CPU-s): the fleet's
    # single stream (h2 alive), its c8 (h2 dies), each host's single stream (h2's finds
    # nothing listening). A long point or a host sweep would fail the same way.
    small = dict(SMALL, bench_host_concurrency=[1], bench_long_enabled=False)
    bk.write_inventory(tmp / "inv", servers, proxy.url, model, tmp / "reports", **small)

    # h2 dies once the fleet's first point is on disk: the fleet's c8 point loses half its
    # connections, h2's own point finds nothing listening.
    def kill_h2():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if list((tmp / "reports").glob("bench-*/points/fleet-single/profile_export.jsonl")):
                servers[1].stop()
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_h2)
    killer.start()
    proc = bk.run_bench(tmp / "inv", timeout=900)
    killer.join()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Bench: FAIL" in out, out[-4000:]
    (run,) = bk.run_dirs(tmp / "reports")
    for name in ("results.json", "report.html", "report.md"):
        assert (run / name).is_file(), name
    res = bk.load_results(run)
    assert res["verdict"] == "FAIL"
    status = {(g["gate"], g["target"]): g["status"] for g in res["gates"]}
    assert status[("single stream", "h1")] == "PASS" and status[("points valid and served", "h1")] == "PASS"
    assert status[("points valid and served", "h2")] == "FAIL" and status[("single stream", "h2")] == "FAIL"
    assert status[("fleet throughput", "fleet")] == "FAIL"
    h2 = res["hosts"]["h2"]
    assert h2["failed_requests"] > 0 and "fleet-c8" in h2["fleet_counter_errors"]
    fleet_c8 = next(p for p in res["points"] if p["label"] == "fleet-c8")
    assert fleet_c8["valid"] is False and "h2" in fleet_c8["validity"]
    md = (run / "report.md").read_text()
    assert "## Failures" in md and "counters unreadable" in md and "| h2-single |" in md
    assert_no_key(run, out)


def test_check_mode_measures_nothing(fleet):
    tmp, servers, proxy = fleet
    model = bk.model_dir(tmp / "models")
    bk.write_inventory(tmp / "inv", servers, proxy.url, model, tmp / "reports", **SMALL)
    before = [generation_tokens(s) for s in servers]
    proc = bk.run_bench(tmp / "inv", "--check", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "check mode - the bench sends no load, reads no counters and writes no report" in out
    assert not (tmp / "reports").exists() or not bk.run_dirs(tmp / "reports")
    assert [generation_tokens(s) for s in servers] == before


def test_more_streams_than_the_controller_can_open_are_refused_before_any_load(fleet):
    """Fleet points only (an empty per-host sweep): the check counts the points that run
    (the fleet's largest), rather than failing on the empty sweep's maximum."""
    tmp, servers, proxy = fleet
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("not applicable: this machine has no hard open-files limit to exceed")
    model = bk.model_dir(tmp / "models")
    bk.write_inventory(
        tmp / "inv",
        servers,
        proxy.url,
        model,
        tmp / "reports",
        **dict(SMALL, bench_concurrency=[1, hard + 1], bench_host_concurrency=[]),
    )
    before = [generation_tokens(s) for s in servers]
    proc = bk.run_bench(tmp / "inv", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "The controller can open enough connections" in out and "Fix: raise the hard limit" in out
    assert "largest fleet point %d, 0 host(s) side by side" % (hard + 1) in out
    assert not list((tmp / "reports").glob("bench-*/points/*"))
    assert [generation_tokens(s) for s in servers] == before
