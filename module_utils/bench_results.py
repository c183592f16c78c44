# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bench's figures: aiperf's per-request export read into vllm bench serve's metrics,
the servers' own Prometheus counters, and whether the two agree.

Metric definitions are vllm bench serve's (benchmarks/serve.py):
  TTFT  time from sending the request to the first token, per request;
  TPOT  (latency - TTFT) / (output tokens - 1), per request with more than one token;
  ITL   every gap between two streamed chunks, pooled over the requests;
  output tok/s  output tokens of the completed requests / benchmark duration (first
        request sent to last response ended); req/s likewise.
Percentiles interpolate linearly between ranks (numpy.percentile's default).
aiperf names them differently: its `inter_token_latency` is vllm's TPOT, its
`inter_chunk_latency` is vllm's ITL; the figures here are computed from the per-request
records (profile_export.jsonl), not taken from aiperf's summary.

Output tokens are counted as vllm bench serve counts them (benchmarks/serve.py,
calculate_metrics): each response's own usage (`completion_tokens` of the last usage
chunk, which the server sends with stream_options.include_usage), the client's tokenizer
only for a response without usage. Text decoded from the token ids a model sampled does
not re-tokenize to the same count (against a real vLLM 0.15.1 the re-tokenized count was
25-60 % above the server's count), so the count aiperf makes of the text received is kept
beside, never used for a figure or for validity. A point is valid when the responses'
usage agrees with the servers' Prometheus counters (vllm:generation_tokens_total and
vllm:prompt_tokens_total over the point: the engine's own per-step accounting, a path
apart from the usage the API layer writes into each response).

Standard library only; pure functions apart from reading files and /proc.
"""

from __future__ import absolute_import, division, print_function

import json
import math
import os

__metaclass__ = type

PERCENTILES = (50, 90, 99)
# The servers' counters read before and after every point.
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
# Finished reasons of vllm:request_success_total that are completed requests.
COMPLETED_REASONS = ("stop", "length")


def percentile(values, q):
    """numpy.percentile(values, q) with linear interpolation; None for no values."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * (q / 100.0)
    low = int(math.floor(rank))
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def distribution(values):
    """mean and the percentiles of PERCENTILES, keyed mean/p50/p90/p99 (None when empty)."""
    data = [v for v in values if v is not None]
    out = {"mean": (sum(data) / len(data)) if data else None}
    for q in PERCENTILES:
        out["p%d" % q] = percentile(data, q)
    return out


def _metric(record, name):
    value = (record.get("metrics") or {}).get(name)
    if isinstance(value, dict):
        return value.get("value")
    return value


def read_records(path):
    """aiperf's profile_export.jsonl: one dict per request, in vllm bench serve's terms.
    Keys: ok, start_ns, end_ns, ttft_ms, latency_ms, aiperf_output_tokens (aiperf's
    output_sequence_length: its tokenizer on the text received, or the usage when it ran
    with use_server_token_count), usage_tokens and usage_prompt_tokens (the response's
    usage field, the server's own count), input_tokens (aiperf's count of the prompt),
    itl_ms (list), error (None or "code type: message")."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                raw = json.loads(line)
            except ValueError:
                continue
            meta = raw.get("metadata") or {}
            if meta.get("benchmark_phase", "profiling") != "profiling":
                continue
            err = raw.get("error")
            error = None
            if err:
                error = "%s %s: %s" % (err.get("code", ""), err.get("type", ""), str(err.get("message", ""))[:200])
                error = error.strip()
            itl = _metric(raw, "inter_chunk_latency")
            records.append(
                {
                    "ok": not err and not meta.get("was_cancelled"),
                    "cancelled": bool(meta.get("was_cancelled")),
                    "start_ns": meta.get("request_start_ns"),
                    "end_ns": meta.get("request_end_ns"),
                    "ttft_ms": _metric(raw, "time_to_first_token"),
                    "latency_ms": _metric(raw, "request_latency"),
                    "aiperf_output_tokens": _metric(raw, "output_sequence_length"),
                    "usage_tokens": _metric(raw, "usage_completion_tokens"),
                    "usage_prompt_tokens": _metric(raw, "usage_prompt_tokens"),
                    "input_tokens": _metric(raw, "input_sequence_length") or _metric(raw, "error_isl"),
                    "itl_ms": itl if isinstance(itl, list) else [],
                    "error": error or ("cancelled" if meta.get("was_cancelled") else None),
                }
            )
    return records


def _sum(values):
    values = [int(v) for v in values if v is not None]
    return sum(values) if values else None


def summarize(records, retokenized=True):
    """The point's client-side figures from read_records' list. Output tokens, and with
    them output tok/s and TPOT, are each response's usage (the client's count only for a
    response without one, as vllm bench serve does). `retokenized`: aiperf counted the
    text with the tokenizer (False when it ran with use_server_token_count, whose
    output_sequence_length is the usage again): that count is kept as
    retokenized_output_tokens, beside the figures."""
    ok = [r for r in records if r["ok"]]
    failed = [r for r in records if not r["ok"]]
    starts = [r["start_ns"] for r in records if r["start_ns"]]
    ends = [r["end_ns"] for r in records if r["end_ns"]]
    duration = (max(ends) - min(starts)) / 1e9 if starts and ends and max(ends) > min(starts) else 0.0
    tokens = [r["usage_tokens"] if r["usage_tokens"] is not None else r["aiperf_output_tokens"] for r in ok]
    out_tokens = sum(int(n or 0) for n in tokens)
    tpot = []
    for r, n in zip(ok, tokens):
        n = n or 0
        if n > 1 and r["latency_ms"] is not None and r["ttft_ms"] is not None:
            tpot.append((r["latency_ms"] - r["ttft_ms"]) / (n - 1))
    itl = [gap for r in ok for gap in r["itl_ms"]]
    errors = {}
    for r in failed:
        errors[r["error"] or "unknown"] = errors.get(r["error"] or "unknown", 0) + 1
    tpot_d = distribution(tpot)
    prompt = [r["usage_prompt_tokens"] if r["usage_prompt_tokens"] is not None else r["input_tokens"] for r in ok]
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "errors": errors,
        "duration_s": round(duration, 3),
        "output_tokens": out_tokens,
        "usage_output_tokens": _sum(r["usage_tokens"] for r in ok),
        "usage_prompt_tokens": _sum(r["usage_prompt_tokens"] for r in ok),
        "responses_without_usage": sum(1 for r in ok if r["usage_tokens"] is None),
        "retokenized_output_tokens": _sum(r["aiperf_output_tokens"] for r in ok) if retokenized else None,
        "input_tokens": sum(int(n or 0) for n in prompt),
        "output_tok_s": (out_tokens / duration) if duration else 0.0,
        "requests_per_s": (len(ok) / duration) if duration else 0.0,
        "ttft_ms": distribution([r["ttft_ms"] for r in ok]),
        "tpot_ms": tpot_d,
        "itl_ms": distribution(itl),
        "latency_ms": distribution([r["latency_ms"] for r in ok]),
        # One stream's decode rate: the inverse of its mean time per output token.
        "decode_tok_s": (1000.0 / tpot_d["mean"]) if tpot_d["mean"] else None,
    }


# ---------------------------------------------------------------- the servers' counters
def parse_prometheus(text):
    """{metric name: {labels string: value}} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            head, value = line.rsplit(" ", 1)
            value = float(value)
        except ValueError:
            continue
        if "{" in head:
            name, labels = head.split("{", 1)
            labels = labels.rstrip("}")
        else:
            name, labels = head, ""
        out.setdefault(name, {})[labels] = value
    return out


def _label(labels, key):
    for part in labels.split(","):
        k, _sep, v = part.partition("=")
        if k.strip() == key:
            return v.strip().strip('"')
    return None


def counters(text):
    """The counters the bench compares: generation and prompt tokens, completed requests
    (request_success with a stop/length reason) and every finished reason's count."""
    m = parse_prometheus(text)
    reasons = {}
    for labels, value in m.get(REQUEST_SUCCESS, {}).items():
        reason = _label(labels, "finished_reason") or ""
        reasons[reason] = reasons.get(reason, 0.0) + value
    return {
        "generation_tokens": sum(m.get(GENERATION_TOKENS, {}).values()) if GENERATION_TOKENS in m else None,
        "prompt_tokens": sum(m.get(PROMPT_TOKENS, {}).values()) if PROMPT_TOKENS in m else None,
        "completed": sum(v for r, v in reasons.items() if r in COMPLETED_REASONS) if reasons else None,
        "finished": reasons,
    }


def counter_delta(before, after):
    """after - before of counters(); None where either side is missing. A counter that
    went down means the server restarted during the point: its delta is unknown."""
    out = {"restarted": False}
    for key in ("generation_tokens", "prompt_tokens", "completed"):
        a, b = after.get(key), before.get(key)
        if a is None or b is None:
            out[key] = None
        elif a < b:
            out[key] = None
            out["restarted"] = True
        else:
            out[key] = int(round(a - b))
    return out


def agreement(usage_tokens, server_tokens, tolerance_pct, what="output"):
    """(valid, diff_pct, reason): the responses' usage against the servers' counters,
    for `what` tokens (output or prompt)."""
    if server_tokens is None:
        return False, None, "the servers' counters could not be read before and after the point"
    usage_tokens = usage_tokens or 0
    if server_tokens == 0 and usage_tokens == 0:
        return True, 0.0, "no tokens on either side"
    base = float(max(server_tokens, 1))
    diff = 100.0 * (usage_tokens - server_tokens) / base
    if abs(diff) > tolerance_pct:
        return (
            False,
            diff,
            (
                "the responses' usage says %d %s tokens, the servers' counters %d (%+.1f%%, more "
                "than %.1f%%)" % (usage_tokens, what, server_tokens, diff, tolerance_pct)
            ),
        )
    return True, diff, "within %.1f%%" % tolerance_pct


def validity(client, server_output, server_prompt, tolerance_pct):
    """Whether a point's figures can be trusted, from summarize()'s dict and the servers'
    counter deltas summed over the point (None: unreadable). The responses' usage must
    agree with the counters within tolerance_pct, for output tokens and for prompt tokens
    (when the servers count them); every completed response must carry usage. The
    client's re-tokenized count never decides. Returns a dict: valid, diff_pct (output),
    prompt_diff_pct, retokenized_diff_pct (the re-tokenized count against the usage,
    shown only) and validity (why)."""
    usage = client.get("usage_output_tokens")
    retok = client.get("retokenized_output_tokens")
    out = {
        "valid": False,
        "diff_pct": None,
        "prompt_diff_pct": None,
        "validity": "",
        "retokenized_diff_pct": (100.0 * (retok - usage) / usage) if retok is not None and usage else None,
    }
    missing = client.get("responses_without_usage") or 0
    ok, out["diff_pct"], why = agreement(usage, server_output, tolerance_pct)
    if server_output is None:
        out["validity"] = why
        return out
    if missing:
        out["validity"] = (
            "%d of %d completed responses carried no usage, so the output tokens cannot be "
            "checked against the servers' counters (vLLM sends usage when the request asks "
            "for stream_options.include_usage, as aiperf does)" % (missing, client.get("completed", 0))
        )
        return out
    if not ok:
        out["validity"] = why
        return out
    if server_prompt is not None:
        pok, out["prompt_diff_pct"], pwhy = agreement(
            client.get("usage_prompt_tokens"), server_prompt, tolerance_pct, "prompt"
        )
        if not pok:
            out["validity"] = pwhy
            return out
        why = "output and prompt tokens " + why
    else:
        why = "output tokens %s (the servers report no prompt token counter)" % why
    out["valid"], out["validity"] = True, why
    return out


# ---------------------------------------------------------------- the load generator's machine
def concurrent_streams(points, host_parallel):
    """The most streams the bench's points keep open at once, and how: the fleet's points
    run one after another, then every host's own points, hosts side by side
    (`host_parallel` at a time, each host's points one after another), so the worst case
    is the largest fleet point or the `host_parallel` largest host maxima together. No
    point of a kind: it adds nothing (fleet points only, or hosts only, or none)."""
    fleet = [int(p.get("concurrency") or 0) for p in points if p.get("target") == "fleet"]
    hosts = {}
    for p in points:
        if p.get("target") != "fleet":
            hosts[p.get("target")] = max(hosts.get(p.get("target"), 0), int(p.get("concurrency") or 0))
    side_by_side = sorted(hosts.values(), reverse=True)[: max(int(host_parallel), 1)]
    streams = max([max(fleet or [0]), sum(side_by_side)])
    detail = "largest fleet point %d, %d host(s) side by side at their largest %d" % (
        max(fleet or [0]),
        len(side_by_side),
        sum(side_by_side),
    )
    return streams, detail


def fd_plan(concurrency, headroom, soft, hard):
    """What the open-files limit needs for `concurrency` streams: (needed, action, message);
    action is "ok", "raise" (soft below, hard enough: raised for the load generator) or
    "refuse" (even the hard limit is too low)."""
    needed = int(concurrency) + int(headroom)
    unlimited = hard < 0  # RLIM_INFINITY
    if soft < 0 or soft >= needed:
        return needed, "ok", "open files: soft limit %s covers %d" % ("unlimited" if soft < 0 else soft, needed)
    if unlimited or hard >= needed:
        return (
            needed,
            "raise",
            (
                "open files: soft limit %d is below the %d that %d concurrent streams need; "
                "raised to %d (the hard limit) for the load generator"
                % (soft, needed, concurrency, needed if unlimited else hard)
            ),
        )
    return (
        needed,
        "refuse",
        (
            "open files: %d concurrent streams need about %d descriptors on the controller, above its hard "
            "limit %d (soft %d). Fix: raise the hard limit for the user running the bench, for example "
            "`nofile %d` in /etc/security/limits.conf (new login), `ulimit -Hn %d` as root in the shell "
            "that runs it, or LimitNOFILE=%d for a service; or bench fewer concurrent streams"
            % (concurrency, needed, hard, soft, needed, needed, needed)
        ),
    )


def cpu_times():
    """(busy, total) jiffies of the whole machine from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except (IOError, OSError):
        return None
    values = [int(x) for x in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def client_load(child_cpu_s, wall_s, ncpu, machine_before, machine_after, limit=0.85):
    """The load generator's own CPU and the machine's, and whether either was the limit."""
    cores = (child_cpu_s / wall_s) if wall_s > 0 else 0.0
    machine_pct = None
    if machine_before and machine_after and machine_after[1] > machine_before[1]:
        machine_pct = 100.0 * (machine_after[0] - machine_before[0]) / (machine_after[1] - machine_before[1])
    bound = cores >= limit * ncpu or (machine_pct is not None and machine_pct >= 100.0 * limit)
    note = "the load generator used %.2f of %d cores (%.0f%%), the machine was %s busy" % (
        cores,
        ncpu,
        100.0 * cores / max(ncpu, 1),
        "?" if machine_pct is None else "%.0f%%" % machine_pct,
    )
    if bound:
        note += ": the client machine was saturated, so this point may measure the client, not the fleet"
    return {
        "cpu_s": round(child_cpu_s, 2),
        "wall_s": round(wall_s, 2),
        "cores_used": round(cores, 2),
        "cpu_count": ncpu,
        "machine_busy_pct": None if machine_pct is None else round(machine_pct, 1),
        "client_bound": bool(bound),
        "note": note,
    }


# ---------------------------------------------------------------- aiperf's configuration
API_KEY_ENV = "KF_BENCH_API_KEY"


def aiperf_config(
    url,
    model,
    tokenizer,
    concurrency,
    isl,
    osl,
    artifact_dir,
    requests=0,
    duration=0.0,
    grace=0.0,
    timeout=600.0,
    workers=2,
    entries=None,
    api_key=True,
    seed=0,
    corpus="random",
    retokenize=True,
):
    """aiperf's YAML configuration (its envelope shape, written as JSON, a subset of YAML;
    the benchmark under `benchmark:`, the seed beside it). The API key is not
    in it: `${KF_BENCH_API_KEY}`, which aiperf substitutes from the environment, so the key
    is never on a command line or in a file; aiperf redacts it in its own exports.
    `corpus` is where the prompts' tokens come from: "random" draws them from the
    tokenizer's vocabulary, as `vllm bench serve --dataset-name random` does (the way the
    reference figures were measured, and no corpus to tokenize before the point starts);
    "sonnet" or "coding" make prose or code from aiperf's own text.
    Every request asks for the usage chunk (stream_options.include_usage; aiperf 0.13 adds
    it to streamed completions too, here it is not left to that). `retokenize`: aiperf also
    counts the text received with the tokenizer (output_sequence_length, kept beside the
    usage); False sets its use_server_token_count, which skips that count (less client CPU)
    and makes its own exports count the usage."""
    phase = {"name": "profiling", "kind": "profiling", "type": "concurrency", "concurrency": int(concurrency)}
    if requests:
        phase["requests"] = int(requests)
    else:
        phase["duration"] = float(duration)
        phase["grace_period"] = float(grace)
    if entries is None:
        entries = int(requests) if requests else max(2 * int(concurrency), 100)
    endpoint = {
        "urls": [url],
        "type": "completions",
        "streaming": True,
        "timeout": float(timeout),
        "use_server_token_count": not retokenize,
        "extra": {"ignore_eos": True, "stream_options": {"include_usage": True}},
    }
    if api_key:
        endpoint["api_key"] = "${%s}" % API_KEY_ENV
    return {
        "benchmark": {
            "models": {"items": [{"name": model}]},
            "endpoint": endpoint,
            "datasets": [
                {
                    "name": "main",
                    "type": "synthetic",
                    "entries": max(int(entries), 1),
                    "prompts": {"isl": {"mean": int(isl), "stddev": 0}, "osl": {"mean": int(osl)}, "corpus": corpus},
                }
            ],
            "phases": [phase],
            "artifacts": {"dir": artifact_dir, "auto_plot": False},
            "tokenizer": {"name": tokenizer},
            "gpu_telemetry": {"enabled": False},
            "server_metrics": {"enabled": False},
            "runtime": {"ui": "none", "workers": max(1, min(int(workers), int(concurrency)))},
        },
        "random_seed": int(seed),
    }
