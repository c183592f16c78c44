"""The report of one `kunlun-fleet upgrade` (docs/upgrades.md), in reports/upgrade-<timestamp>/:
results.json (what the run did and measured), report.md (for a terminal) and report.html (one
self-contained page: inline CSS and inline SVG, no script, nothing fetched), with the
canary-vs-baseline plot. Standard library only (the plot is SVG written here, no matplotlib);
the canary gate's formatting comes from module_utils/canary.py.

results.json, format 1 (the upgrade writes it; write() validates it, check() names a missing
or bad key). Required keys (a value may be null where it says so):

    format       1
    started      ISO-8601 UTC ("2026-12-04T18:02:11Z")
    finished     ISO-8601 UTC, or null (the run did not finish)
    inventory    the inventory's path
    from_stack   the stack the fleet served when the run started
    to_stack     the stack asked for (--to)
    to_status    "validated", "candidate" or "known-bad"; null when the name is not a stack
    check        true for a --check run (what would happen; nothing changed)
    outcome      "promoted"      the canary passed, every host serves to_stack
                 "rolled-back"   the canary failed its gate and serves from_stack again
                 "refused"       refused before any change (a known-bad stack, a failed preflight)
                 "unchanged"     the fleet already serves to_stack: nothing to do
                 "failed"        an error stopped the run (the steps and hosts say where)
                 "would-upgrade" a --check run: what a run would do
    reason       one line: why refused, which gate failed with both figures, the error
    hosts        [{host, stack_before, stack_after, changed (bool), note}], one per host;
                 optional in each: driver_before, driver_after (the XRE driver the host ran
                 before and after, when the plan read it; changed counts it too)
    steps        [{name, started, finished, result, message}]; result "ok", "failed",
                 "skipped" or "would-run"; started/finished ISO-8601 UTC or null

Optional keys (absent is null):

    canary, baseline   the canary host and the baseline host
    thresholds   {name: value}: the gate's thresholds (module_utils/canary.py THRESHOLDS keys)
    gate         what module_utils/canary.gate() returns: {passed, gates: [{name, passed,
                 baseline, canary, limit, message}], failed, message}
    figures      {"baseline": {...}, "canary": {...}}, each {single_stream_tok_s, output_tok_s,
                 ttft_p99_s, tpot_p99_s, failures, concurrency} (null: not measured)
    series       {"baseline": [[s, output_tok_s], ...], "canary": [...]}: each host's output
                 rate, second by second from the start of the concurrency point
    outputs      the golden-output verdict: library/golden_outputs.py's result in mode compare
                 (passed, verdict, failing, divergences; prompts, max_tokens, tolerance read
                 when present)

write(results, out_dir) writes the three files; render_md() and render_html() are the pure
renderings; resume_line() is the run report's one line.
"""

import datetime
import html
import json
import math
import os
from pathlib import Path

from kunlun_fleet.bench.report import COLORS, _html_table, _md_table
from kunlun_fleet.bench.report import CSS as BENCH_CSS

ROOT = Path(__file__).resolve().parents[2]
FORMAT = 1
OUTCOMES = {
    "promoted": "the canary passed its gate; the stack was promoted",
    "rolled-back": "the canary failed its gate and was returned to the current stack",
    "refused": "refused before any change",
    "unchanged": "the fleet already serves this stack: nothing to do",
    "failed": "the run stopped on an error",
    "would-upgrade": "a --check run: what an upgrade would do; nothing changed",
}
STATUSES = ("validated", "candidate", "known-bad")
STEP_RESULTS = ("ok", "failed", "skipped", "would-run")
REQUIRED = (
    "format",
    "started",
    "finished",
    "inventory",
    "from_stack",
    "to_stack",
    "to_status",
    "check",
    "outcome",
    "reason",
    "hosts",
    "steps",
)
OPTIONAL = ("canary", "baseline", "thresholds", "gate", "figures", "series", "outputs")
HOST_KEYS = ("host", "stack_before", "stack_after", "changed", "note")
STEP_KEYS = ("name", "started", "finished", "result", "message")
# The plot's bars, in order: (figure, label, unit, the gate's name).
FIGURES = (
    ("single_stream_tok_s", "single stream", "tok/s", "single_stream"),
    ("output_tok_s", "output tok/s", "tok/s", "throughput"),
    ("ttft_p99_s", "TTFT p99", "s", "ttft_p99"),
    ("tpot_p99_s", "TPOT p99", "s", "tpot_p99"),
)
BASELINE_COLOR, CANARY_COLOR, LIMIT_COLOR = COLORS[0], COLORS[1], COLORS[3]


class SchemaError(ValueError):
    """results.json is not of format 1: the message names the key."""


def canary_module():
    """module_utils/canary.py as Ansible imports it (ansible.module_utils.canary)."""
    import ansible.module_utils

    path = str(ROOT / "module_utils")
    if path not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(path)
    from ansible.module_utils import canary

    return canary


# ---------------------------------------------------------------- the schema
def check(results):
    """results with the optional keys filled in (null); SchemaError naming the first missing
    or bad key."""
    if not isinstance(results, dict):
        raise SchemaError("upgrade results: a JSON object is needed, not %s" % type(results).__name__)
    missing = [k for k in REQUIRED if k not in results]
    if missing:
        raise SchemaError(
            "upgrade results: missing required key%s %s (format %d needs %s)"
            % ("s" if len(missing) > 1 else "", ", ".join(repr(k) for k in missing), FORMAT, ", ".join(REQUIRED))
        )
    if results["format"] != FORMAT:
        raise SchemaError("upgrade results: format is %r; this report reads format %d" % (results["format"], FORMAT))
    if results["outcome"] not in OUTCOMES:
        raise SchemaError(
            "upgrade results: outcome is %r; one of %s" % (results["outcome"], ", ".join(sorted(OUTCOMES)))
        )
    if results["to_status"] not in STATUSES + (None,):
        raise SchemaError(
            "upgrade results: to_status is %r; one of %s, or null" % (results["to_status"], ", ".join(STATUSES))
        )
    if not isinstance(results["check"], bool):
        raise SchemaError("upgrade results: check is %r; true or false" % (results["check"],))
    for key, keys in (("hosts", HOST_KEYS), ("steps", STEP_KEYS)):
        if not isinstance(results[key], list):
            raise SchemaError("upgrade results: %s is %r; a list" % (key, type(results[key]).__name__))
        for i, item in enumerate(results[key]):
            gone = [k for k in keys if not isinstance(item, dict) or k not in item]
            if gone:
                raise SchemaError(
                    "upgrade results: %s[%d] lacks %s (each needs %s)" % (key, i, ", ".join(gone), ", ".join(keys))
                )
    for i, step in enumerate(results["steps"]):
        if step["result"] not in STEP_RESULTS:
            raise SchemaError(
                "upgrade results: steps[%d] (%s) result is %r; one of %s"
                % (i, step["name"], step["result"], ", ".join(STEP_RESULTS))
            )
    gate = results.get("gate")
    if gate is not None and not (isinstance(gate, dict) and isinstance(gate.get("gates"), list)):
        raise SchemaError("upgrade results: gate is not what module_utils/canary.gate() returns (no gates list)")
    for key in ("figures", "series"):
        value = results.get(key)
        if value is not None and not (isinstance(value, dict) and {"baseline", "canary"} <= set(value)):
            raise SchemaError("upgrade results: %s needs both 'baseline' and 'canary' (or null)" % key)
    out = dict(results)
    for key in OPTIONAL:
        out.setdefault(key, None)
    return out


# ---------------------------------------------------------------- words and figures
def _s(value):
    return "-" if value is None or value == "" else str(value)


def _figure(value, unit):
    """4850 tok/s, 0.412 s; '-' when not measured."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return "%s %s" % (canary_module().fmt(value), unit) if unit else canary_module().fmt(value)


def headline(results):
    return "Upgrade %s -> %s%s: %s" % (
        results["from_stack"],
        results["to_stack"],
        " (check)" if results["check"] else "",
        results["outcome"].upper(),
    )


def changed_hosts(results):
    return [h["host"] for h in results["hosts"] if h.get("changed")]


def facts(results):
    """[[item, value]]: the run at a glance."""
    changed = changed_hosts(results)
    rows = [
        ["from stack", _s(results["from_stack"])],
        ["to stack", "%s (%s)" % (results["to_stack"], results["to_status"] or "not a known stack")],
        ["canary host", _s(results.get("canary"))],
        ["baseline host", _s(results.get("baseline"))],
        [
            "hosts changed",
            ("%d of %d: %s" % (len(changed), len(results["hosts"]), ", ".join(changed)))
            if changed
            else "none of %d" % len(results["hosts"]),
        ],
        ["inventory", _s(results["inventory"])],
        ["started (UTC)", _s(results["started"])],
        ["finished (UTC)", _s(results["finished"]) if results["finished"] else "did not finish"],
    ]
    if results["check"]:
        rows.insert(0, ["check run", "yes: nothing was changed"])
    figs = results.get("figures") or {}
    at = [(figs.get(who) or {}).get("concurrency") for who in ("baseline", "canary")]
    if at[0] is not None and at[0] == at[1]:
        rows.append(["measured", "side by side, at concurrency %s" % at[0]])
    elif any(c is not None for c in at):
        rows.append(["measured", "baseline at concurrency %s, canary at %s" % (_s(at[0]), _s(at[1]))])
    return rows


GATE_HEAD = ["gate", "baseline", "canary", "canary / baseline", "limit for the canary", "result"]


def gate_rows(results):
    """One row per gate of results["gate"], both figures, the ratio and the limit."""
    canary = canary_module()
    thresholds = canary.thresholds_of(results.get("thresholds") or {})
    specs = {spec[0]: spec for spec in canary.RATIO_GATES}
    rows = []
    for g in (results.get("gate") or {}).get("gates", []):
        name, verdict = g["name"], "PASS" if g.get("passed") else "FAIL"
        if name in specs:
            _, _, key, kind, _, unit = specs[name]
            b, c, limit = g.get("baseline"), g.get("canary"), thresholds[key]
            ratio = "-"
            if _number(b) and _number(c) is not None and b > 0:
                ratio = "%s %%" % canary.percent(c / b, limit)
            bound = "%s %s %% of the baseline" % (">=" if kind == "min" else "<=", canary.limit_percent(limit))
            if g.get("limit") is not None:
                bound = "%s %s (%s)" % (">=" if kind == "min" else "<=", _figure(g["limit"], unit), bound[3:])
            rows.append([name, _figure(b, unit), _figure(c, unit), ratio, bound, verdict])
        elif name == "failures":
            rows.append(
                [
                    name,
                    _figure(g.get("baseline"), ""),
                    _figure(g.get("canary"), ""),
                    "-",
                    "<= %s" % _figure(g.get("limit"), ""),
                    verdict,
                ]
            )
        elif name == "outputs":
            seen = g.get("canary")
            rows.append(
                [
                    "golden outputs",
                    "recorded",
                    "not measured" if seen is None else ("equal" if seen else "differ"),
                    "-",
                    "must pass" if g.get("limit") else "not required",
                    verdict,
                ]
            )
        else:
            rows.append([name, _s(g.get("baseline")), _s(g.get("canary")), "-", _s(g.get("limit")), verdict])
    return rows


def _number(value):
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)


FIGURE_HEAD = ["figure", "baseline", "canary", "canary / baseline"]


def figure_rows(results):
    """The measured figures without a gate (a run that stopped before judging)."""
    figs = results.get("figures") or {}
    b, c = figs.get("baseline") or {}, figs.get("canary") or {}
    rows = []
    for key, label, unit, _ in FIGURES + (("failures", "failed requests", "", None),):
        bv, cv = _number(b.get(key)), _number(c.get(key))
        ratio = "%.0f %%" % (100.0 * cv / bv) if bv and cv is not None else "-"
        rows.append([label, _figure(b.get(key), unit), _figure(c.get(key), unit), ratio])
    return rows


def outputs_lines(results):
    """The golden-output verdict, then one line per failing prompt (with both continuations)."""
    out = results.get("outputs")
    if not isinstance(out, dict):
        return []
    lines = ["%s: %s" % ("PASS" if out.get("passed") else "FAIL", out.get("verdict") or out.get("msg") or "-")]
    tolerance = (out.get("tolerance") or {}).get("min_agreeing_tokens")
    if tolerance:
        lines.append("tolerance: the first %d tokens of every prompt must agree" % tolerance)
    prompts, divergences = out.get("prompts") or [], out.get("divergences") or []
    for index in out.get("failing") or []:
        d = next((d for d in divergences if d.get("index") == index), None)
        prompt = " (%r)" % prompts[index] if index < len(prompts) else ""
        if d is None or d.get("diverges_at") is None:
            lines.append("prompt %d%s: no output from the canary" % (index, prompt))
            continue
        lines.append(
            "prompt %d%s diverges at token %d%s: after %r, baseline %r, canary %r"
            % (
                index,
                prompt,
                d["diverges_at"],
                " of %d" % out["max_tokens"] if out.get("max_tokens") else "",
                d.get("context") or "",
                d.get("baseline_excerpt") or "",
                d.get("canary_excerpt") or "",
            )
        )
    return lines


PROMPT_HEAD = ["prompt", "text", "first divergence", "baseline / canary tokens", "result"]


def prompt_rows(results):
    out = results.get("outputs") or {}
    prompts = out.get("prompts") or []
    rows = []
    for d in out.get("divergences") or []:
        i = d.get("index", len(rows))
        rows.append(
            [
                str(i),
                prompts[i] if i < len(prompts) else "-",
                "none" if d.get("diverges_at") is None else "token %d" % d["diverges_at"],
                "%s / %s" % (_s(d.get("baseline_tokens")), _s(d.get("canary_tokens"))),
                "PASS" if d.get("passed") else "FAIL",
            ]
        )
    return rows


HOST_HEAD = ["host", "role", "stack before", "stack after", "changed", "note"]
DRIVER_HEAD = ["XRE before", "XRE after"]


def with_drivers(results):
    """The hosts carry their XRE driver (a plan that read it)."""
    return any("driver_before" in h for h in results["hosts"])


def host_head(results):
    return HOST_HEAD[:4] + (DRIVER_HEAD if with_drivers(results) else []) + HOST_HEAD[4:]


def host_rows(results):
    roles = {results.get("canary"): "canary", results.get("baseline"): "baseline"}
    drivers = with_drivers(results)
    return [
        [h["host"], roles.get(h["host"], "-"), _s(h["stack_before"]), _s(h["stack_after"])]
        + ([_s(h.get("driver_before")), _s(h.get("driver_after"))] if drivers else [])
        + ["yes" if h["changed"] else "no", _s(h["note"])]
        for h in results["hosts"]
    ]


STEP_HEAD = ["step", "result", "started (UTC)", "took", "message"]


def _when(text):
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def step_rows(results):
    rows = []
    for s in results["steps"]:
        start, end = _when(s["started"]), _when(s["finished"])
        took = "%.0f s" % (end - start).total_seconds() if start and end else "-"
        result = {"ok": "ok", "failed": "FAIL", "skipped": "skipped", "would-run": "would run"}[s["result"]]
        rows.append([s["name"], result, _s(s["started"]), took, _s(s["message"])])
    return rows


def threshold_rows(results):
    values = canary_module().thresholds_of(results.get("thresholds"))
    return [[k, _figure(v, "") if _number(v) is not None else json.dumps(v)] for k, v in sorted(values.items())]


# ---------------------------------------------------------------- report.md
def render_md(results):
    """report.md: the outcome and its reason first, then the gate, outputs, hosts and steps."""
    results = check(results)
    out = ["# " + headline(results), "", "**%s**: %s" % (results["outcome"], _s(results["reason"])), ""]
    out += ["(%s)" % OUTCOMES[results["outcome"]], ""]
    out += ["- %s: %s" % (k, v) for k, v in facts(results)]
    gate = results.get("gate")
    if gate:
        out += ["", "## Canary gate: %s" % ("PASS" if gate.get("passed") else "FAIL"), ""]
        out += [_md_table(GATE_HEAD, gate_rows(results)), ""]
        out += ["- " + g["message"] for g in gate["gates"] if not g.get("passed")] or ["All gates passed."]
    elif results.get("figures"):
        out += ["", "## Figures (not judged)", "", _md_table(FIGURE_HEAD, figure_rows(results))]
    else:
        out += ["", "## Canary gate", "", "Not measured: %s." % no_figures_why(results)]
    lines = outputs_lines(results)
    if lines:
        out += ["", "## Golden outputs", ""] + ["- " + line for line in lines]
    out += ["", "## Hosts", "", _md_table(host_head(results), host_rows(results))]
    out += ["", "## Steps", "", _md_table(STEP_HEAD, step_rows(results))]
    if results.get("thresholds") is not None or gate:
        out += ["", "## Thresholds", "", _md_table(["threshold", "value"], threshold_rows(results))]
    out.append("")
    return "\n".join(out)


def no_figures_why(results):
    return {
        "refused": "the run was refused before any host changed",
        "unchanged": "the fleet already serves %s" % results["to_stack"],
        "would-upgrade": "a --check run measures nothing; the steps say what a run would do",
        "failed": "the run stopped before the canary was measured",
    }.get(results["outcome"], "no figures were recorded")


# ---------------------------------------------------------------- the plot (inline SVG)
def _e(text):
    return html.escape(str(text), quote=True)


def _text(x, y, text, anchor="middle", size=12, color="#333", weight="normal"):
    return '<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d" fill="%s" font-weight="%s">%s</text>' % (
        x,
        y,
        anchor,
        size,
        color,
        weight,
        _e(text),
    )


def _legend(x, y, items):
    parts = []
    for i, (color, label) in enumerate(items):
        parts.append('<rect x="%.1f" y="%.1f" width="14" height="14" fill="%s"/>' % (x + i * 190, y - 11, color))
        parts.append(_text(x + i * 190 + 20, y, label, anchor="start"))
    return "".join(parts)


def _ticks(top, count=5):
    """Round tick values (1, 2, 2.5 or 5 times a power of ten apart) from 0 to at least `top`."""
    raw = max(top, 1e-9) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude * (1 + 1e-9))
    return [i * step for i in range(int(math.ceil(top / step - 1e-9)) + 1)]


def plot_bars(results, width=760, height=350):
    """Grouped bars per figure, the canary's normalised to the baseline's (100 %), the gate's
    limit as a dashed line over each group, the figures written above the bars. None when
    nothing was measured."""
    figs = results.get("figures")
    if not figs:
        return None
    canary = canary_module()
    thresholds = canary.thresholds_of(results.get("thresholds") or {})
    specs = {spec[0]: spec for spec in canary.RATIO_GATES}
    b, c = figs.get("baseline") or {}, figs.get("canary") or {}
    groups = []
    for key, label, unit, gate in FIGURES:
        bv, cv = _number(b.get(key)), _number(c.get(key))
        ratio = cv / bv if bv and cv is not None and bv > 0 else None
        limit_kind = specs[gate][3]
        groups.append((label, unit, bv, cv, ratio, thresholds[specs[gate][2]], limit_kind))
    top = max([1.25] + [g[4] * 1.12 for g in groups if g[4] is not None])
    top = min(top, 4.0)
    left, right, upper, lower = 56, 12, 40, 74
    plot_w, plot_h = width - left - right, height - upper - lower

    def y(r):
        return upper + plot_h * (1 - min(r, top) / top)

    parts = [
        '<svg class="plot" id="plot-figures" width="%d" height="%d" viewBox="0 0 %d %d" role="img" '
        'aria-label="canary figures normalised to the baseline">' % (width, height, width, height),
        '<rect x="0" y="0" width="%d" height="%d" fill="#fff"/>' % (width, height),
        _legend(left, 18, [(BASELINE_COLOR, "baseline (= 100 %)"), (CANARY_COLOR, "canary, % of the baseline")]),
        '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-dasharray="6 4"/>'
        % (left + 390, 11, left + 420, 11, LIMIT_COLOR),
        _text(left + 426, 16, "gate limit", anchor="start"),
    ]
    for t in _ticks(top * 100):
        parts.append(
            '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e3e3e3"/>'
            % (left, y(t / 100), left + plot_w, y(t / 100))
        )
        parts.append(_text(left - 6, y(t / 100) + 4, "%g %%" % t, anchor="end", size=11, color="#666"))
    parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888"/>' % (left, y(1), left + plot_w, y(1)))
    group_w = plot_w / len(groups)
    bar_w = group_w * 0.3
    for i, (label, unit, bv, cv, ratio, limit, kind) in enumerate(groups):
        x0 = left + i * group_w + group_w * 0.18
        centre = left + (i + 0.5) * group_w
        values = "%s / %s %s" % (_figure(bv, ""), _figure(cv, ""), unit)
        for line, (text, size, color, weight) in enumerate(
            (
                (label, 12, "#222", "bold"),
                (values, 11, "#333", "normal"),
                ("higher is better" if kind == "min" else "lower is better", 11, "#666", "normal"),
            )
        ):
            parts.append(_text(centre, height - lower + 18 + 16 * line, text, size=size, color=color, weight=weight))
        if bv is None or bv <= 0:
            parts.append(_text(centre, y(0.5), "baseline not measured", size=11, color=LIMIT_COLOR))
            continue
        parts.append(
            '<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>baseline %s</title></rect>'
            % (x0, y(1), bar_w, y(0) - y(1), BASELINE_COLOR, _e(_figure(bv, unit)))
        )
        if ratio is None:
            parts.append(_text(x0 + bar_w * 1.6, y(0.5), "canary not measured", size=11, color=LIMIT_COLOR))
        else:
            cx = x0 + bar_w * 1.1
            parts.append(
                '<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>canary %s (%.0f %%)'
                "</title></rect>"
                % (cx, y(ratio), bar_w, y(0) - y(ratio), CANARY_COLOR, _e(_figure(cv, unit)), ratio * 100)
            )
            label_at = y(max(ratio, limit, 1.0)) - 6
            parts.append(_text(cx + bar_w / 2, label_at, "%.0f %%" % (ratio * 100), size=12, weight="bold"))
        parts.append(
            '<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" '
            'stroke-dasharray="6 4"/>' % (x0 - 6, y(limit), x0 + bar_w * 2.1 + 6, y(limit), LIMIT_COLOR)
        )
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="#888"/>' % (left, upper, left, y(0)))
    parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888"/>' % (left, y(0), left + plot_w, y(0)))
    parts.append("</svg>")
    return "".join(parts)


def plot_series(results, width=760, height=280):
    """Each host's output tok/s second by second through the concurrency point, as two lines.
    None when there are no series."""
    series = results.get("series") or {}
    lines = [
        (who, color, [p for p in (series.get(who) or []) if len(p) == 2 and _number(p[1]) is not None])
        for who, color in (("baseline", BASELINE_COLOR), ("canary", CANARY_COLOR))
    ]
    if not any(points for _, _, points in lines):
        return None
    xmax = max([1.0] + [float(p[0]) for _, _, points in lines for p in points])
    ymax = max([1.0] + [float(p[1]) for _, _, points in lines for p in points]) * 1.1
    xt, yt = _ticks(xmax), _ticks(ymax)
    xmax, ymax = max(xmax, xt[-1]), max(ymax, yt[-1])
    left, right, upper, lower = 64, 16, 34, 44
    plot_w, plot_h = width - left - right, height - upper - lower

    def px(x):
        return left + plot_w * x / xmax

    def py(v):
        return upper + plot_h * (1 - v / ymax)

    parts = [
        '<svg class="plot" id="plot-series" width="%d" height="%d" viewBox="0 0 %d %d" role="img" '
        'aria-label="output tok/s per second, baseline and canary">' % (width, height, width, height),
        '<rect x="0" y="0" width="%d" height="%d" fill="#fff"/>' % (width, height),
        _legend(left, 18, [(BASELINE_COLOR, "baseline output tok/s"), (CANARY_COLOR, "canary output tok/s")]),
    ]
    for t in yt:
        parts.append(
            '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e3e3e3"/>' % (left, py(t), left + plot_w, py(t))
        )
        parts.append(_text(left - 6, py(t) + 4, "%g" % t, anchor="end", size=11, color="#666"))
    for t in xt:
        parts.append(_text(px(t), upper + plot_h + 16, "%g" % t, size=11, color="#666"))
    parts.append(
        _text(left + plot_w / 2, height - 6, "seconds since the concurrency point started", size=11, color="#666")
    )
    for who, color, points in lines:
        if points:
            coords = " ".join("%.1f,%.1f" % (px(float(x)), py(float(v))) for x, v in points)
            parts.append(
                '<polyline points="%s" fill="none" stroke="%s" stroke-width="2.5" '
                'stroke-linejoin="round"><title>%s</title></polyline>' % (coords, color, who)
            )
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="#888"/>' % (left, upper, left, py(0)))
    parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888"/>' % (left, py(0), left + plot_w, py(0)))
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- report.html
CSS = (
    BENCH_CSS
    + """
.verdict.promoted{background:#2e7d32} .verdict.rolled-back,.verdict.failed{background:#c62828}
.verdict.refused{background:#e65100} .verdict.unchanged{background:#616161}
.verdict.would-upgrade{background:#1565c0}
.reason{font-size:16px;margin:10px 0 16px 0}
svg.plot{display:block;border:1px solid #ddd;margin:10px 0;background:#fff}
ul.msgs li{margin:3px 0}
"""
)


def render_html(results):
    """report.html: the same content as report.md and the plot, in one file that fetches
    nothing (inline CSS and SVG, no script)."""
    results = check(results)
    outcome = results["outcome"]
    title = headline(results)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>kunlun-fleet %s</title><style>%s</style>"
        "</head><body>" % (_e(title), CSS),
        "<h1>Upgrade %s &rarr; %s%s <span class='verdict %s'>%s</span></h1>"
        % (
            _e(results["from_stack"]),
            _e(results["to_stack"]),
            " (check)" if results["check"] else "",
            _e(outcome),
            _e(outcome.upper()),
        ),
        "<p class='sub'>%s - started %s</p>" % (_e(results["inventory"]), _e(results["started"])),
        "<p class='reason'><b>%s</b>: %s</p>" % (_e(outcome), _e(_s(results["reason"]))),
        "<p class='sub'>%s</p>" % _e(OUTCOMES[outcome]),
        _html_table(["item", "value"], facts(results), "facts"),
    ]
    bars, lines = plot_bars(results), plot_series(results)
    parts.append("<h2>Canary against baseline</h2>")
    if bars:
        parts.append(
            "<p>The canary's figures as a share of the baseline's, measured side by side under the same "
            "load (under each figure: baseline / canary); the dashed line is each gate's limit.</p>"
        )
        parts.append(bars)
    if lines:
        parts.append("<p>Output tok/s of each host, second by second, during the concurrency point.</p>")
        parts.append(lines)
    if not bars and not lines:
        parts.append("<p class='note'>No figures: %s.</p>" % _e(no_figures_why(results)))
    gate = results.get("gate")
    if gate:
        parts.append(
            "<h2>Canary gate <span class='verdict %s'>%s</span></h2>"
            % ("PASS" if gate.get("passed") else "FAIL", "PASS" if gate.get("passed") else "FAIL")
        )
        parts.append(_html_table(GATE_HEAD, gate_rows(results), "gates"))
        failed = [g["message"] for g in gate["gates"] if not g.get("passed")]
        if failed:
            parts.append("<ul class='msgs'>%s</ul>" % "".join("<li>%s</li>" % _e(m) for m in failed))
    elif results.get("figures"):
        parts += ["<h2>Figures (not judged)</h2>", _html_table(FIGURE_HEAD, figure_rows(results))]
    out_lines = outputs_lines(results)
    if out_lines:
        parts.append("<h2>Golden outputs</h2>")
        parts.append("<ul class='msgs'>%s</ul>" % "".join("<li>%s</li>" % _e(m) for m in out_lines))
        rows = prompt_rows(results)
        if rows:
            parts.append(_html_table(PROMPT_HEAD, rows, "prompts"))
    parts += ["<h2>Hosts</h2>", _html_table(host_head(results), host_rows(results), "hosts")]
    parts += ["<h2>Steps</h2>", _html_table(STEP_HEAD, step_rows(results), "steps")]
    if results.get("thresholds") is not None or gate:
        parts += ["<h2>Thresholds</h2>", _html_table(["threshold", "value"], threshold_rows(results))]
    parts.append("</body></html>")
    return "\n".join(parts)


# ---------------------------------------------------------------- the files
def out_dir_for(reports_dir, started):
    """reports_dir/upgrade-<YYYYmmddTHHMMSSZ> for a run started at `started` (ISO-8601 UTC),
    as the bench names its runs."""
    when = _when(started)
    if when is None:
        raise SchemaError("upgrade results: started is %r, not an ISO-8601 time" % (started,))
    when = when.astimezone(datetime.timezone.utc) if when.tzinfo else when
    return os.path.join(str(reports_dir), "upgrade-" + when.strftime("%Y%m%dT%H%M%SZ"))


def write(results, out_dir):
    """results.json (sorted keys, indent 2), report.md and report.html in out_dir (made if
    needed); {"results", "md", "html"}: their paths. SchemaError before anything is
    written when results is not format 1."""
    results = check(results)
    os.makedirs(str(out_dir), exist_ok=True)
    paths = {
        name: os.path.join(str(out_dir), file)
        for name, file in (("results", "results.json"), ("md", "report.md"), ("html", "report.html"))
    }
    texts = {
        "results": json.dumps(results, sort_keys=True, indent=2) + "\n",
        "md": render_md(results),
        "html": render_html(results),
    }
    for name, text in texts.items():
        tmp = paths[name] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, paths[name])
    return paths


def load(path):
    with open(str(path), encoding="utf-8") as fh:
        return check(json.load(fh))


def resume_line(results, out_dir):
    """One line for the run report: 'upgrade A -> B: rolled-back (throughput: ...); report:
    DIR/report.html'."""
    results = check(results)
    reason = " ".join(str(results["reason"] or "").split())
    return "upgrade %s -> %s%s: %s%s; report: %s" % (
        results["from_stack"],
        results["to_stack"],
        " (check)" if results["check"] else "",
        results["outcome"],
        " (%s)" % reason if reason else "",
        os.path.join(str(out_dir), "report.html"),
    )
