# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve rollout's arithmetic: batch sizes under a max-unavailable bound, the per-host
capacity from the bench's capacity plan, the fleet's load from the servers' own /metrics,
and whether taking a batch out of service leaves enough capacity for that load.

Capacity of one host, in concurrent requests (running + waiting, vLLM's own gauges): the
operating point the capacity plan (kunlun_fleet/bench/plan.py) picks for a host - the
concurrency of its best output tok/s on the measured per-host curve, within a TTFT p99
limit when one is given (interpolated where the curve crosses it). Load spread evenly by
the gateway, as the plan assumes. Standard library only; pure functions.
"""

from __future__ import absolute_import, division, print_function

import math
import re

__metaclass__ = type

IN_FLIGHT = re.compile(r"(?m)^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? ([0-9.eE+-]+)\s*$")


def parse_bound(value, total):
    """An int (hosts) or 'N%' (of total, rounded down) -> hosts, at least 1 and at most
    total (a fleet of 0 gives 0). Raises ValueError on anything else."""
    total = int(total)
    if total <= 0:
        return 0
    text = str(value).strip()
    if text.endswith("%"):
        pct = float(text[:-1])
        if pct <= 0 or pct > 100:
            raise ValueError("%r: a percentage must be above 0%% and at most 100%%" % (value,))
        hosts = int(math.floor(total * pct / 100.0 + 1e-9))
    else:
        hosts = int(text)
        if hosts <= 0 or str(hosts) != text.lstrip("+"):
            raise ValueError("%r: give a host count (1 or more) or a percentage like '10%%'" % (value,))
    return max(1, min(total, hosts))


def resolve_batches(batches, total):
    """Explicit batches (ints or percentages of the fleet) -> host counts. Percentages are
    of the whole fleet (total), not of the hosts that restart, as they were when the
    rollout ran every host through its batches."""
    return [parse_bound(b, total) for b in batches]


def host_capacity(curve, ttft_p99_s=None):
    """(concurrency one host carries, or None, note). curve: [{concurrency, output_tok_s,
    ttft_p99_s}] as results.json's plan.per_host_curve."""
    rows = sorted(
        (float(r["concurrency"]), float(r["output_tok_s"]), float(r.get("ttft_p99_s") or 0.0)) for r in (curve or [])
    )
    if not rows:
        return None, "no per-host curve (no bench results)"
    usable = [r for r in rows if ttft_p99_s is None or r[2] <= ttft_p99_s]
    if ttft_p99_s is not None:
        # Where TTFT p99 crosses the limit between two measured points, the interpolated
        # point counts too (as in the capacity plan).
        for (c0, t0, f0), (c1, t1, f1) in zip(rows, rows[1:]):
            if f0 <= ttft_p99_s < f1:
                w = (ttft_p99_s - f0) / (f1 - f0)
                usable.append((c0 + w * (c1 - c0), t0 + w * (t1 - t0), ttft_p99_s))
    if not usable:
        return None, "no measured concurrency keeps TTFT p99 within %.3g s" % ttft_p99_s
    # Best output; of equal outputs the lowest concurrency (max keeps the first).
    best = max(sorted(usable), key=lambda r: r[1])
    limit = "" if ttft_p99_s is None else " within TTFT p99 %.3g s" % ttft_p99_s
    return best[0], "a host carries %.0f concurrent: its best output, %.0f tok/s, on the bench's curve%s" % (
        best[0],
        best[1],
        limit,
    )


def in_flight(metrics_text):
    """Running + waiting requests of one vLLM server, from its /metrics text."""
    return sum(float(v) for v in IN_FLIGHT.findall(metrics_text or ""))


def assess(loads, batch, capacity):
    """Would taking `batch` out overload the rest?

    loads: {host: requests in flight} for every host that answered (serving now); a host
    that did not answer carries nothing and adds no capacity. capacity: per host, or None
    (no curve: only the max-unavailable bound applies, always ok).
    Returns a dict: load, serving, out (batch hosts serving now), remaining, capacity_left,
    ok, can_go (how many serving hosts may be out at once under this load).
    """
    serving = sorted(loads)
    out = [h for h in batch if h in loads]
    remaining = [h for h in serving if h not in batch]
    load = sum(loads.values())
    res = {"load": load, "serving": len(serving), "out": out, "remaining": len(remaining)}
    if capacity is None:
        res.update(capacity_left=None, ok=True, can_go=len(serving))
        return res
    res["capacity_left"] = len(remaining) * capacity
    # Nothing in flight fits anywhere (a fleet starting from nothing, a quiet fleet), and a
    # batch of hosts that serve nothing takes no capacity out, however loaded the rest is.
    res["ok"] = not out or load <= 0 or load <= res["capacity_left"]
    needed = int(math.ceil(load / capacity)) if capacity > 0 else len(serving)
    res["can_go"] = len(serving) if load <= 0 else max(0, len(serving) - needed)
    return res


def rollout_order(restart_hosts, serving):
    """The rollout's host order: the hosts that serve nothing now first (so the canary is
    one of them when there is one: a canary that fails then cost the fleet nothing), then
    the serving ones, each group in the given (inventory) order."""
    idle = [h for h in restart_hosts if h not in serving]
    return idle + [h for h in restart_hosts if h in serving]


def plan(restart_hosts, total, max_unavailable, batches=None, can_go=None, idle=None, idle_batch_max=None):
    """The rollout's batches, as the play's `serial` list (host counts), and why.

    restart_hosts: the hosts that need a restart, in rollout order (the canary first; with
    idle, the rollout_order: the idle hosts first). total: serving hosts in the fleet (the
    base of percentages). batches: explicit batches (the operator's), used as given.
    Otherwise a canary of one, then batches of max_unavailable, shrunk to can_go (how many
    hosts the current load lets out at once, at least 1: that batch then waits at its gate).
    idle: how many of restart_hosts, from the first, serve nothing now (a first deploy, hosts
    added or down): they carry no load, so after the canary they start together, at most
    idle_batch_max at once (None: all), and only the serving ones go in max_unavailable's
    batches. None: every host counts as serving (the batches as before).
    """
    n = len(restart_hosts)
    if n == 0:
        return [], "no host needs a restart"
    if batches:
        sizes = resolve_batches(batches, total)
        return sizes, "explicit batches %s of %d serving hosts" % (sizes, total)
    bound = parse_bound(max_unavailable, total)
    size = bound
    why = "at most %d host(s) out of service at once (serve_max_unavailable=%s of %d)" % (bound, max_unavailable, total)
    if can_go is not None and can_go < size:
        size = max(1, can_go)
        why += "; shrunk to %d: the fleet's load lets only %d host(s) out now" % (size, can_go)
    idle = min(int(idle or 0), n)
    if not idle:
        return [1, size], "a canary, then " + why
    wave = idle - 1  # the canary is the first idle host
    per = wave if not idle_batch_max else max(1, int(idle_batch_max))
    serial = [1] + [min(per, wave - i) for i in range(0, wave, per or 1)]
    first = "a canary of the %d host(s) that serve nothing" % idle
    if wave:
        first += (
            ", then the other %d together" % wave
            if per >= wave
            else ", then the other %d, at most %d at once (serve_idle_batch_max)" % (wave, per)
        )
    if n == idle:
        return serial, first + ": none serves, none is capacity"
    return serial + [size], "%s; then the %d serving host(s): %s" % (first, n - idle, why)


def describe(verdict, batch, capacity, capacity_note, action):
    """The one line the rollout prints before a batch."""
    hosts = ", ".join(batch) or "no host"
    if capacity is None:
        return (
            "capacity: %s; %d request(s) in flight on %d serving host(s); taking out %s: %s "
            "(only serve_max_unavailable bounds the batch)"
            % (capacity_note, verdict["load"], verdict["serving"], hosts, action)
        )
    return (
        "capacity: %d request(s) in flight on %d serving host(s); taking out %s leaves %d host(s) x %.0f = %.0f "
        "concurrent (%s): %s"
        % (
            verdict["load"],
            verdict["serving"],
            hosts,
            verdict["remaining"],
            capacity,
            verdict["capacity_left"],
            capacity_note,
            action,
        )
    )
