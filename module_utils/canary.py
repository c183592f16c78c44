# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary gate of a stack upgrade (docs/upgrades.md): the canary host's figures against
the baseline host's, measured side by side under the same load, gate by gate.

Figures (one dict per host; a figure that is absent or null was not measured):

    single_stream_tok_s   single-stream decode rate, tok/s (higher is better)
    output_tok_s          output tok/s at the concurrency point (higher is better)
    ttft_p99_s            time to first token, p99, seconds (lower is better)
    tpot_p99_s            time per output token, p99, seconds (lower is better)
    failures              failed requests at the concurrency point
    outputs               (the canary's) the golden-output verdict: the result of
                          library/golden_outputs.py in mode compare, {passed, verdict, ...}

Gates, with their thresholds (gate(): THRESHOLDS are the defaults, a key given overrides):

    single_stream  canary >= single_stream_min_ratio (0.95) x baseline
    throughput     canary >= throughput_min_ratio (0.95) x baseline
    ttft_p99       canary <= ttft_p99_max_ratio (1.10) x baseline
    tpot_p99       canary <= tpot_p99_max_ratio (1.10) x baseline
    failures       canary <= failures_max (0), and the baseline too (a baseline that failed
                   requests is no reference); both counts needed
    outputs        the verdict passed (outputs_must_pass true)

A figure that was not measured, or is not a number, fails its gate with a message saying
so: no gate passes without its figures. A ratio gate whose baseline figure is 0 or below
fails too (no ratio to take). Standard library only; pure functions.
"""

from __future__ import absolute_import, division, print_function

import math

__metaclass__ = type

THRESHOLDS = {
    "throughput_min_ratio": 0.95,
    "single_stream_min_ratio": 0.95,
    "ttft_p99_max_ratio": 1.10,
    "tpot_p99_max_ratio": 1.10,
    "failures_max": 0,
    "outputs_must_pass": True,
}

# (gate, figure, threshold, "min" (canary >= ratio x baseline) or "max", what, unit)
RATIO_GATES = (
    ("single_stream", "single_stream_tok_s", "single_stream_min_ratio", "min", "single-stream decode", "tok/s"),
    ("throughput", "output_tok_s", "throughput_min_ratio", "min", "output", "tok/s"),
    ("ttft_p99", "ttft_p99_s", "ttft_p99_max_ratio", "max", "TTFT p99", "s"),
    ("tpot_p99", "tpot_p99_s", "tpot_p99_max_ratio", "max", "TPOT p99", "s"),
)
GATES = tuple(g[0] for g in RATIO_GATES) + ("failures", "outputs")


def thresholds_of(overrides=None):
    """THRESHOLDS with `overrides` applied; ValueError on an unknown key or a bad value
    (a mistyped threshold must not leave its default silently in force)."""
    out = dict(THRESHOLDS)
    for key, value in (overrides or {}).items():
        if key not in THRESHOLDS:
            raise ValueError("unknown canary threshold %r (known: %s)" % (key, ", ".join(sorted(THRESHOLDS))))
        if value is None:
            continue
        if key == "outputs_must_pass":
            if not isinstance(value, bool):
                raise ValueError("canary threshold outputs_must_pass is %r; it must be true or false" % (value,))
        else:
            number = _number(value)
            if number is None or number < 0 or (key.endswith("_ratio") and number == 0):
                raise ValueError(
                    "canary threshold %s is %r; it must be a number above 0%s"
                    % (key, value, " (or 0)" if key == "failures_max" else "")
                )
            value = number
        out[key] = value
    return out


def _number(value):
    """A finite float from an int or float (not a bool, a string or NaN); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def fmt(value):
    """A figure as a person reads it: 4850, 35.2, 0.412, 0.0412."""
    if value == int(value) and abs(value) < 1e6:
        return "%d" % value
    return "%.0f" % value if abs(value) >= 100 else "%.3g" % value


def limit_percent(limit):
    """A threshold ratio as a percentage: 95, 110, 95.5."""
    return ("%.4f" % (limit * 100.0)).rstrip("0").rstrip(".")


def percent(ratio, limit):
    """ratio as a percentage, with as many decimals as it takes not to read as the limit
    when it is not the limit (94.96 % is not "95 %")."""
    pct, limit_pct = ratio * 100.0, round(limit * 100.0, 6)
    for digits in range(0, 4):
        text = "%.*f" % (digits, pct)
        if abs(pct - limit_pct) < 1e-7 or float(text) != limit_pct:
            return text
    return "%.4f" % pct


# Ratios within this of the limit are at the limit (0.44 / 0.4 is 1.1000000000000003).
EPSILON = 1e-9


def _not_measured(which, figure):
    return "%s %s was not measured" % (which, figure)


def ratio_gate(name, figure, key, kind, what, unit, baseline, canary, limit):
    gate = {"name": name, "passed": False, "baseline": baseline.get(figure), "canary": canary.get(figure)}
    gate["limit"] = None
    missing = _missing(gate, figure)
    if missing:
        gate["message"] = "%s: %s (the gate needs both figures)" % (name, "; ".join(missing))
        return gate
    b, c = _number(gate["baseline"]), _number(gate["canary"])
    if b <= 0:
        gate["message"] = "%s: the baseline's %s is %s %s: no ratio to take (a failed baseline measurement)" % (
            name,
            what,
            fmt(b),
            unit,
        )
        return gate
    gate["limit"] = round(limit * b, 6)
    ratio = c / b
    gate["passed"] = ratio >= limit - EPSILON if kind == "min" else ratio <= limit + EPSILON
    gate["message"] = "canary %s %s %s is %s %% of the baseline's %s%s (needs %s %s %%)" % (
        what,
        fmt(c),
        unit,
        percent(ratio, limit),
        fmt(b),
        " s" if unit == "s" else "",
        ">=" if kind == "min" else "<=",
        limit_percent(limit),
    )
    return gate


def _missing(gate, figure):
    """The messages for the figures of a gate that are absent or not numbers ([] if none)."""
    return [
        _not_measured(who, figure) if value is None else "%s %s is %r, not a number" % (who, figure, value)
        for who, value in (("the canary's", gate["canary"]), ("the baseline's", gate["baseline"]))
        if _number(value) is None
    ]


def failures_gate(baseline, canary, limit):
    gate = {"name": "failures", "passed": False, "baseline": baseline.get("failures"), "canary": canary.get("failures")}
    gate["limit"] = limit
    missing = _missing(gate, "failures")
    if missing:
        gate["message"] = "failures: %s (the gate needs both figures)" % "; ".join(missing)
        return gate
    b, c = _number(gate["baseline"]), _number(gate["canary"])
    gate["passed"] = c <= limit and b <= limit
    if c <= limit < b:
        gate["message"] = (
            "the baseline had %s failed requests (needs <= %s): it is no reference for the canary's %s; "
            "measure again" % (fmt(b), fmt(limit), fmt(c))
        )
    else:
        gate["message"] = "canary had %s failed requests (baseline %s; needs <= %s)" % (fmt(c), fmt(b), fmt(limit))
    return gate


def outputs_gate(canary, must_pass):
    verdict = canary.get("outputs")
    gate = {"name": "outputs", "passed": False, "baseline": None, "canary": None, "limit": "passed"}
    if isinstance(verdict, dict) and isinstance(verdict.get("passed"), bool):
        gate["canary"] = verdict["passed"]
        text = verdict.get("verdict") or verdict.get("msg") or ("passed" if verdict["passed"] else "failed")
    elif isinstance(verdict, bool):
        gate["canary"] = verdict
        text = "passed" if verdict else "failed"
    else:
        gate["message"] = "outputs: the golden-output check was not measured (no verdict from golden_outputs)"
        if not must_pass:
            gate.update(passed=True, limit=None)
            gate["message"] += "; not required (outputs_must_pass false)"
        return gate
    if must_pass:
        gate["passed"] = gate["canary"]
        gate["message"] = "golden outputs: %s" % text
    else:
        gate.update(passed=True, limit=None)
        gate["message"] = "golden outputs (not required, outputs_must_pass false): %s" % text
    return gate


def gate(baseline, canary, thresholds=None):
    """The canary gate: {"passed", "gates": [{name, passed, baseline, canary, limit,
    message}, ...] in GATES order, "failed": [names], "message"}. `limit` is the canary's
    bound in the figure's unit (ratio x baseline; null when it cannot be computed).
    ValueError on a bad threshold (thresholds_of)."""
    limits = thresholds_of(thresholds)
    baseline, canary = baseline or {}, canary or {}
    gates = [ratio_gate(*spec, baseline, canary, limits[spec[2]]) for spec in RATIO_GATES]
    gates.append(failures_gate(baseline, canary, limits["failures_max"]))
    gates.append(outputs_gate(canary, limits["outputs_must_pass"]))
    failed = [g["name"] for g in gates if not g["passed"]]
    if failed:
        message = "FAIL (%s): %s" % (", ".join(failed), "; ".join(g["message"] for g in gates if not g["passed"]))
    else:
        message = "PASS: %d gates" % len(gates)
    return {"passed": not failed, "gates": gates, "failed": failed, "message": message}
