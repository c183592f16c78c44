"""library/canary_measure.py: the pure parts on small inputs (the decode rate, the per-second
series, a point's figures through bench_results.summarize, the argument checks), the
refusals before any request (a bad threshold, bad arguments, check mode sends nothing), and
the request's failure classes against a small HTTP server of this test on 127.0.0.1 (an
HTTP error, a stream that breaks off, a short stream, a streamed error). The module against
two stand-in vllm servers, PASS and FAIL: tests/upgrade/test_canary_measure_local.py."""

import http.server
import json
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

import canary_measure as cm
from module_docs import documented_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifacts"))

from standin_helpers import free_port  # noqa: E402


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


def run(args, check_mode=False):
    """main() with the given arguments: (failed, result)."""
    module_args = dict(args)
    if check_mode:
        module_args["_ansible_check_mode"] = True

    def exit_json(self, **kwargs):
        raise ExitJson(kwargs)

    def fail_json(self, **kwargs):
        kwargs["failed"] = True
        raise FailJson(kwargs)

    with (
        patch_module_args(module_args),
        mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json),
    ):
        with pytest.raises((ExitJson, FailJson)) as exc:
            cm.main()
    return exc.type is FailJson, exc.value.args[0]


def rec(start, first, chunks, end, usage=None, error=None):
    return {
        "start": start,
        "first": first,
        "end": end,
        "chunks": list(chunks),
        "usage_tokens": usage,
        "prompt_tokens": None,
        "error": error,
    }


def test_documentation_matches_the_argument_spec(monkeypatch):
    doc, spec = documented_spec(monkeypatch, cm)
    assert spec["api_key"]["no_log"] is True
    assert set(doc["options"]["golden_tolerance"]["suboptions"]) == {"min_agreeing_tokens"}


# --------------------------------------------------------------------------- the maths


@pytest.mark.parametrize(
    "tokens, first, last, rate",
    [
        (256, 10.0, 12.55, 100.0),  # 255 gaps in 2.55 s
        (2, 1.0, 1.5, 2.0),
        (1, 1.0, 1.0, None),  # one token: no gap
        (0, None, None, None),
        (5, 2.0, 2.0, None),  # no time between
    ],
)
def test_decode_rate(tokens, first, last, rate):
    assert cm.decode_rate(tokens, first, last) == (pytest.approx(rate) if rate else None)


def test_the_series_bins_tokens_per_second_from_the_common_start():
    events = [(100.2, 10), (100.9, 5), (101.5, 20), (102.0, 4), (102.25, 1)]
    # three seconds from 100.0; the last covers 0.5 s (to 102.5): 5 tokens there -> 10 tok/s
    assert cm.rate_series(events, 100.0, 102.5) == [[0.0, 15.0], [1.0, 20.0], [2.0, 10.0]]
    # an event before the start is not the point's; one at the end falls in the last bin
    assert cm.rate_series([(99.0, 7), (103.0, 3)], 100.0, 103.0) == [[0.0, 0.0], [1.0, 0.0], [2.0, 3.0]]
    assert cm.rate_series(events, 100.0, None) == [] and cm.rate_series(events, 100.0, 100.0) == []
    # the series adds up to the tokens
    series = cm.rate_series(events, 100.0, 103.0)
    assert sum(rate for _, rate in series) == 40


def test_a_responses_tokens_are_spread_over_its_chunks():
    # usage says 6 tokens over 3 chunks with text: 2 each; without usage, 1 a chunk
    events = cm.chunk_events([rec(0, 1, [1, 2, 3], 4, usage=6), rec(0, 1, [1, 2], 3), rec(0, None, [], 1)])
    assert events == [(1, 2.0), (2, 2.0), (3, 2.0), (1, 1.0), (2, 1.0)]


def test_a_points_figures_are_vllm_bench_serves():
    # Two requests of 11 tokens over the point's wall time 0..2 s (first sent to last ended):
    # 22 tokens / 2 s; TTFT 0.2 and 0.4 s; TPOT (latency - TTFT) / 10: 0.08 and 0.16 s.
    # (bench_results counts times from a non-zero clock, as time.monotonic's: from 10 s here.)
    records = [
        rec(10.0, 10.2, [10.2 + i * 0.08 for i in range(11)], 11.0, usage=11),
        rec(10.0, 10.4, [10.4 + i * 0.16 for i in range(11)], 12.0, usage=11),
        rec(10.5, None, [], 10.6, error="HTTP 500"),
    ]
    figures = cm.point_figures(records, concurrency=2)
    assert figures["output_tok_s"] == pytest.approx(11.0)
    assert figures["ttft_p99_s"] == pytest.approx(0.2 + 0.2 * 0.99, abs=1e-4)
    assert figures["tpot_p99_s"] == pytest.approx(0.08 + 0.08 * 0.99, abs=1e-4)
    assert figures["ttft_p50_s"] == pytest.approx(0.3)
    assert figures["failures"] == 1 and figures["errors"] == {"HTTP 500": 1}
    assert figures["requests"] == 3 and figures["completed"] == 2 and figures["concurrency"] == 2
    assert figures["output_tokens"] == 22 and figures["duration_s"] == 2.0


def test_a_point_where_everything_failed_has_no_throughput():
    figures = cm.point_figures([rec(10.0, None, [], 11.0, error="HTTP 503")], concurrency=1)
    assert figures["output_tok_s"] is None and figures["ttft_p99_s"] is None and figures["failures"] == 1


def test_request_prompts_differ_from_the_first_word():
    assert cm.request_prompt("hello", 0) == "Request 1. hello"
    assert cm.request_prompt("hello", 11) == "Request 12. hello"


# --------------------------------------------------------------------------- arguments

BASE = {"baseline_url": "http://10.0.0.2:8000", "canary_url": "http://10.0.0.3:8000", "model": "m"}


def args(**over):
    a = dict(BASE)
    a.update(over)
    return a


@pytest.mark.parametrize(
    "over, words",
    [
        ({"thresholds": {"throughput_min": 0.9}}, "unknown canary threshold 'throughput_min'"),
        ({"thresholds": {"ttft_p99_max_ratio": 0}}, "ttft_p99_max_ratio is 0; it must be a number above 0"),
        ({"canary_url": "10.0.0.3:8000"}, "canary_url '10.0.0.3:8000' is not an http:// or https:// URL"),
        ({"canary_url": "http://10.0.0.2:8000/"}, "baseline_url and canary_url are the same server"),
        ({"concurrency": 0}, "concurrency is 0; it must be 1 or more"),
        ({"single_stream_tokens": 1}, "a decode rate needs 2 or more"),
        ({"point_duration": 0}, "give point_requests > 0, or point_duration > 0 seconds"),
        ({"golden_prompts": ["a", " "]}, "golden_prompts is empty or holds an empty prompt"),
        (
            {"golden_tolerance": {"min_agreeing_tokens": 33}},
            "min_agreeing_tokens is 33; it must be between 0 (exact) and golden_max_tokens (32)",
        ),
    ],
)
def test_bad_arguments_fail_before_any_request(over, words):
    """The hosts are addresses nothing answers on: a request would fail otherwise."""
    failed, result = run(args(**over))
    assert failed and words in result["msg"], result["msg"]
    assert result["measured"] is False


def test_check_mode_measures_nothing_and_says_what_it_would():
    port = free_port()  # nothing listens: a request would fail the module
    over = {"canary_url": "http://127.0.0.1:%d" % port, "point_requests": 64, "thresholds": {"failures_max": 2}}
    failed, result = run(args(**over), check_mode=True)
    assert not failed and result["skipped"] is True and result["measured"] is False and result["passed"] is None
    assert result["changed"] is False
    assert result["msg"] == (
        "check mode: would measure http://127.0.0.1:%d against http://10.0.0.2:8000 side by side (8 golden "
        "prompts, a 256-token single stream, 32 streams for 64 requests of 256 tokens each), nothing sent" % port
    )
    assert result["settings"]["thresholds"]["failures_max"] == 2.0
    assert result["settings"]["thresholds"]["throughput_min_ratio"] == 0.95


def test_check_mode_still_refuses_a_bad_threshold():
    failed, result = run(args(thresholds={"outputs_must_pass": "yes"}), check_mode=True)
    assert failed and "outputs_must_pass is 'yes'; it must be true or false" in result["msg"]


def test_a_host_that_does_not_answer_is_named_with_the_fix():
    failed, result = run(args(baseline_url="http://127.0.0.1:%d" % free_port(), timeout=5))
    assert failed and result["msg"].startswith("the baseline (http://127.0.0.1:")
    assert "GET http://127.0.0.1:" in result["msg"] and "Fix: start the host's serving" in result["msg"]


# --------------------------------------------------------------------------- a request's failures


class Answers(http.server.BaseHTTPRequestHandler):
    """/v1/models lists "m"; a completion answers as its prompt says (the test's cases)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send(200, json.dumps({"data": [{"id": "m"}]}).encode())

    def send(self, status, body, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        case, n = body["prompt"], body["max_tokens"]
        if case == "http 500":
            return self.send(500, b'{"error": {"message": "boom"}}')
        chunks = [{"choices": [{"text": " w%d" % i}]} for i in range(n)]
        if case == "short":
            chunks = chunks[: n - 1]
        if case == "streamed error":
            chunks = chunks[:1] + [{"error": {"message": "engine died"}}]
        if case == "not a stream":
            chunks = chunks[:1] + [["a list"]]
        usage = {"choices": [], "usage": {"completion_tokens": len(chunks), "prompt_tokens": 3}}
        lines = ["data: %s\n\n" % json.dumps(c) for c in chunks + [usage]]
        if case != "broken":
            lines.append("data: [DONE]\n\n")
        data = "".join(lines).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def answers():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield cm.Host("canary", "http://127.0.0.1:%d/v1" % server.server_address[1], "key", 10)
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "case, error",
    [
        ("fine", None),
        ("http 500", "HTTP 500"),
        ("short", "fewer tokens than asked (ignore_eos)"),
        ("broken", "the stream broke off before [DONE]"),
        ("streamed error", "streamed an error"),
        ("not a stream", "AttributeError: 'list' object has no attribute 'get'"),
    ],
)
def test_a_request_fails_as_a_real_client_sees_it(answers, case, error):
    got = answers.stream("m", case, 4)
    assert got["error"] == error
    if error is None:
        assert got["usage_tokens"] == 4 and len(got["chunks"]) == 4 and got["first"] == got["chunks"][0]
        assert got["start"] <= got["first"] <= got["end"]


def test_readiness_reads_the_model_list(answers):
    answers.ready("m")
    with pytest.raises(cm.Refused, match=r"the canary \(http://127.0.0.1:\d+\): GET .* lists m, not 'other'"):
        answers.ready("other")
