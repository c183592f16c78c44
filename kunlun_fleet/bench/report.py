"""report.html (one self-contained page: plots as PNG data URIs, no network) and report.md
from results.json. Needs matplotlib (the bench venv, requirements-bench.txt)."""

import base64
import html
import io
import os

from kunlun_fleet.bench.results import gate_line

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _f(v, spec="%.1f"):
    return "-" if v is None else spec % v


def _ms(d, key):
    return None if not d else d.get(key)


def _n(v):
    return "-" if v is None else str(v)


# ---------------------------------------------------------------- plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _series(results):
    """[(name, rows)] with the fleet first."""
    curves = results.get("curves") or {}
    names = (["fleet"] if "fleet" in curves else []) + sorted(k for k in curves if k != "fleet")
    return [(n, curves[n]) for n in names]


def plot_throughput(results):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for i, (name, rows) in enumerate(_series(results)):
        xs = [r["concurrency"] for r in rows]
        ys = [r["output_tok_s"] or 0 for r in rows]
        style = dict(color=COLORS[i % len(COLORS)], marker="o", linewidth=2.5 if name == "fleet" else 1.4)
        ax.plot(xs, ys, label=("fleet (gateway)" if name == "fleet" else name), **style)
        bad = [(x, y) for x, y, r in zip(xs, ys, rows, strict=True) if not r["valid"] or r["failed"]]
        if bad:
            ax.scatter(
                [b[0] for b in bad],
                [b[1] for b in bad],
                s=140,
                facecolors="none",
                edgecolors="red",
                linewidths=2,
                zorder=5,
            )
        srv = [(r["concurrency"], r["server_output_tok_s"]) for r in rows if r.get("server_output_tok_s") is not None]
        if name == "fleet" and srv:
            ax.plot(
                [s[0] for s in srv],
                [s[1] for s in srv],
                linestyle=":",
                color=style["color"],
                label="fleet, servers' counters",
            )
    t = results["targets"]
    ax.axhline(
        t["fleet_output_tok_s"],
        color="red",
        linestyle="--",
        linewidth=1,
        label="fleet target %.0f tok/s" % t["fleet_output_tok_s"],
    )
    ax.axvline(
        t.get("fleet_min_concurrency", 1000),
        color="grey",
        linestyle=":",
        linewidth=1,
        label=">= %d concurrent" % t.get("fleet_min_concurrency", 1000),
    )
    # Concurrency is 1 or more: a log axis from just below 1 (symlog's linear part around 0
    # drew an empty negative range).
    ax.set_xscale("log")
    ax.set_xlim(left=0.8)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Output throughput vs concurrency (red circles: invalid point or failed requests)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def plot_latency(results, key, title):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    styles = {"p50": "-", "p90": "--", "p99": ":"}
    for i, (name, rows) in enumerate(_series(results)):
        xs = [r["concurrency"] for r in rows]
        for q, ls in styles.items():
            ys = [(_ms(r[key], q) or 0) / 1000.0 for r in rows]
            ax.plot(
                xs,
                ys,
                linestyle=ls,
                marker="o" if q == "p50" else None,
                color=COLORS[i % len(COLORS)],
                linewidth=2.2 if name == "fleet" else 1.2,
                label="%s %s" % ("fleet" if name == "fleet" else name, q),
            )
    ax.set_xscale("log")
    ax.set_xlim(left=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("seconds")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    return _png(fig)


# ---------------------------------------------------------------- tables
def point_rows(results):
    rows = []
    for p in results["points"]:
        c = p.get("client") or {}
        lg = p.get("load_generator") or {}
        rows.append(
            [
                p["label"],
                p.get("target", ""),
                p.get("kind", ""),
                str(p.get("concurrency", "")),
                _f(c.get("output_tok_s"), "%.0f"),
                _f(c.get("requests_per_s"), "%.2f"),
                "%s/%s" % (c.get("completed", "-"), c.get("failed", "-")),
                _n(c.get("usage_output_tokens")),
                _n(p.get("server_output_tokens")),
                _f(p.get("diff_pct"), "%+.2f%%"),
                _f(p.get("prompt_diff_pct"), "%+.2f%%"),
                "valid" if p.get("valid") else "INVALID",
                _n(c.get("retokenized_output_tokens")),
                _f(p.get("retokenized_diff_pct"), "%+.1f%%"),
                _f(_ms(c.get("ttft_ms"), "p50"), "%.0f"),
                _f(_ms(c.get("ttft_ms"), "p90"), "%.0f"),
                _f(_ms(c.get("ttft_ms"), "p99"), "%.0f"),
                _f(_ms(c.get("tpot_ms"), "p50"), "%.1f"),
                _f(_ms(c.get("tpot_ms"), "p90"), "%.1f"),
                _f(_ms(c.get("tpot_ms"), "p99"), "%.1f"),
                _f(_ms(c.get("itl_ms"), "p99"), "%.1f"),
                ("%s cores%s" % (_f(lg.get("cores_used"), "%.2f"), " SATURATED" if lg.get("client_bound") else ""))
                if lg
                else "-",
            ]
        )
    return rows


# Which count is which: "usage" is the responses' own usage (the figures' count), "counters"
# the servers' vllm:generation_tokens_total over the point; the two decide "valid" (with the
# prompt tokens' pair, "prompt diff"). "re-tokenized" is the client's tokenizer on the text
# received, beside them, deciding nothing.
POINT_HEAD = [
    "point",
    "target",
    "kind",
    "conc.",
    "out tok/s",
    "req/s",
    "done/failed",
    "out tokens (usage)",
    "out tokens (counters)",
    "diff",
    "prompt diff",
    "usage vs counters",
    "re-tokenized (client)",
    "re-tok. vs usage",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "TTFT p99 ms",
    "TPOT p50 ms",
    "TPOT p90 ms",
    "TPOT p99 ms",
    "ITL p99 ms",
    "client CPU",
]


def host_rows(results):
    rows = []
    for h, d in sorted((results.get("hosts") or {}).items()):
        rows.append(
            [
                h,
                d.get("url") or "-",
                _f(d.get("single_stream_tok_s")),
                _f(d.get("peak_output_tok_s"), "%.0f"),
                str(d.get("peak_at_concurrency") or "-"),
                str(d.get("failed_requests", 0)),
                ", ".join(d.get("invalid_points") or []) or "-",
                str(d.get("fleet_share_tokens", 0)),
                ", ".join(d.get("fleet_counter_errors") or []) or "-",
                (d.get("image") or "-")[:72],
            ]
        )
    return rows


HOST_HEAD = [
    "host",
    "url",
    "single stream tok/s",
    "peak out tok/s",
    "at conc.",
    "failed requests",
    "invalid points",
    "tokens served in fleet points",
    "fleet points with unreadable counters",
    "image",
]


def error_rows(results):
    rows = []
    for p in results["points"]:
        for err, n in sorted(((p.get("client") or {}).get("errors") or {}).items(), key=lambda kv: -kv[1]):
            rows.append([p["label"], p.get("target", ""), str(n), err])
        for host, s in sorted((p.get("servers") or {}).items()):
            if "error" in s:
                rows.append([p["label"], host, "-", "counters unreadable: " + s["error"]])
        if p.get("aiperf_rc") not in (0, None):
            rows.append(
                [
                    p["label"],
                    p.get("target", ""),
                    "-",
                    "aiperf exit %s: %s" % (p["aiperf_rc"], " | ".join((p.get("aiperf_tail") or [])[-3:])),
                ]
            )
    return rows


def _html_table(head, rows, cls=""):
    out = [
        '<table class="%s"><thead><tr>%s</tr></thead><tbody>'
        % (cls, "".join("<th>%s</th>" % html.escape(h) for h in head))
    ]
    for r in rows:
        cells = []
        for v in r:
            v = str(v)
            klass = (
                ' class="bad"'
                if v in ("INVALID", "FAIL") or v.endswith("SATURATED")
                else (' class="good"' if v in ("valid", "PASS") else "")
            )
            cells.append("<td%s>%s</td>" % (klass, html.escape(v)))
        out.append("<tr>%s</tr>" % "".join(cells))
    out.append("</tbody></table>")
    return "\n".join(out)


def _md_table(head, rows):
    esc = [str(h).replace("|", "/") for h in head]
    lines = ["| " + " | ".join(esc) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(v).replace("|", "/") for v in r) + " |")
    return "\n".join(lines)


def _settings_rows(results):
    s, m = results["settings"], results["meta"]
    rows = [
        ["started (UTC)", m.get("started_utc", "")],
        ["inventory", m.get("inventory", "")],
        ["hosts benched / in the inventory", "%s / %s" % (m.get("host_count"), m.get("inventory_host_count"))],
        ["fleet endpoint", m.get("fleet_url") or "none"],
        ["model", m.get("model", "")],
        ["load generator", m.get("load_generator", "")],
        ["concurrency (fleet / per host)", "%s / %s" % (s.get("concurrency"), s.get("host_concurrency"))],
        [
            "per point",
            ("%s requests" % s["requests"]) if s.get("requests") else "%s s of requests" % s.get("duration_s"),
        ],
        ["prompt / output tokens", "%s / %s" % (s.get("isl"), s.get("osl"))],
        [
            "long context",
            "%s-token prompts, %s out, %s concurrent, %s requests"
            % (s.get("long_isl"), s.get("long_osl"), s.get("long_concurrency"), s.get("long_requests")),
        ],
        [
            "counter agreement",
            "responses' usage within %s%% of the servers' counters (output and prompt "
            "tokens); client re-tokenized count %s"
            % (
                s.get("tolerance_pct"),
                "shown, not gating" if s.get("retokenize", True) else "not counted (aiperf use_server_token_count)",
            ),
        ],
    ]
    for name, version in sorted((m.get("stack") or {}).items()):
        rows.append(["stack: " + name, str(version)])
    for host, image in sorted((m.get("images") or {}).items()):
        rows.append(["image served on " + host, str(image)])
    for k in ("max_model_len", "max_num_seqs", "tensor_parallel_size", "gpu_memory_utilization"):
        if k in (m.get("serving") or {}):
            rows.append(["serving: " + k, str(m["serving"][k])])
    return rows


def plan_rows(results):
    return [[a["text"]] for a in (results.get("plan") or {}).get("answers", [])]


def curve_rows(results, which="per_host_curve"):
    return [
        ["%g" % r["concurrency"], _f(r["output_tok_s"], "%.0f"), _f(r["ttft_p99_s"], "%.2f")]
        for r in (results.get("plan") or {}).get(which, [])
    ]


# ---------------------------------------------------------------- the files
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin-bottom:4px} .sub{color:#666;margin-top:0}
.verdict{display:inline-block;padding:6px 14px;border-radius:6px;color:#fff;font-weight:bold;font-size:20px}
.verdict.PASS{background:#2e7d32} .verdict.FAIL{background:#c62828}
table{border-collapse:collapse;margin:8px 0 18px 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 7px;text-align:left;vertical-align:top} th{background:#f0f0f0}
td.bad{background:#ffebee;color:#b71c1c;font-weight:bold} td.good{background:#e8f5e9;color:#1b5e20}
img.plot{display:block;max-width:100%;border:1px solid #ddd;margin:10px 0}
.note{background:#fff8e1;border-left:4px solid #ffb300;padding:8px 12px;margin:10px 0}
.wide{overflow-x:auto}
"""


def render_html(results, plots):
    gates = [
        [
            g["status"],
            g["target"],
            g["gate"],
            _f(g["figure"]) if isinstance(g["figure"], float) else str(g["figure"] if g["figure"] is not None else "-"),
            "%s %s" % (g["threshold"], g["unit"]),
            g["detail"],
        ]
        for g in results["gates"]
    ]
    m = results["meta"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>kunlun-fleet bench %s</title><style>%s</style>"
        "</head><body>" % (html.escape(m.get("started_utc", "")), CSS),
        "<h1>Fleet benchmark %s</h1>" % html.escape(m.get("started_utc", "")),
        "<p class='sub'>%s - %s host(s) - model %s - fleet endpoint %s</p>"
        % (
            html.escape(m.get("inventory", "")),
            m.get("host_count"),
            html.escape(m.get("model", "")),
            html.escape(m.get("fleet_url") or "none"),
        ),
        "<h2>Gates <span class='verdict %s'>%s</span></h2>" % (results["verdict"], results["verdict"]),
        _html_table(["result", "target", "gate", "figure", "threshold", "detail"], gates, "gates"),
    ]
    if results.get("client_bound_points"):
        parts.append(
            "<div class='note'>The load generator's machine was saturated (CPU) during: %s. Figures "
            "there may be limited by the client, not the fleet; run the bench from a machine with more "
            "cores to tell.</div>" % html.escape(", ".join(results["client_bound_points"]))
        )
    invalid = [p["label"] for p in results["points"] if p.get("measured") and not p.get("valid")]
    if invalid:
        parts.append(
            "<div class='note'>Invalid points (the responses' usage and the servers' counters disagree "
            "by more than %s%%, a response carried no usage, or a server's counters could not be read): "
            "%s.</div>" % (results["settings"].get("tolerance_pct"), html.escape(", ".join(invalid)))
        )
    parts += [
        "<h2>Output throughput</h2>",
        "<img class='plot' alt='output tok/s vs concurrency' src='data:image/png;base64,%s'>" % plots["throughput"],
        "<h2>Latency</h2>",
        "<img class='plot' alt='TTFT percentiles vs concurrency' src='data:image/png;base64,%s'>" % plots["ttft"],
        "<img class='plot' alt='TPOT percentiles vs concurrency' src='data:image/png;base64,%s'>" % plots["tpot"],
        "<h2>Hosts</h2>",
        "<div class='wide'>",
        _html_table(HOST_HEAD, host_rows(results)),
        "</div>",
        "<h2>Capacity plan</h2>",
        "<p>%s</p>" % html.escape(results["plan"]["assumption"]),
        _html_table(["question and answer"], plan_rows(results)),
        "<p>Per-host curve (hosts measured directly): %s.</p>"
        % html.escape(results["plan"].get("per_host_extent", "")),
        _html_table(["concurrency per host", "output tok/s", "TTFT p99 s"], curve_rows(results)),
        "<p>Fleet curve per host (points through the gateway over %s hosts): %s.</p>"
        % (results["plan"].get("fleet_hosts", "-"), html.escape(results["plan"].get("fleet_extent", ""))),
        _html_table(["concurrency per host", "output tok/s", "TTFT p99 s"], curve_rows(results, "fleet_curve")),
        "<h2>Every point</h2><div class='wide'>",
        _html_table(POINT_HEAD, point_rows(results)),
        "</div>",
    ]
    errs = error_rows(results)
    if errs:
        parts += ["<h2>Failures</h2>", _html_table(["point", "target / host", "count", "error"], errs)]
    parts += [
        "<h2>Definitions</h2>",
        "<p>%s</p>" % html.escape(results["definitions"]),
        "<h2>Settings and versions</h2>",
        _html_table(["item", "value"], _settings_rows(results)),
        "</body></html>",
    ]
    return "\n".join(parts)


def render_md(results):
    m = results["meta"]
    out = [
        "# Fleet benchmark %s: %s" % (m.get("started_utc", ""), results["verdict"]),
        "",
        "%s, %s host(s), model %s, fleet endpoint %s"
        % (m.get("inventory", ""), m.get("host_count"), m.get("model", ""), m.get("fleet_url") or "none"),
        "",
        "## Gates",
        "",
    ]
    out += ["- " + gate_line(g) for g in results["gates"]]
    if results.get("client_bound_points"):
        out += [
            "",
            "Load generator saturated (CPU) during: %s - figures there may be the client's limit, "
            "not the fleet's." % ", ".join(results["client_bound_points"]),
        ]
    out += [
        "",
        "## Points",
        "",
        _md_table(POINT_HEAD, point_rows(results)),
        "",
        "## Hosts",
        "",
        _md_table(HOST_HEAD, host_rows(results)),
        "",
        "## Capacity plan",
        "",
        results["plan"]["assumption"],
        "",
    ]
    out += ["- " + r[0] for r in plan_rows(results)]
    out += [
        "",
        "Per-host curve (hosts measured directly): %s." % results["plan"].get("per_host_extent", ""),
        "",
        _md_table(["concurrency per host", "output tok/s", "TTFT p99 s"], curve_rows(results)),
        "",
        "Fleet curve per host (points through the gateway over %s hosts): %s."
        % (results["plan"].get("fleet_hosts", "-"), results["plan"].get("fleet_extent", "")),
        "",
        _md_table(["concurrency per host", "output tok/s", "TTFT p99 s"], curve_rows(results, "fleet_curve")),
    ]
    errs = error_rows(results)
    if errs:
        out += ["", "## Failures", "", _md_table(["point", "target / host", "count", "error"], errs)]
    out += [
        "",
        "## Definitions",
        "",
        results["definitions"],
        "",
        "## Settings and versions",
        "",
        _md_table(["item", "value"], _settings_rows(results)),
        "",
    ]
    return "\n".join(out)


def write_reports(results, run_dir):
    plots = {
        "throughput": plot_throughput(results),
        "ttft": plot_latency(results, "ttft_ms", "Time to first token (p50 solid, p90 dashed, p99 dotted)"),
        "tpot": plot_latency(results, "tpot_ms", "Time per output token (p50 solid, p90 dashed, p99 dotted)"),
    }
    html_path = os.path.join(run_dir, "report.html")
    md_path = os.path.join(run_dir, "report.md")
    with open(html_path, "w") as fh:
        fh.write(render_html(results, plots))
    with open(md_path, "w") as fh:
        fh.write(render_md(results))
    return html_path, md_path
