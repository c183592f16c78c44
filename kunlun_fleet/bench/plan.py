"""Capacity plan: how many hosts a load needs, from the measured per-host curve.

The per-host curve is the mean over the hosts measured directly (single-stream and sweep
points that count: valid, served) of output tok/s and TTFT p99 at each concurrency. A
fleet of N hosts behind the gateway serving C concurrent requests is taken to put C/N on
each host (load spread evenly by the gateway) and each host to behave as the curve:
figures between measured concurrencies are interpolated linearly; beyond the highest
measured concurrency a host's output tok/s is taken as flat (saturated) and its TTFT is
unknown, so a TTFT limit is never judged there. Prompt and output lengths are the
bench's. Standard library only.
"""

import math

ASSUMPTION = ("Load spread evenly over the hosts by the gateway (C concurrent requests put C/N on each of "
              "N hosts); each host behaves as the measured per-host curve (mean of the hosts measured "
              "directly), interpolated linearly between measured concurrencies; beyond the highest measured "
              "concurrency a host's output tok/s is taken as flat and its TTFT as unknown; requests shaped "
              "like the bench's (prompt and output lengths).")
MAX_HOSTS = 100000


def per_host_curve(results):
    """[(concurrency, output_tok_s, ttft_p99_s)] sorted by concurrency, or [] when no host
    was measured directly."""
    hosts = set((results.get("meta") or {}).get("hosts") or [])
    by_c = {}
    for p in results.get("points") or []:
        if p.get("target") not in hosts or p.get("kind") not in ("single", "sweep") or not p.get("counts"):
            continue
        c = p["client"]
        by_c.setdefault(int(p["concurrency"]), []).append(
            (c["output_tok_s"], ((c.get("ttft_ms") or {}).get("p99") or 0.0) / 1000.0))
    curve = []
    for conc in sorted(by_c):
        rows = by_c[conc]
        curve.append((conc, sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows)))
    return curve


def interpolate(curve, c):
    """(output_tok_s, ttft_p99_s or None beyond the measured range) of one host at c."""
    if not curve:
        return None, None
    if c <= curve[0][0]:
        # below the lowest measured point: throughput scales with the streams, TTFT as measured there
        return curve[0][1] * (c / float(curve[0][0])), curve[0][2]
    for (c0, t0, f0), (c1, t1, f1) in zip(curve, curve[1:]):
        if c0 <= c <= c1:
            w = (c - c0) / float(c1 - c0)
            return t0 + w * (t1 - t0), f0 + w * (f1 - f0)
    return max(r[1] for r in curve), None


def hosts_needed(curve, concurrency=None, output_tok_s=None, ttft_p99_s=None):
    """The smallest host count meeting every limit given, with the figures it expects.
    Returns a dict: hosts (None when no host count can meet it), per_host_concurrency,
    fleet_output_tok_s, ttft_p99_s, binding, note."""
    ask = {"concurrency": concurrency, "output_tok_s": output_tok_s, "ttft_p99_limit_s": ttft_p99_s}
    if not curve:
        return dict(ask, hosts=None, note="no per-host curve measured (bench the hosts directly)")
    top = curve[-1][0]
    if ttft_p99_s is not None and min(r[2] for r in curve) > ttft_p99_s:
        return dict(ask, hosts=None, note=(
            "TTFT p99 is above %.3g s at every measured per-host concurrency (lowest %.3g s): more hosts "
            "cannot bring it down" % (ttft_p99_s, min(r[2] for r in curve))))
    if concurrency:
        for n in range(1, MAX_HOSTS + 1):
            c = concurrency / float(n)
            tput, ttft = interpolate(curve, c)
            if ttft_p99_s is not None and (ttft is None or ttft > ttft_p99_s):
                continue
            if output_tok_s is not None and n * tput < output_tok_s:
                continue
            binding = []
            if ttft_p99_s is not None:
                binding.append("TTFT p99")
            if output_tok_s is not None:
                binding.append("output tok/s")
            note = "" if c <= top else (
                "%.0f concurrent per host is above the highest measured (%d): output tok/s taken as flat" % (c, top))
            return dict(ask, hosts=n, per_host_concurrency=round(c, 1), fleet_output_tok_s=round(n * tput, 1),
                        ttft_p99_s=None if ttft is None else round(ttft, 3),
                        binding=" and ".join(binding) or "concurrency", note=note)
        return dict(ask, hosts=None, note="no host count up to %d meets it" % MAX_HOSTS)
    if output_tok_s:
        usable = [r for r in curve if ttft_p99_s is None or r[2] <= ttft_p99_s]
        if ttft_p99_s is not None:
            # Between two measured points the curve is interpolated (as for a concurrency):
            # where TTFT p99 crosses the limit on a segment, that operating point counts too.
            for (c0, t0, f0), (c1, t1, f1) in zip(curve, curve[1:]):
                if f0 <= ttft_p99_s < f1:
                    w = (ttft_p99_s - f0) / float(f1 - f0)
                    usable.append((c0 + w * (c1 - c0), t0 + w * (t1 - t0), ttft_p99_s))
        if not usable:
            return dict(ask, hosts=None,
                        note="no measured per-host concurrency keeps TTFT p99 within %.3g s (lowest measured: %.3g s)"
                        % (ttft_p99_s, min(r[2] for r in curve)))
        best = max(usable, key=lambda r: r[1])
        n = int(math.ceil(output_tok_s / best[1])) if best[1] > 0 else None
        if n is None:
            return dict(ask, hosts=None, note="the measured curve has no output")
        return dict(ask, hosts=n, per_host_concurrency=round(best[0], 1), fleet_output_tok_s=round(n * best[1], 1),
                    ttft_p99_s=round(best[2], 3), binding="output tok/s", fleet_concurrency=round(n * best[0]),
                    note="each host run at %.0f concurrent (its best output on the measured curve within the limits)"
                    % best[0])
    return dict(ask, hosts=None, note="give a concurrency or an output tok/s")


def ask_text(answer):
    return describe(answer).split(":", 1)[0]


def describe(answer):
    ask = []
    if answer.get("concurrency"):
        ask.append("%d concurrent requests" % answer["concurrency"])
    if answer.get("output_tok_s"):
        ask.append("%.0f output tok/s" % answer["output_tok_s"])
    if answer.get("ttft_p99_limit_s") is not None:
        ask.append("TTFT p99 <= %.3g s" % answer["ttft_p99_limit_s"])
    head = ", ".join(ask) or "?"
    if answer.get("hosts") is None:
        return "%s: cannot be planned - %s" % (head, answer.get("note", ""))
    text = ("%s: %d host%s (%.0f concurrent each, about %.0f output tok/s for the fleet, TTFT p99 %s)"
            % (head, answer["hosts"], "" if answer["hosts"] == 1 else "s", answer["per_host_concurrency"],
               answer["fleet_output_tok_s"], "unknown" if answer.get("ttft_p99_s") is None
               else "%.2f s" % answer["ttft_p99_s"]))
    return text + ("; " + answer["note"] if answer.get("note") else "")


def plan_section(results, demands):
    curve = per_host_curve(results)
    answers = []
    for d in demands:
        limit = d.get("ttft_p99_s")
        a = hosts_needed(curve, concurrency=d.get("concurrency"), output_tok_s=d.get("output_tok_s"),
                         ttft_p99_s=None if limit is None else float(limit))
        a["text"] = describe(a)
        answers.append(a)
    return {"assumption": ASSUMPTION,
            "per_host_curve": [{"concurrency": c, "output_tok_s": round(t, 1), "ttft_p99_s": round(f, 3)}
                               for c, t, f in curve],
            "answers": answers}


def parse_seconds(text):
    """'2s', '500ms', '2' (seconds), '1.5m' -> seconds."""
    t = str(text).strip().lower()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if t.endswith(suffix):
            return float(t[:-len(suffix)]) * factor
    return float(t)
