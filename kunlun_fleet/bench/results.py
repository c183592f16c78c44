"""results.json: the bench's measured points (raw.json, written by roles/bench) with the
gates judged, the curves per target and the capacity plan. Standard library only.

A point counts for a gate only when it was measured, the responses' usage agrees with the
servers' counters (valid) and no more of its requests failed than settings.max_failed_pct.
"""

import json
import os

from kunlun_fleet.bench import plan as planmod

SCHEMA = 1
DEFINITIONS = (
    "Metrics as vllm bench serve defines them: TTFT is the time from sending a request to its first "
    "token; TPOT is (latency - TTFT) / (output tokens - 1) per request; ITL is every gap between two "
    "streamed chunks; output tok/s is the output tokens of the completed requests over the benchmark "
    "duration (first request sent to last response ended). Percentiles interpolate linearly. The "
    "single-stream decode rate is 1000 / mean TPOT (ms). Output tokens are each response's usage "
    "(completion_tokens of its usage chunk, as vllm bench serve counts them). A point is valid when the "
    "responses' usage, summed, agrees with the servers' own counters over the point "
    "(vllm:generation_tokens_total for output, vllm:prompt_tokens_total for prompt tokens). The client's "
    "re-tokenized count (aiperf's tokenizer on the text received) is shown beside and decides nothing: text "
    "decoded from the token ids a model sampled does not re-tokenize to the same count."
)


def _failed_pct(point):
    c = point.get("client") or {}
    return (
        100.0 * c.get("failed", 0) / c["requests"] if c.get("requests") else (100.0 if point.get("measured") else 0.0)
    )


def counts(point, max_failed_pct):
    """(counts for a gate, why not)."""
    if not point.get("measured"):
        return False, point.get("msg") or "not measured"
    c = point.get("client") or {}
    if not c.get("requests"):
        return False, "no request was made (aiperf exit %s)" % point.get("aiperf_rc")
    if not c.get("completed"):
        return False, "no request completed (%s)" % _errors(c)
    if _failed_pct(point) > max_failed_pct:
        return False, "%d of %d requests failed (%s)" % (c["failed"], c["requests"], _errors(c))
    if not point.get("valid"):
        return False, "invalid: " + (point.get("validity") or "counters disagree")
    return True, ""


def _errors(client):
    errs = client.get("errors") or {}
    return (
        "; ".join("%dx %s" % (n, e) for e, n in sorted(errs.items(), key=lambda kv: -kv[1])[:3]) or "no error recorded"
    )


def _fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def curve_row(point):
    c = point.get("client") or {}
    return {
        "label": point["label"],
        "kind": point.get("kind"),
        "concurrency": int(point.get("concurrency") or 0),
        "output_tok_s": c.get("output_tok_s"),
        "requests_per_s": c.get("requests_per_s"),
        "server_output_tokens": point.get("server_output_tokens"),
        "usage_output_tokens": c.get("usage_output_tokens"),
        "retokenized_output_tokens": c.get("retokenized_output_tokens"),
        "server_output_tok_s": (point["server_output_tokens"] / c["duration_s"])
        if point.get("server_output_tokens") is not None and c.get("duration_s")
        else None,
        "completed": c.get("completed", 0),
        "failed": c.get("failed", 0),
        "ttft_ms": c.get("ttft_ms") or {},
        "tpot_ms": c.get("tpot_ms") or {},
        "itl_ms": c.get("itl_ms") or {},
        "decode_tok_s": c.get("decode_tok_s"),
        "valid": bool(point.get("valid")),
        "client_bound": bool((point.get("load_generator") or {}).get("client_bound")),
    }


def gates(raw):
    """The gates, in report order: a dict each (gate, target, status, figure, threshold, detail)."""
    t = raw["targets"]
    s = raw["settings"]
    maxf = float(s.get("max_failed_pct", 0.0))
    points = raw["points"]
    targets = _targets(raw)
    out = []
    for target in targets:
        pts = [p for p in points if p.get("target") == target]
        single = next((p for p in pts if p.get("kind") == "single"), None)
        if single is None:
            out.append(_gate("single stream", target, False, None, t["single_stream_tok_s"], "not measured"))
        else:
            ok, why = counts(single, maxf)
            c = single.get("client") or {}
            rate = c.get("decode_tok_s")
            passed = ok and rate is not None and rate >= t["single_stream_tok_s"]
            detail = why or (
                "decode %s tok/s, TTFT %s ms, TPOT %s ms"
                % (
                    _fmt(rate),
                    _fmt((c.get("ttft_ms") or {}).get("p50"), "%.0f"),
                    _fmt((c.get("tpot_ms") or {}).get("mean")),
                )
            )
            out.append(_gate("single stream", target, passed, rate, t["single_stream_tok_s"], detail, "tok/s"))
        if target == "fleet":
            out.append(_fleet_gate(pts, t, maxf))
        long = next((p for p in pts if p.get("kind") == "long"), None)
        if long is not None:
            ok, why = counts(long, maxf)
            c = long.get("client") or {}
            passed = ok and c.get("failed", 1) == 0 and c.get("completed") == c.get("requests")
            detail = why or (
                "%d of %d prompts of %s tokens served, TTFT p99 %s s"
                % (
                    c.get("completed", 0),
                    c.get("requests", 0),
                    (long.get("settings") or {}).get("isl"),
                    _fmt(((c.get("ttft_ms") or {}).get("p99") or 0) / 1000.0),
                )
            )
            out.append(_gate("long context", target, passed, c.get("completed"), c.get("requests"), detail, "requests"))
        failed = [p for p in pts if not counts(p, maxf)[0]]
        detail = (
            "every point: requests served, counters agree"
            if not failed
            else "; ".join("%s: %s" % (p["label"], counts(p, maxf)[1]) for p in failed[:4])
        )
        out.append(
            _gate("points valid and served", target, not failed, len(pts) - len(failed), len(pts), detail, "points")
        )
    if "fleet" not in targets:
        out.insert(
            0,
            _gate(
                "fleet throughput",
                "fleet",
                False,
                None,
                t["fleet_output_tok_s"],
                "not measured: no fleet endpoint (gateway) in the inventory",
                "tok/s",
            ),
        )
    return out


def _fleet_gate(pts, t, maxf):
    need = int(t.get("fleet_min_concurrency", 1000))
    high = [p for p in pts if p.get("kind") == "sweep" and int(p.get("concurrency") or 0) >= need]
    if not high:
        return _gate(
            "fleet throughput",
            "fleet",
            False,
            None,
            t["fleet_output_tok_s"],
            "not measured at %d or more concurrent requests (add it to the concurrency sweep)" % need,
            "tok/s",
        )
    good = [p for p in high if counts(p, maxf)[0]]
    if not good:
        return _gate(
            "fleet throughput",
            "fleet",
            False,
            None,
            t["fleet_output_tok_s"],
            "no point at >= %d concurrent counts: %s"
            % (need, "; ".join("%s: %s" % (p["label"], counts(p, maxf)[1]) for p in high)),
            "tok/s",
        )
    best = max(good, key=lambda p: p["client"]["output_tok_s"])
    c = best["client"]
    detail = (
        "%s output tok/s at %s concurrent (servers' counters %s output tokens, responses' usage %s, %s%%; "
        "re-tokenized by the client %s, not gating), TTFT p99 %s s%s"
        % (
            _fmt(c["output_tok_s"], "%.0f"),
            best.get("concurrency"),
            best.get("server_output_tokens"),
            c.get("usage_output_tokens", c.get("output_tokens")),
            _fmt(best.get("diff_pct"), "%+.2f"),
            _fmt(c.get("retokenized_output_tokens"), "%d"),
            _fmt(((c.get("ttft_ms") or {}).get("p99") or 0) / 1000.0, "%.2f"),
            "; the load generator's machine was saturated at this point"
            if (best.get("load_generator") or {}).get("client_bound")
            else "",
        )
    )
    return _gate(
        "fleet throughput",
        "fleet",
        c["output_tok_s"] >= t["fleet_output_tok_s"],
        c["output_tok_s"],
        t["fleet_output_tok_s"],
        detail,
        "tok/s",
    )


def _gate(name, target, passed, figure, threshold, detail, unit=""):
    return {
        "gate": name,
        "target": target,
        "status": "PASS" if passed else "FAIL",
        "figure": figure,
        "threshold": threshold,
        "unit": unit,
        "detail": detail,
    }


def _targets(raw):
    seen = []
    for p in raw["points"]:
        if p.get("target") not in seen:
            seen.append(p.get("target"))
    return seen


def gate_line(g):
    return "%s %s: %s - %s" % (g["status"], g["target"], g["gate"], g["detail"])


def build(raw):
    """results.json's content from raw.json's."""
    maxf = float(raw["settings"].get("max_failed_pct", 0.0))
    points = []
    for p in raw["points"]:
        p = dict(p)
        ok, why = counts(p, maxf)
        p["counts"], p["why_not"] = ok, why
        points.append(p)
    raw = dict(raw, points=points)
    curves = {}
    for p in points:
        if p.get("kind") in ("single", "sweep") and p.get("measured"):
            curves.setdefault(p["target"], []).append(curve_row(p))
    for rows in curves.values():
        rows.sort(key=lambda r: r["concurrency"])
    hosts = {}
    for h in raw["meta"].get("hosts", []):
        pts = [p for p in points if p.get("target") == h]
        single = next((p for p in pts if p.get("kind") == "single"), {})
        good = [p for p in pts if p["counts"] and p.get("kind") == "sweep"]
        hosts[h] = {
            "url": (raw["meta"].get("host_urls") or {}).get(h),
            "image": (raw["meta"].get("images") or {}).get(h),
            "single_stream_tok_s": (single.get("client") or {}).get("decode_tok_s"),
            "peak_output_tok_s": max((p["client"]["output_tok_s"] for p in good), default=None),
            "peak_at_concurrency": max(good, key=lambda p: p["client"]["output_tok_s"])["concurrency"]
            if good
            else None,
            "failed_requests": sum((p.get("client") or {}).get("failed", 0) for p in pts),
            "invalid_points": [p["label"] for p in pts if p.get("measured") and not p.get("valid")],
            "fleet_share_tokens": sum(
                ((p.get("servers") or {}).get(h) or {}).get("generation_tokens") or 0
                for p in points
                if p.get("target") == "fleet"
            ),
            "fleet_counter_errors": [
                p["label"]
                for p in points
                if p.get("target") == "fleet" and "error" in ((p.get("servers") or {}).get(h) or {})
            ],
        }
    results = {
        "schema": SCHEMA,
        "meta": raw["meta"],
        "settings": raw["settings"],
        "targets": raw["targets"],
        "definitions": DEFINITIONS,
        "points": points,
        "curves": curves,
        "hosts": hosts,
        "gates": gates(raw),
        "client_bound_points": [p["label"] for p in points if (p.get("load_generator") or {}).get("client_bound")],
    }
    results["plan"] = planmod.plan_section(results, raw.get("plan_demands") or [])
    results["verdict"] = "PASS" if all(g["status"] == "PASS" for g in results["gates"]) else "FAIL"
    return results


def load(path):
    with open(path) as fh:
        return json.load(fh)


def write(results, run_dir):
    path = os.path.join(run_dir, "results.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(results, fh, indent=1, sort_keys=False)
        fh.write("\n")
    os.replace(path + ".tmp", path)
    return path


def latest(reports_dir):
    """The newest reports/bench-*/results.json, or None."""
    if not os.path.isdir(reports_dir):
        return None
    runs = sorted(
        d
        for d in os.listdir(reports_dir)
        if d.startswith("bench-") and os.path.isfile(os.path.join(reports_dir, d, "results.json"))
    )
    return os.path.join(reports_dir, runs[-1], "results.json") if runs else None
