"""kunlun_fleet/bench/results.py: the gates judged from the measured points, and
report.py's pages (the plots themselves are drawn in tests/bench/test_bench_page.py, in
the bench venv; here they are stand-in images)."""

import copy
import json
import re
from pathlib import Path

import pytest

from kunlun_fleet.bench import report, results

RAW = Path(__file__).resolve().parents[1] / "bench" / "fixtures" / "raw.json"


def point(
    target,
    kind,
    conc,
    tok_s=1000.0,
    decode=35.0,
    failed=0,
    requests=100,
    valid=True,
    client_bound=False,
    servers=None,
    ttft_p99=500.0,
):
    completed = requests - failed
    out = int(tok_s * 10)
    return {
        "label": "%s-%s" % (target, "single" if kind == "single" else ("long" if kind == "long" else "c%d" % conc)),
        "target": target,
        "kind": kind,
        "concurrency": conc,
        "measured": True,
        "valid": valid,
        "validity": "within 3.0%"
        if valid
        else "client counted 10 output tokens, the servers 20 (-50.0%, more than 3.0%)",
        "diff_pct": 0.0 if valid else -50.0,
        "server_output_tokens": out if valid else 2 * out,
        "servers": servers or {},
        "settings": {"isl": 32768 if kind == "long" else 512},
        "load_generator": {"client_bound": client_bound, "cores_used": 0.5},
        "aiperf_rc": 0,
        "aiperf_tail": [],
        "client": {
            "requests": requests,
            "completed": completed,
            "failed": failed,
            "errors": {"502 Bad Gateway: upstream gone": failed} if failed else {},
            "output_tokens": out,
            "duration_s": 10.0,
            "output_tok_s": tok_s,
            "requests_per_s": 2.0,
            "decode_tok_s": decode,
            "ttft_ms": {"mean": 100.0, "p50": 80.0, "p90": 200.0, "p99": ttft_p99},
            "tpot_ms": {"mean": 1000.0 / decode, "p50": 28.0, "p90": 30.0, "p99": 40.0},
            "itl_ms": {"mean": 28.0, "p50": 28.0, "p90": 30.0, "p99": 50.0},
        },
    }


def raw(points, hosts=("h1", "h2")):
    return {
        "meta": {
            "hosts": list(hosts),
            "host_count": len(hosts),
            "inventory_host_count": len(hosts),
            "started_utc": "20260101T000000Z",
            "model": "m",
            "fleet_url": "http://gw:8080",
            "images": {},
            "stack": {"vllm": "0.15.1"},
            "serving": {"max_num_seqs": 256},
        },
        "settings": {
            "concurrency": [1, 1024],
            "host_concurrency": [1, 1024],
            "tolerance_pct": 3.0,
            "max_failed_pct": 0.0,
            "isl": 512,
            "osl": 512,
        },
        "targets": {"single_stream_tok_s": 30.0, "fleet_output_tok_s": 5000.0, "fleet_min_concurrency": 1000},
        "plan_demands": [{"concurrency": 1000, "ttft_p99_s": 2}],
        "points": points,
    }


def healthy():
    pts = [
        point("fleet", "single", 1, tok_s=30, decode=35),
        point("fleet", "sweep", 1024, tok_s=6200),
        point("fleet", "long", 16, requests=16),
    ]
    for h in ("h1", "h2"):
        pts += [point(h, "single", 1, tok_s=30, decode=35), point(h, "sweep", 1024, tok_s=3200)]
    return raw(pts)


def gate(res, name, target):
    return next(g for g in res["gates"] if g["gate"] == name and g["target"] == target)


def test_a_healthy_fleet_passes_every_gate():
    res = results.build(healthy())
    assert res["verdict"] == "PASS"
    assert {(g["gate"], g["target"]) for g in res["gates"]} >= {
        ("single stream", "fleet"),
        ("fleet throughput", "fleet"),
        ("long context", "fleet"),
        ("single stream", "h1"),
        ("single stream", "h2"),
        ("points valid and served", "h2"),
    }
    fleet = gate(res, "fleet throughput", "fleet")
    assert fleet["figure"] == 6200 and "6200 output tok/s at 1024 concurrent" in fleet["detail"]


def test_fleet_below_target_fails():
    r = healthy()
    r["points"][1] = point("fleet", "sweep", 1024, tok_s=4999)
    res = results.build(r)
    assert gate(res, "fleet throughput", "fleet")["status"] == "FAIL" and res["verdict"] == "FAIL"


def test_fleet_target_only_counts_at_thousand_concurrent_or_more():
    r = healthy()
    r["points"][1] = point("fleet", "sweep", 512, tok_s=9000)
    g = gate(results.build(r), "fleet throughput", "fleet")
    assert g["status"] == "FAIL" and "not measured at 1000 or more" in g["detail"]


def test_an_invalid_point_does_not_count_and_says_why():
    r = healthy()
    r["points"][1] = point("fleet", "sweep", 1024, tok_s=9000, valid=False)
    res = results.build(r)
    g = gate(res, "fleet throughput", "fleet")
    assert g["status"] == "FAIL" and "invalid: client counted" in g["detail"]
    assert gate(res, "points valid and served", "fleet")["status"] == "FAIL"
    p = next(p for p in res["points"] if p["label"] == "fleet-c1024")
    assert p["counts"] is False and p["why_not"].startswith("invalid")


def test_a_host_failing_mid_bench_fails_the_gates_and_is_named():
    r = healthy()
    r["points"][1] = point(
        "fleet",
        "sweep",
        1024,
        tok_s=5100,
        failed=12,
        servers={"h1": {"generation_tokens": 30000}, "h2": {"error": "URLError: refused"}},
    )
    r["points"][-1] = point("h2", "sweep", 1024, tok_s=0, failed=100)
    res = results.build(r)
    assert res["verdict"] == "FAIL"
    assert gate(res, "fleet throughput", "fleet")["status"] == "FAIL"
    assert "12 of 100 requests failed" in gate(res, "fleet throughput", "fleet")["detail"]
    assert gate(res, "points valid and served", "h2")["status"] == "FAIL"
    assert gate(res, "points valid and served", "h1")["status"] == "PASS"
    assert res["hosts"]["h2"]["failed_requests"] == 100 and res["hosts"]["h2"]["fleet_counter_errors"] == [
        "fleet-c1024"
    ]
    assert res["hosts"]["h1"]["fleet_share_tokens"] == 30000
    rows = report.error_rows(res)
    assert ["fleet-c1024", "h2", "-", "counters unreadable: URLError: refused"] in rows
    assert ["h2-c1024", "h2", "100", "502 Bad Gateway: upstream gone"] in rows


def test_single_stream_below_target_fails_for_that_target_only():
    r = healthy()
    r["points"][3] = point("h1", "single", 1, decode=29.9)
    res = results.build(r)
    assert gate(res, "single stream", "h1")["status"] == "FAIL"
    assert gate(res, "single stream", "h2")["status"] == "PASS"


def test_no_fleet_endpoint_is_a_failed_gate_not_a_pass():
    r = raw([point("h1", "single", 1), point("h1", "sweep", 1024, tok_s=9000)], hosts=("h1",))
    g = gate(results.build(r), "fleet throughput", "fleet")
    assert g["status"] == "FAIL" and "no fleet endpoint" in g["detail"]


def test_a_long_context_point_with_a_failure_fails():
    r = healthy()
    r["points"][2] = point("fleet", "long", 16, requests=16, failed=1)
    assert gate(results.build(r), "long context", "fleet")["status"] == "FAIL"


def test_a_saturated_client_is_said_next_to_the_figure():
    r = healthy()
    r["points"][1] = point("fleet", "sweep", 1024, tok_s=6200, client_bound=True)
    res = results.build(r)
    assert "machine was saturated" in gate(res, "fleet throughput", "fleet")["detail"]
    assert res["client_bound_points"] == ["fleet-c1024"]


def test_gate_lines_start_with_pass_or_fail():
    for g in results.build(healthy())["gates"]:
        assert results.gate_line(g).split(" ", 1)[0] in ("PASS", "FAIL")


def test_the_recorded_run_builds_and_renders(tmp_path):
    """The raw.json of a real local run (2 stand-in hosts behind a proxy): results and
    both pages, with stand-in plots."""
    res = results.build(json.loads(RAW.read_text()))
    assert res["verdict"] == "PASS" and res["curves"]["fleet"][0]["concurrency"] == 1
    page = report.render_html(res, {"throughput": "AAAA", "ttft": "BBBB", "tpot": "CCCC"})
    assert page.count("src='data:image/png;base64,") == 3
    # self-contained: nothing to fetch (every src/href is a data URI; no script, no stylesheet link)
    assert re.search(r"""(src|href)=['"](?!data:)""", page) is None
    assert "<script" not in page and "<link" not in page
    assert "TPOT is (latency - TTFT) / (output tokens - 1)" in page
    md = report.render_md(res)
    assert md.startswith("# Fleet benchmark") and "## Capacity plan" in md and "| fleet-c16 |" in md
    results.write(res, str(tmp_path))
    again = results.load(str(tmp_path / "results.json"))
    assert again["gates"] == res["gates"]


def test_latest_results(tmp_path):
    assert results.latest(str(tmp_path)) is None
    for name in ("bench-20260101T000000Z", "bench-20260102T000000Z", "bench-20260103T000000Z"):
        (tmp_path / name).mkdir()
    for name in ("bench-20260101T000000Z", "bench-20260102T000000Z"):
        (tmp_path / name / "results.json").write_text("{}")
    assert results.latest(str(tmp_path)).endswith("bench-20260102T000000Z/results.json")


def test_build_does_not_change_its_input():
    r = healthy()
    before = copy.deepcopy(r)
    results.build(r)
    assert r == before


@pytest.mark.parametrize("field", ["valid", "measured"])
def test_unmeasured_or_invalid_single_stream_fails(field):
    r = healthy()
    r["points"][0][field] = False
    assert gate(results.build(r), "single stream", "fleet")["status"] == "FAIL"
