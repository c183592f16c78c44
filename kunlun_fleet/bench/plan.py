"""Capacity plan: how many hosts a load needs, from what the bench measured.

The per-host curve is the mean over the hosts measured directly (single-stream and sweep
points that count: valid, served) of output tok/s and TTFT p99 at each concurrency. A
fleet of N hosts behind the gateway serving C concurrent requests is taken to put C/N on
each host (load spread evenly by the gateway) and each host to behave as the curve:
figures between measured concurrencies are interpolated linearly, below the lowest one
output tok/s scales with the streams.

A plan is only as good as the curve under it, so an answer must lie inside what was
measured. It is not when:
  - a concurrency asked for needs more concurrent requests per host than any measured
    (fewer hosts than ceil(C / highest measured) are never considered, and when that
    smallest count is the answer, whether fewer would do is not known);
  - an output rate asked for is met by running each host at the curve's last point while
    the curve is still rising there (one point, or the last more than 5 % above the one
    before): a host's capacity is not measured, so the count would be too high.
Then the plan uses the fleet curve instead (the points measured through the gateway, each
divided evenly over the hosts behind it), or, failing that, a fleet point that met the
load outright ("at most N hosts": the fleet measured did it), or refuses and says what to
measure. Prompt and output lengths are the bench's. Standard library only.
"""

import math

ASSUMPTION = (
    "Load spread evenly over the hosts by the gateway (C concurrent requests put C/N on each of "
    "N hosts); each host behaves as the measured per-host curve (mean of the hosts measured "
    "directly), interpolated linearly between measured concurrencies; no answer reaches beyond the "
    "curve: not above the highest concurrency measured per host, and not at the curve's last point "
    "while it is still rising there (a host's capacity unmeasured). Where the per-host curve does not "
    "cover a load, the fleet curve (points through the gateway divided evenly over its hosts) or a "
    "fleet point that met the load is used, or the plan refuses; requests shaped like the bench's "
    "(prompt and output lengths)."
)
MAX_HOSTS = 100000
# The last point of a curve more than this factor above the one before: still rising.
RISING = 1.05


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
            (c["output_tok_s"], ((c.get("ttft_ms") or {}).get("p99") or 0.0) / 1000.0)
        )
    curve = []
    for conc in sorted(by_c):
        rows = by_c[conc]
        curve.append((conc, sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows)))
    return curve


def fleet_hosts(results):
    """The hosts behind the fleet endpoint: the inventory's serving hosts."""
    meta = results.get("meta") or {}
    return int(meta.get("inventory_host_count") or meta.get("host_count") or len(meta.get("hosts") or []) or 0)


def fleet_points(results):
    """[(concurrency, output_tok_s, ttft_p99_s)] of the fleet endpoint's points that count."""
    out = []
    for p in results.get("points") or []:
        if p.get("target") != "fleet" or p.get("kind") not in ("single", "sweep") or not p.get("counts"):
            continue
        c = p["client"]
        out.append((int(p["concurrency"]), c["output_tok_s"], ((c.get("ttft_ms") or {}).get("p99") or 0.0) / 1000.0))
    return sorted(out)


def fleet_curve(results):
    """The fleet's points as a per-host curve: C concurrent and T tok/s through the gateway
    over H hosts are C/H and T/H per host (the plan's even spread), TTFT as measured. Only
    points with at least one request per host."""
    hosts = fleet_hosts(results)
    if hosts < 1:
        return []
    return [(c / float(hosts), t / hosts, f) for c, t, f in fleet_points(results) if c >= hosts]


def interpolate(curve, c):
    """(output_tok_s, ttft_p99_s or None beyond the measured range) of one host at c."""
    if not curve:
        return None, None
    if c <= curve[0][0]:
        # below the lowest measured point: throughput scales with the streams, TTFT as measured there
        return curve[0][1] * (c / float(curve[0][0])), curve[0][2]
    for (c0, t0, f0), (c1, t1, f1) in zip(curve, curve[1:], strict=False):
        if c0 <= c <= c1:
            w = (c - c0) / float(c1 - c0)
            return t0 + w * (t1 - t0), f0 + w * (f1 - f0)
    return max(r[1] for r in curve), None


def _c(value):
    """A concurrency for the text: whole, or to one decimal (a fleet point over its hosts)."""
    return "%d" % value if float(value).is_integer() else "%.1f" % value


def extent(curve):
    """What a curve covers, in words."""
    if not curve:
        return "no point"
    top = curve[-1]
    if len(curve) == 1:
        return "one point, %s concurrent (%.0f tok/s): it shows neither how a host scales nor where it saturates" % (
            _c(top[0]),
            top[1],
        )
    rise = (top[1] / curve[-2][1] - 1.0) if curve[-2][1] > 0 else float("inf")
    if top[1] > RISING * curve[-2][1]:
        return (
            "%d points, %s to %s concurrent, still rising at its end (%+.0f%% from %s): where a host "
            "saturates is not measured" % (len(curve), _c(curve[0][0]), _c(top[0]), 100 * rise, _c(curve[-2][0]))
        )
    return "%d points, %s to %s concurrent, flat at its end" % (len(curve), _c(curve[0][0]), _c(top[0]))


def _still_rising(curve):
    return len(curve) == 1 or curve[-1][1] > RISING * curve[-2][1]


def hosts_needed(curve, concurrency=None, output_tok_s=None, ttft_p99_s=None):
    """The smallest host count meeting every limit given, with the figures it expects, on
    one curve. Returns a dict: hosts (None when no host count can meet it, or nothing can be
    said), per_host_concurrency, fleet_output_tok_s, ttft_p99_s, binding, note, and covered
    (False when the answer rests on where the curve ends, not on what it measured; then
    `uncovered` says why)."""
    ask = {"concurrency": concurrency, "output_tok_s": output_tok_s, "ttft_p99_limit_s": ttft_p99_s}
    if not curve:
        return dict(
            ask,
            hosts=None,
            covered=False,
            uncovered="no per-host curve measured (bench the hosts directly)",
            note="no per-host curve measured (bench the hosts directly)",
        )
    top = curve[-1][0]
    if ttft_p99_s is not None and min(r[2] for r in curve) > ttft_p99_s:
        if curve[0][0] > 1:
            # Fewer streams per host than the lowest measured might meet it: not measured.
            return dict(
                ask,
                hosts=None,
                covered=False,
                uncovered=(
                    "TTFT p99 is above %.3g s at every point, the lowest at %s concurrent per host (%.3g s): below "
                    "that it is not measured" % (ttft_p99_s, _c(curve[0][0]), curve[0][2])
                ),
            )
        return dict(
            ask,
            hosts=None,
            covered=True,
            note=(
                "TTFT p99 is above %.3g s at every measured per-host concurrency (lowest %.3g s): more hosts "
                "cannot bring it down" % (ttft_p99_s, min(r[2] for r in curve))
            ),
        )
    if concurrency:
        # Fewer hosts would put more concurrent requests on each than was measured.
        first = max(1, int(math.ceil(concurrency / float(top) - 1e-9)))
        for n in range(first, MAX_HOSTS + 1):
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
            answer = dict(
                ask,
                hosts=n,
                per_host_concurrency=round(c, 1),
                fleet_output_tok_s=round(n * tput, 1),
                ttft_p99_s=None if ttft is None else round(ttft, 3),
                binding=" and ".join(binding) or "concurrency",
                note="",
                covered=True,
            )
            if n == first and n > 1:
                answer.update(
                    covered=False,
                    uncovered=(
                        "%d concurrent on fewer than %d hosts is above the highest per-host concurrency measured "
                        "(%s): whether fewer hosts would do is not measured" % (concurrency, n, _c(top))
                    ),
                )
            return answer
        return dict(ask, hosts=None, covered=True, note="no host count up to %d meets it" % MAX_HOSTS)
    if output_tok_s:
        usable = [r for r in curve if ttft_p99_s is None or r[2] <= ttft_p99_s]
        if ttft_p99_s is not None:
            # Between two measured points the curve is interpolated (as for a concurrency):
            # where TTFT p99 crosses the limit on a segment, that operating point counts too.
            for (c0, t0, f0), (c1, t1, f1) in zip(curve, curve[1:], strict=False):
                if f0 <= ttft_p99_s < f1:
                    w = (ttft_p99_s - f0) / float(f1 - f0)
                    usable.append((c0 + w * (c1 - c0), t0 + w * (t1 - t0), ttft_p99_s))
        if not usable:
            return dict(
                ask,
                hosts=None,
                covered=True,
                note=("no measured per-host concurrency keeps TTFT p99 within %.3g s" % ttft_p99_s),
            )
        best = max(usable, key=lambda r: r[1])
        n = int(math.ceil(output_tok_s / best[1])) if best[1] > 0 else None
        if n is None:
            return dict(ask, hosts=None, covered=True, note="the measured curve has no output")
        answer = dict(
            ask,
            hosts=n,
            per_host_concurrency=round(best[0], 1),
            fleet_output_tok_s=round(n * best[1], 1),
            ttft_p99_s=round(best[2], 3),
            binding="output tok/s",
            fleet_concurrency=round(n * best[0]),
            note="each host run at %.0f concurrent (its best output on the measured curve within the limits)" % best[0],
            covered=True,
        )
        if best[0] == top and _still_rising(curve):
            answer.update(
                covered=False,
                uncovered=(
                    "its best output is at its last point, %s concurrent (%.0f tok/s), where it has not flattened: a "
                    "host's capacity is not measured, so %d hosts would be too many" % (_c(best[0]), best[1], n)
                ),
            )
        return answer
    return dict(ask, hosts=None, covered=True, note="give a concurrency or an output tok/s")


def _met_by_fleet(results, concurrency, output_tok_s, ttft_p99_s):
    """The fleet point that met the load outright, or None: at least the concurrency asked,
    its TTFT p99 within the limit, and an output rate that covers the one asked even scaled
    down to the concurrency asked (a stream is no slower with fewer streams)."""
    met = []
    for c, t, f in fleet_points(results):
        if concurrency and c < concurrency:
            continue
        if ttft_p99_s is not None and f > ttft_p99_s:
            continue
        if output_tok_s and (t * min(1.0, float(concurrency) / c) if concurrency else t) < output_tok_s:
            continue
        met.append((c, t, f))
    return min(met, key=lambda r: r[0]) if met else None


def answer(results, concurrency=None, output_tok_s=None, ttft_p99_s=None):
    """The plan's answer to one question, from the per-host curve where it covers the load,
    else the fleet curve, else a fleet point that met it, else a refusal saying what to
    measure. The dict of hosts_needed with basis (per-host curve, fleet curve, fleet point
    or None) and bound (exact, or "at most" for a fleet point)."""
    direct = per_host_curve(results)
    a = hosts_needed(direct, concurrency=concurrency, output_tok_s=output_tok_s, ttft_p99_s=ttft_p99_s)
    if a["covered"]:
        return dict(a, basis="per-host curve" if a.get("hosts") else None, bound="exact")
    why_direct = (
        "the per-host curve (%s) does not cover it: %s" % (extent(direct), a["uncovered"])
        if direct
        else ("no host was measured directly")
    )
    hosts = fleet_hosts(results)
    fleet = fleet_curve(results)
    why_fleet = "no fleet curve (no fleet point with %d or more concurrent requests counts)" % max(hosts, 1)
    if fleet:
        b = hosts_needed(fleet, concurrency=concurrency, output_tok_s=output_tok_s, ttft_p99_s=ttft_p99_s)
        if b["covered"] and b.get("hosts"):
            return dict(
                b,
                basis="fleet curve",
                bound="exact",
                note="; ".join(
                    x
                    for x in (
                        why_direct,
                        "from the fleet curve (%d hosts behind the gateway, divided evenly)" % hosts,
                        b.get("note"),
                    )
                    if x
                ),
            )
        if b["covered"]:
            return dict(b, basis=None, bound="exact", note="%s; the fleet curve: %s" % (why_direct, b.get("note")))
        why_fleet = "the fleet curve per host (%s) does not either: %s" % (extent(fleet), b["uncovered"])
    met = _met_by_fleet(results, concurrency, output_tok_s, ttft_p99_s)
    if met:
        c, t, f = met
        return dict(
            a,
            hosts=hosts,
            per_host_concurrency=round(c / float(max(hosts, 1)), 1),
            fleet_output_tok_s=round(t, 1),
            ttft_p99_s=round(f, 3),
            binding="measured",
            covered=True,
            basis="fleet point",
            bound="at most",
            note=(
                "%s; the fleet of %d hosts met it: %.0f output tok/s at %d concurrent through the gateway, "
                "TTFT p99 %.2f s; whether fewer hosts would do is not measured" % (why_direct, hosts, t, c, f)
            ),
        )
    hint = (
        ""
        if output_tok_s or ttft_p99_s is not None
        else (
            " (with neither a TTFT p99 nor an output limit any host count holds the requests - vLLM queues what it "
            "cannot run - so give one)"
        )
    )
    return dict(
        a,
        hosts=None,
        covered=False,
        basis=None,
        bound="exact",
        note=(
            "%s; %s; no fleet point met it. Measure more: per host up to where output tok/s stops rising "
            "(bench_host_concurrency, e.g. [1, 64, 256, 1024]), or the fleet at the load asked (bench_concurrency)%s"
            % (why_direct, why_fleet, hint)
        ),
    )


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
    text = "%s: %s%d host%s (%.0f concurrent each, about %.0f output tok/s for the fleet, TTFT p99 %s)" % (
        head,
        "at most " if answer.get("bound") == "at most" else "",
        answer["hosts"],
        "" if answer["hosts"] == 1 else "s",
        answer["per_host_concurrency"],
        answer["fleet_output_tok_s"],
        "unknown" if answer.get("ttft_p99_s") is None else "%.2f s" % answer["ttft_p99_s"],
    )
    return text + ("; " + answer["note"] if answer.get("note") else "")


def plan_section(results, demands):
    curve = per_host_curve(results)
    fleet = fleet_curve(results)
    answers = []
    for d in demands:
        limit = d.get("ttft_p99_s")
        a = answer(
            results,
            concurrency=d.get("concurrency"),
            output_tok_s=d.get("output_tok_s"),
            ttft_p99_s=None if limit is None else float(limit),
        )
        a["text"] = describe(a)
        answers.append(a)
    return {
        "assumption": ASSUMPTION,
        "per_host_curve": [
            {"concurrency": c, "output_tok_s": round(t, 1), "ttft_p99_s": round(f, 3)} for c, t, f in curve
        ],
        "per_host_extent": extent(curve),
        "fleet_hosts": fleet_hosts(results),
        "fleet_curve": [
            {"concurrency": round(c, 1), "output_tok_s": round(t, 1), "ttft_p99_s": round(f, 3)} for c, t, f in fleet
        ],
        "fleet_extent": extent(fleet),
        "answers": answers,
    }


def parse_seconds(text):
    """'2s', '500ms', '2' (seconds), '1.5m' -> seconds."""
    t = str(text).strip().lower()
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * factor
    return float(t)
