"""The canary gate's measurement (library/canary_measure.py) against stand-in vllm servers on
127.0.0.1, started with the product's serving flags (tests/bench/benchkit.py), each with an
engine-fault file of its own (kunlun_fleet/sim/artifacts/README.md, "Engine faults"):

- two servers of the same stack, measured side by side through ansible-playbook (the
  module as a play runs it, delegate_to localhost): PASS, every gate, the figures of both
  and the series; in check mode the same task sends nothing;
- the baseline beside a server whose engine is the CPU-sampler case (`slow` in its fault
  file from the start: 32 tok/s for one stream and for the batch): FAIL on throughput and
  on the single stream, the message naming both figures; the outputs still equal (the slow
  engine's numerics are the same).

Small load on this 2-core machine: 8 streams per host, 16 requests of 32 tokens, a
64-token single stream, 16 golden tokens; the stand-ins decode 100 tok/s alone.

The PASS is judged with wide thresholds (SAME_STACK: 50 % and 200 %), passed through the
module's thresholds option: two identical stand-ins measured in the same second over a
one-second point differ by what the machine's other work does to each (measured with two
CPU hogs beside: 393 against 444 tok/s, 89 %; TPOT p99 111 %), and a test must not stand
on timing. The FAIL is judged with the defaults; the slow canary is far outside them
(7 % of the baseline's throughput, 32 % of its single stream)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "real_engine"))

import canary_measure as cm  # noqa: E402
from benchkit import API_KEY, SERVED, model_dir, serving_args  # noqa: E402
from standin_helpers import Server, make_dev_dir, server_env  # noqa: E402
from test_product import results, run_play  # noqa: E402

from ansible.module_utils.canary import GATES, fmt, thresholds_of  # noqa: E402
from ansible.module_utils.golden import DEFAULT_PROMPTS  # noqa: E402

pytestmark = pytest.mark.slow

SAME_STACK = {
    "throughput_min_ratio": 0.5,
    "single_stream_min_ratio": 0.5,
    "ttft_p99_max_ratio": 2.0,
    "tpot_p99_max_ratio": 2.0,
}
LOAD = {
    "single_stream_tokens": 64,
    "concurrency": 8,
    "point_requests": 16,
    "osl": 32,
    "golden_max_tokens": 16,
    "timeout": 120,
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """baseline and canary (the same stack), and slow (the CPU-sampler case)."""
    tmp = tmp_path_factory.mktemp("canary")
    model = model_dir(tmp / "models")
    dev = make_dev_dir(tmp / "dev", 8)
    started = {}
    try:
        for name, fault in (("baseline", ""), ("canary", ""), ("slow", "slow\n")):
            fault_file = tmp / ("%s-engine-fault" % name)
            fault_file.write_text(fault)
            env = server_env(dev, KUNLUN_SIM_TOKENS_PER_SECOND="100", KUNLUN_SIM_ENGINE_FAULT_FILE=str(fault_file))
            started[name] = Server(serving_args(model), env, tmp / ("%s.log" % name))
        for srv in started.values():
            srv.wait_ready()
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def module_args(baseline, canary, **over):
    a = {"baseline_url": baseline.base, "canary_url": canary.base, "api_key": API_KEY, "model": SERVED}
    a.update(LOAD)
    a.update(over)
    return a


@pytest.fixture(scope="module")
def play(servers, tmp_path_factory):
    """One ansible-playbook run: the measurement, and the same task in check mode."""
    tmp = tmp_path_factory.mktemp("canary-play")
    args = module_args(servers["baseline"], servers["canary"], thresholds=SAME_STACK)
    tasks = [
        {"name": "measure", "canary_measure": args, "register": "canary", "delegate_to": "localhost"},
        {"name": "check mode", "canary_measure": args, "check_mode": True, "delegate_to": "localhost"},
    ]
    doc, proc = run_play(tmp, [{"name": "canary", "hosts": "localhost", "gather_facts": False, "tasks": tasks}])
    found = results(doc)
    assert set(found) == {"measure", "check mode"}, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert API_KEY not in proc.stdout + proc.stderr
    return found


def test_the_same_stack_passes_every_gate(play):
    result = play["measure"]
    assert not result.get("failed"), result.get("msg")
    assert result["passed"] is True, result["message"]
    assert result["changed"] is False and result["measured"] is True
    assert result["message"] == "PASS: %d gates" % len(GATES)
    assert [g["name"] for g in result["gate"]["gates"] if g["passed"]] == list(GATES)
    assert result["settings"]["thresholds"] == dict(thresholds_of({}), **SAME_STACK)
    throughput = next(g for g in result["gate"]["gates"] if g["name"] == "throughput")
    assert throughput["limit"] == pytest.approx(0.5 * result["figures"]["baseline"]["output_tok_s"], abs=1e-3)
    print("\nPASS figures:", json.dumps(result["figures"], sort_keys=True))
    for role in ("baseline", "canary"):
        figures = result["figures"][role]
        assert figures["failures"] == 0 and figures["errors"] == {}
        assert figures["requests"] == figures["completed"] == 16 and figures["concurrency"] == 8
        assert figures["output_tokens"] == 16 * 32
        for key in ("single_stream_tok_s", "output_tok_s", "ttft_p99_s", "tpot_p99_s"):
            assert figures[key] > 0, (role, key)
        assert figures["single_stream_error"] is None
        # the series covers the point second by second
        series = result["series"][role]
        assert series and [s for s, _ in series] == list(range(len(series)))
        assert all(rate > 0 for _, rate in series)
    verdict = result["outputs"]
    assert verdict == result["figures"]["canary"]["outputs"]
    assert (
        verdict["passed"] is True and verdict["verdict"] == "outputs equal: 8 prompts, 16 tokens each, token for token"
    )
    assert verdict["baseline_digest"] == verdict["canary_digest"]
    assert verdict["prompts"] == DEFAULT_PROMPTS and verdict["max_tokens"] == 16


def test_check_mode_measures_nothing(play, servers):
    result = play["check mode"]
    assert result["skipped"] is True and result["measured"] is False and result.get("passed") is None
    assert "figures" not in result and "nothing sent" in result["msg"]
    assert result["settings"]["concurrency"] == 8 and result["settings"]["point_requests"] == 16


def test_a_slow_canary_fails_on_throughput_and_single_stream_naming_both_figures(servers):
    params = dict.fromkeys(("prompt", "golden_prompts", "ca_file", "point_duration"))
    params.update(module_args(servers["baseline"], servers["slow"]), golden_tolerance={}, validate_certs=True)
    result = cm.measure(params, thresholds_of({}))
    print("\nFAIL figures:", json.dumps(result["figures"], sort_keys=True))
    print(result["message"])
    assert result["passed"] is False and result["gate"]["passed"] is False
    assert {"throughput", "single_stream"} <= set(result["gate"]["failed"])
    assert "failures" not in result["gate"]["failed"] and "outputs" not in result["gate"]["failed"]
    base, slow = result["figures"]["baseline"], result["figures"]["canary"]
    assert slow["failures"] == 0 and slow["completed"] == 16 and result["outputs"]["passed"] is True
    assert result["message"].startswith("FAIL (")
    for what, key in (("single-stream decode", "single_stream_tok_s"), ("output", "output_tok_s")):
        words = "canary %s %s tok/s is " % (what, fmt(slow[key]))
        assert (
            words in result["message"]
            and "of the baseline's %s (needs >= 95 %%)" % fmt(base[key]) in (result["message"])
        )
        assert slow[key] < 0.95 * base[key]
