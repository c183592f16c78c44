"""The canary gate of a stack upgrade (module_utils/canary.py): each gate passing and failing
with both figures in its message, the thresholds' defaults and overrides, figures that were
not measured (never a silent pass), and the golden-output verdict as its own gate."""

import pytest

from ansible.module_utils import canary

BASELINE = {
    "single_stream_tok_s": 35.0,
    "output_tok_s": 4850.0,
    "ttft_p99_s": 0.40,
    "tpot_p99_s": 0.050,
    "failures": 0,
}
EQUAL = {"passed": True, "verdict": "outputs equal: 8 prompts, 32 tokens each, token for token"}


def canary_figures(**over):
    figures = dict(BASELINE, outputs=EQUAL)
    figures.update(over)
    return figures


def by_name(result):
    return {g["name"]: g for g in result["gates"]}


def test_a_canary_equal_to_the_baseline_passes_every_gate():
    result = canary.gate(BASELINE, canary_figures())
    assert result["passed"] is True and result["failed"] == []
    assert [g["name"] for g in result["gates"]] == list(canary.GATES)
    assert all(g["passed"] for g in result["gates"])
    assert result["message"] == "PASS: 6 gates"


def test_the_defaults_are_the_issues():
    assert canary.THRESHOLDS == {
        "throughput_min_ratio": 0.95,
        "single_stream_min_ratio": 0.95,
        "ttft_p99_max_ratio": 1.10,
        "tpot_p99_max_ratio": 1.10,
        "failures_max": 0,
        "outputs_must_pass": True,
    }


def test_throughput_below_the_ratio_fails_with_both_figures():
    result = canary.gate(BASELINE, canary_figures(output_tok_s=1020.0))
    gate = by_name(result)["throughput"]
    assert result["passed"] is False and result["failed"] == ["throughput"]
    assert gate == {
        "name": "throughput",
        "passed": False,
        "baseline": 4850.0,
        "canary": 1020.0,
        "limit": 4607.5,
        "message": "canary output 1020 tok/s is 21 % of the baseline's 4850 (needs >= 95 %)",
    }
    assert result["message"] == "FAIL (throughput): " + gate["message"]


def test_each_gate_at_its_limit_passes_and_just_past_it_fails():
    at = canary_figures(single_stream_tok_s=35.0 * 0.95, output_tok_s=4850.0 * 0.95, ttft_p99_s=0.44, tpot_p99_s=0.055)
    assert canary.gate(BASELINE, at)["passed"] is True, canary.gate(BASELINE, at)["message"]
    past = canary_figures(single_stream_tok_s=33.2, output_tok_s=4600.0, ttft_p99_s=0.4404, tpot_p99_s=0.0551)
    result = canary.gate(BASELINE, past)
    assert result["failed"] == ["single_stream", "throughput", "ttft_p99", "tpot_p99"]
    gates = by_name(result)
    assert gates["single_stream"]["message"] == (
        "canary single-stream decode 33.2 tok/s is 94.9 % of the baseline's 35 (needs >= 95 %)"
    )
    # 94.85 % does not read as "95 %" next to "needs >= 95 %".
    assert gates["throughput"]["message"] == "canary output 4600 tok/s is 94.8 % of the baseline's 4850 (needs >= 95 %)"
    assert gates["ttft_p99"]["message"] == "canary TTFT p99 0.44 s is 110.1 % of the baseline's 0.4 s (needs <= 110 %)"
    assert gates["tpot_p99"]["message"] == (
        "canary TPOT p99 0.0551 s is 110.2 % of the baseline's 0.05 s (needs <= 110 %)"
    )
    assert gates["ttft_p99"]["limit"] == pytest.approx(0.44)


def test_a_faster_canary_passes_the_latency_gates():
    result = canary.gate(BASELINE, canary_figures(ttft_p99_s=0.2, tpot_p99_s=0.03, output_tok_s=6000.0))
    assert result["passed"] is True
    assert by_name(result)["ttft_p99"]["message"] == (
        "canary TTFT p99 0.2 s is 50 % of the baseline's 0.4 s (needs <= 110 %)"
    )


@pytest.mark.parametrize("figure,gate_name", [(g[1], g[0]) for g in canary.RATIO_GATES] + [("failures", "failures")])
def test_a_figure_the_canary_did_not_measure_fails_its_gate(figure, gate_name):
    figures = canary_figures()
    del figures[figure]
    result = canary.gate(BASELINE, figures)
    assert result["failed"] == [gate_name]
    gate = by_name(result)[gate_name]
    assert gate["canary"] is None and gate["passed"] is False
    assert "the canary's %s was not measured" % figure in gate["message"]


@pytest.mark.parametrize("figure,gate_name", [(g[1], g[0]) for g in canary.RATIO_GATES] + [("failures", "failures")])
def test_a_figure_the_baseline_did_not_measure_fails_its_gate(figure, gate_name):
    base = dict(BASELINE, **{figure: None})
    result = canary.gate(base, canary_figures())
    assert result["failed"] == [gate_name]
    assert "the baseline's %s was not measured" % figure in by_name(result)[gate_name]["message"]


def test_nothing_measured_fails_every_gate():
    result = canary.gate({}, {})
    assert result["passed"] is False and result["failed"] == list(canary.GATES)
    assert by_name(result)["outputs"]["message"] == (
        "outputs: the golden-output check was not measured (no verdict from golden_outputs)"
    )
    assert canary.gate(None, None)["failed"] == list(canary.GATES)


@pytest.mark.parametrize("value", ["fast", True, float("nan"), [1]])
def test_a_figure_that_is_not_a_number_fails(value):
    result = canary.gate(BASELINE, canary_figures(output_tok_s=value))
    assert result["failed"] == ["throughput"]
    assert "the canary's output_tok_s is %r, not a number" % (value,) in by_name(result)["throughput"]["message"]


def test_a_baseline_of_zero_gives_no_ratio():
    result = canary.gate(dict(BASELINE, output_tok_s=0), canary_figures())
    assert result["failed"] == ["throughput"]
    assert by_name(result)["throughput"]["message"] == (
        "throughput: the baseline's output is 0 tok/s: no ratio to take (a failed baseline measurement)"
    )


def test_canary_failures_fail_and_a_baseline_with_failures_is_no_reference():
    result = canary.gate(BASELINE, canary_figures(failures=3))
    assert result["failed"] == ["failures"]
    assert by_name(result)["failures"]["message"] == "canary had 3 failed requests (baseline 0; needs <= 0)"
    result = canary.gate(dict(BASELINE, failures=2), canary_figures())
    assert result["failed"] == ["failures"]
    assert by_name(result)["failures"]["message"] == (
        "the baseline had 2 failed requests (needs <= 0): it is no reference for the canary's 0; measure again"
    )
    # Allowed failures (a threshold given) pass.
    assert canary.gate(BASELINE, canary_figures(failures=1), {"failures_max": 1})["passed"] is True


def test_the_golden_output_verdict_is_a_gate():
    differ = {
        "passed": False,
        "verdict": "outputs differ: prompt 3 ('def fibonacci(n):') diverges at token 5 of 32",
        "failing": [3],
    }
    result = canary.gate(BASELINE, canary_figures(outputs=differ))
    assert result["failed"] == ["outputs"]
    gate = by_name(result)["outputs"]
    assert gate["canary"] is False and gate["limit"] == "passed"
    assert gate["message"] == "golden outputs: " + differ["verdict"]
    # A plain boolean verdict is read too.
    assert canary.gate(BASELINE, canary_figures(outputs=True))["passed"] is True
    # Not required: reported, not failing.
    relaxed = canary.gate(BASELINE, canary_figures(outputs=differ), {"outputs_must_pass": False})
    assert relaxed["passed"] is True
    assert by_name(relaxed)["outputs"]["message"].startswith("golden outputs (not required, outputs_must_pass false)")


def test_a_verdict_without_passed_is_not_a_measurement():
    result = canary.gate(BASELINE, canary_figures(outputs={"verdict": "something"}))
    assert result["failed"] == ["outputs"]
    assert "was not measured" in by_name(result)["outputs"]["message"]


def test_thresholds_override_the_defaults():
    figures = canary_figures(output_tok_s=4000.0, ttft_p99_s=0.5)
    assert canary.gate(BASELINE, figures)["failed"] == ["throughput", "ttft_p99"]
    relaxed = canary.gate(BASELINE, figures, {"throughput_min_ratio": 0.8, "ttft_p99_max_ratio": 1.3})
    assert relaxed["passed"] is True
    assert by_name(relaxed)["throughput"]["message"] == (
        "canary output 4000 tok/s is 82 % of the baseline's 4850 (needs >= 80 %)"
    )
    assert by_name(relaxed)["ttft_p99"]["limit"] == pytest.approx(0.52)
    # None keeps the default.
    assert canary.gate(BASELINE, figures, {"throughput_min_ratio": None})["failed"] == ["throughput", "ttft_p99"]


@pytest.mark.parametrize(
    "thresholds,words",
    [
        ({"throughput_ratio": 0.9}, "unknown canary threshold 'throughput_ratio'"),
        ({"ttft_p99_max_ratio": "1.2"}, "ttft_p99_max_ratio is '1.2'; it must be a number above 0"),
        ({"throughput_min_ratio": 0}, "throughput_min_ratio is 0"),
        ({"failures_max": -1}, "failures_max is -1"),
        ({"outputs_must_pass": "yes"}, "outputs_must_pass is 'yes'; it must be true or false"),
    ],
)
def test_a_bad_threshold_is_refused(thresholds, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        canary.gate(BASELINE, canary_figures(), thresholds)


def test_the_percentages_read_right():
    assert canary.percent(0.9496, 0.95) == "94.96"
    assert canary.percent(0.95, 0.95) == "95"
    assert canary.percent(1.1, 1.1) == "110"
    assert canary.percent(0.2103, 0.95) == "21"
    assert canary.limit_percent(0.955) == "95.5"
    assert canary.fmt(4850.0) == "4850" and canary.fmt(35.24) == "35.2" and canary.fmt(0.0412) == "0.0412"
