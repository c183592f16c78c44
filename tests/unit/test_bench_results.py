"""module_utils/bench_results.py: aiperf's per-request export read in vllm bench serve's
terms, the servers' Prometheus counters, their agreement, the open-files plan and the
load generator's CPU. The export fixture holds records of a real aiperf 0.13.0 run against
the stand-in server (trimmed), one failed request and one warmup record."""

import json
import resource
from pathlib import Path

import pytest

from ansible.module_utils import bench_results as br

FIX = Path(__file__).parent / "fixtures" / "bench"

METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m",engine="0"} %s
vllm:prompt_tokens_total{model_name="m",engine="0"} %s
vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"} %s
vllm:request_success_total{model_name="m",engine="0",finished_reason="length"} %s
vllm:request_success_total{model_name="m",engine="0",finished_reason="abort"} 3.0
vllm:generation_tokens_created{model_name="m",engine="0"} 1796060000.1
vllm:num_requests_running{model_name="m",engine="0"} 2.0
"""


def test_percentile_matches_numpy_linear():
    # numpy.percentile([1, 2, 3, 4], q): 50 -> 2.5, 90 -> 3.7, 99 -> 3.97
    assert br.percentile([4, 1, 3, 2], 50) == 2.5
    assert br.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert br.percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert br.percentile([7], 99) == 7.0
    assert br.percentile([], 50) is None
    assert br.distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_records_keep_profiling_requests_and_errors():
    records = br.read_records(str(FIX / "profile_export.jsonl"))
    assert len(records) == 4  # the warmup record is not a measured request
    assert [r["ok"] for r in records] == [True, True, True, False]
    assert records[3]["error"] == '401 Unauthorized: {"error":"Unauthorized"}'
    assert records[0]["output_tokens"] == 128 and records[0]["usage_tokens"] == 128
    assert records[0]["itl_ms"][:2] == [842.021158, 871.986986]


def test_summary_uses_vllm_bench_serve_definitions():
    s = br.summarize(br.read_records(str(FIX / "profile_export.jsonl")))
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["errors"] == {'401 Unauthorized: {"error":"Unauthorized"}': 1}
    assert s["output_tokens"] == 384 and s["usage_output_tokens"] == 384 and s["input_tokens"] == 1536
    # duration: first request sent to last response ended, over every record
    start, end = 1796060587450358494, 1796060595282367897
    assert s["duration_s"] == round((end - start) / 1e9, 3)
    assert s["output_tok_s"] == pytest.approx(384 / ((end - start) / 1e9))
    assert s["requests_per_s"] == pytest.approx(3 / ((end - start) / 1e9))
    # TPOT = (latency - TTFT) / (tokens - 1), per request
    tpots = sorted((lat - ttft) / 127 for lat, ttft in ((7789.154579, 124.184342), (7824.0089689999995, 965.943983),
                                                       (7814.548232, 954.5377629999999)))
    assert s["tpot_ms"]["p50"] == pytest.approx(tpots[1])
    assert s["tpot_ms"]["mean"] == pytest.approx(sum(tpots) / 3)
    assert s["decode_tok_s"] == pytest.approx(1000 / (sum(tpots) / 3))
    assert s["ttft_ms"]["p50"] == pytest.approx(954.5377629999999)
    # ITL pools every chunk gap of every completed request (5 each in the fixture)
    assert s["itl_ms"]["p99"] == pytest.approx(br.percentile(
        [g for r in br.read_records(str(FIX / "profile_export.jsonl")) if r["ok"] for g in r["itl_ms"]], 99))


def test_summary_of_nothing_is_zero_not_an_error(tmp_path):
    s = br.summarize(br.read_records(str(tmp_path / "missing.jsonl")))
    assert s["requests"] == 0 and s["output_tok_s"] == 0.0 and s["decode_tok_s"] is None


def test_counters_and_their_delta():
    before = br.counters(METRICS % (100.0, 400.0, 1.0, 2.0))
    after = br.counters(METRICS % (612.0, 1424.0, 1.0, 6.0))
    assert before["generation_tokens"] == 100.0 and before["completed"] == 3.0
    assert before["finished"] == {"stop": 1.0, "length": 2.0, "abort": 3.0}
    d = br.counter_delta(before, after)
    assert d == {"restarted": False, "generation_tokens": 512, "prompt_tokens": 1024, "completed": 4}


def test_a_counter_that_went_down_is_a_restart_not_a_figure():
    d = br.counter_delta(br.counters(METRICS % (900.0, 1.0, 1.0, 1.0)), br.counters(METRICS % (10.0, 1.0, 1.0, 1.0)))
    assert d["restarted"] is True and d["generation_tokens"] is None


def test_counters_missing_from_an_answer():
    c = br.counters("something_else 1\n")
    assert c["generation_tokens"] is None and c["completed"] is None
    assert br.counter_delta(c, c)["generation_tokens"] is None


@pytest.mark.parametrize("client, server, valid", [
    (1000, 1000, True), (1030, 1000, True), (970, 1000, True),
    (1031, 1000, False), (969, 1000, False), (0, 0, True), (10, None, False)])
def test_agreement_within_three_percent(client, server, valid):
    ok, diff, why = br.agreement(client, server, 3.0)
    assert ok is valid
    if server is None:
        assert "could not be read" in why
    elif not valid:
        assert "more than 3.0%" in why and ("client counted %d" % client) in why


def test_fd_plan_ok_raise_refuse():
    assert br.fd_plan(2048, 1024, 20000, 20000)[1] == "ok"
    needed, action, msg = br.fd_plan(2048, 1024, 1024, 4096)
    assert (needed, action) == (3072, "raise") and "raised to 4096" in msg
    needed, action, msg = br.fd_plan(4096, 1024, 1024, 4096)
    assert action == "refuse" and "hard limit 4096" in msg
    assert "/etc/security/limits.conf" in msg and "ulimit -Hn 5120" in msg
    assert br.fd_plan(100000, 1024, 1024, -1)[1] == "raise"  # unlimited hard limit


def test_client_load_flags_a_saturated_client():
    quiet = br.client_load(2.0, 10.0, 2, (0, 1000), (500, 2000))
    assert quiet["cores_used"] == 0.2 and quiet["machine_busy_pct"] == 50.0 and not quiet["client_bound"]
    busy = br.client_load(18.0, 10.0, 2, (0, 1000), (950, 2000))
    assert busy["client_bound"] and "may measure the client, not the fleet" in busy["note"]
    machine = br.client_load(2.0, 10.0, 2, (0, 1000), (960, 2000))  # the machine, not the client process
    assert machine["client_bound"]


def test_aiperf_config_keeps_the_key_out():
    env = br.aiperf_config("http://gw:8080", "m", "/tok", 256, 512, 128, "/out", duration=30, grace=600,
                           timeout=600, workers=8, seed=3)
    text = json.dumps(env)
    assert env["random_seed"] == 3
    cfg = env["benchmark"]
    assert cfg["endpoint"]["api_key"] == "${KF_BENCH_API_KEY}"
    assert cfg["phases"][0] == {"name": "profiling", "kind": "profiling", "type": "concurrency",
                                "concurrency": 256, "duration": 30.0, "grace_period": 600.0}
    assert cfg["endpoint"]["extra"] == {"ignore_eos": True} and cfg["endpoint"]["streaming"] is True
    assert cfg["runtime"]["workers"] == 8 and cfg["datasets"][0]["entries"] == 512
    # vllm bench's random dataset: tokens from the vocabulary, unless another corpus is asked for
    assert cfg["datasets"][0]["prompts"]["corpus"] == "random"
    assert "secret" not in text
    one = br.aiperf_config("http://h:8000", "m", "/tok", 1, 512, 128, "/out", requests=3, workers=2,
                           api_key=False)["benchmark"]
    assert one["runtime"]["workers"] == 1 and one["phases"][0]["requests"] == 3 and "api_key" not in one["endpoint"]
    prose = br.aiperf_config("http://h:8000", "m", "/tok", 1, 512, 128, "/out", requests=3, corpus="sonnet")
    assert prose["benchmark"]["datasets"][0]["prompts"]["corpus"] == "sonnet"


class _Exit(Exception):
    pass


class _Fail(Exception):
    pass


def _run(module, args, check_mode=False):
    from unittest import mock

    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    def exit_json(self, **kw):
        raise _Exit(kw)

    def fail_json(self, **kw):
        raise _Fail(kw)

    args = dict(args, _ansible_check_mode=check_mode)
    with patch_module_args(args), mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json):
        with pytest.raises((_Exit, _Fail)) as exc:
            module.main()
    return exc.type is _Fail, exc.value.args[0]


def test_fd_module_refuses_above_the_hard_limit_with_the_fix():
    import bench_fd_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("not applicable: this machine has no hard open-files limit to exceed")
    failed, r = _run(bench_fd_limit, {"concurrency": hard + 1, "headroom": 16})
    assert failed and r["action"] == "refuse" and r["needed"] == hard + 17
    assert "Fix: raise the hard limit" in r["msg"]
    failed, r = _run(bench_fd_limit, {"concurrency": 1, "headroom": 0})
    assert not failed and r["action"] in ("ok", "raise") and r["changed"] is False


def test_bench_point_check_mode_measures_nothing(tmp_path):
    import bench_point

    failed, r = _run(bench_point, {"aiperf": "/nonexistent/aiperf", "url": "http://127.0.0.1:9", "model": "m",
                                   "tokenizer": str(tmp_path), "api_key": "sk-never-used", "concurrency": 64,
                                   "artifact_dir": str(tmp_path / "out"), "label": "fleet-c64"}, check_mode=True)
    assert not failed and r["measured"] is False and r["changed"] is False
    assert r["msg"] == "check mode: bench point fleet-c64 measures nothing (no load, no counters read)"
    assert not (tmp_path / "out").exists()


def test_bench_point_refuses_a_missing_load_generator_with_the_fix(tmp_path):
    import bench_point

    failed, r = _run(bench_point, {"aiperf": str(tmp_path / "aiperf"), "url": "http://127.0.0.1:9", "model": "m",
                                   "tokenizer": str(tmp_path), "concurrency": 1,
                                   "artifact_dir": str(tmp_path / "out")})
    assert failed and "Fix: make bench-setup" in r["msg"]
