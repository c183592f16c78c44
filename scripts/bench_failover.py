#!/usr/bin/env python3
"""Failover through the fleet endpoint, measured (issue 31): what a client sees when one
serving host stops, dies or drops off the network under load.

Not a test (prints figures). Against the sim fleet (`make demo` first): N client threads
send streamed chat completions through the fleet endpoint with no client retry (what a
plain client sees), for `--before` seconds; then the fault on one host; the load goes on
for `--after` seconds; then the load stops and the host is brought back.

Faults (on kf-node-<--host>, the gateway runs on kf-node-1):
  stop      systemctl stop kunlun-serve (docker stop: vLLM's graceful shutdown)
  kill      the serving container killed (SIGKILL: the process dies mid-stream)
  firewall  the host's serving port dropped (iptables DROP: no answer at all)

Each request is classed: served (a finish reason and usage), failed before its first byte
(a status other than 200, a refused or reset connection, a timeout before any byte), or lost
in flight (the stream cut after its first byte). The figures: per class before and after the
fault, the time from the fault to the last failure before the first byte (how long the dead
worker stayed in the pool, as clients see it), and the longest request served after it (a
stream held up by a host that stopped answering). tests/gateway/test_failover_sim.py asserts
the same classes in CI.

    .venv/bin/python scripts/bench_failover.py --fault stop --clients 16
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The load and the faults are the failover test's (one client, one classification).
sys.path.insert(0, str(ROOT / "tests" / "gateway"))

from failover_load import BEFORE, SERVED, Load, count, fault, reasons  # noqa: E402
from kunlun_fleet import vault  # noqa: E402


def fleet_endpoint():
    """The endpoint the last acceptance run measured (reports/acceptance.json)."""
    report = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return report["fleet_url"], report["model"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault", choices=["stop", "kill", "firewall"], required=True)
    ap.add_argument("--host", type=int, default=2, help="the sim host index (default 2: kf-node-2)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--before", type=float, default=20)
    ap.add_argument("--after", type=float, default=90)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    url, model = fleet_endpoint()
    key = vault.read_api_key(str(ROOT / "inventories" / "sim"))
    host, port = url.split("://", 1)[1].rstrip("/").rsplit(":", 1)
    load = Load((host, int(port)), model, key, args.clients, args.max_tokens)
    load.start()
    time.sleep(args.before)
    t_fault = time.monotonic()
    fault(args.host, args.fault, True)
    time.sleep(args.after)
    rows = load.stop()
    fault(args.host, args.fault, False)

    before = [r for r in rows if r[1] < t_fault]
    after = [r for r in rows if r[1] >= t_fault]
    last = max((r[1] - t_fault for r in after if r[2] == BEFORE), default=0.0)
    # a stream on a host that stopped answering (firewall) stalls rather than fails
    longest = max((r[1] - r[0] for r in after if r[2] == SERVED), default=0.0)
    print(
        "fault: %s on kf-node-%d, %d clients, %.0f s before, %.0f s after"
        % (args.fault, args.host, args.clients, args.before, args.after)
    )
    print("before the fault: %s" % count(before))
    print("after the fault:  %s" % count(after))
    print("failed before their first byte after the fault, the last at +%.1f s" % last)
    print("the longest request served after the fault took %.1f s" % longest)
    for why, n in sorted(reasons(after).items(), key=lambda kv: -kv[1]):
        print("  %4d  %s" % (n, why))


if __name__ == "__main__":
    main()
