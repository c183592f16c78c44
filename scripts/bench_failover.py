#!/usr/bin/env python3
"""Failover through the fleet endpoint, measured (issue 31): what a client sees when one
serving host stops, dies or drops off the network under load.

Not a test (prints figures). Against the sim fleet (`make demo` first): N client threads
send streamed chat completions through the fleet endpoint with no client retry (what a
plain client sees), for `--before` seconds; then the fault on one host; the load goes on
for `--after` seconds; then the host is brought back (and the load stopped).

Faults (on kf-node-<--host>, the gateway runs on kf-node-1):
  stop      systemctl stop kunlun-serve (docker stop: vLLM's graceful shutdown)
  kill      the serving container killed (SIGKILL: the process dies mid-stream)
  firewall  the host's serving port dropped (iptables DROP: no answer at all)

Each request is classed: served (a finish reason and usage), failed before its first byte
(a status other than 200, a refused or reset connection, a timeout before any byte), or lost
in flight (the stream cut after its first byte). The figures: per class before and after the
fault, the time from the fault to the last failure before the first byte (how long the dead
worker stayed in the pool, as clients see it), and the requests still reaching the host.

    .venv/bin/python scripts/bench_failover.py --fault stop --clients 16
"""

import argparse
import http.client
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kunlun_fleet import vault  # noqa: E402
from kunlun_fleet.sim import testing  # noqa: E402


def fleet_endpoint():
    """The endpoint the last acceptance run measured (reports/acceptance.json)."""
    report = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return report["fleet_url"], report["model"]


class Client(threading.Thread):
    def __init__(self, host, port, model, key, stop, log, max_tokens):
        super().__init__(daemon=True)
        self.host, self.port, self.model, self.key = host, port, model, key
        self.stop, self.log, self.max_tokens = stop, log, max_tokens

    def one(self):
        body = json.dumps(
            {
                "model": self.model,
                "stream": True,
                "max_tokens": self.max_tokens,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Hello"}],
            }
        )
        start, first = time.monotonic(), None
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=body,
                headers={"Content-Type": "application/json", "Authorization": "Bearer " + self.key},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                resp.read()
                return start, "before", "HTTP %d" % resp.status
            finished = usage = False
            while True:
                line = resp.readline()
                if not line:
                    break
                if first is None:
                    first = time.monotonic()
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = True
                for choice in chunk.get("choices") or []:
                    finished = finished or bool(choice.get("finish_reason"))
            conn.close()
            if finished and usage:
                return start, "served", ""
            return start, "before" if first is None else "in-flight", "stream ended early"
        except Exception as exc:  # every failure is a figure here
            return start, "before" if first is None else "in-flight", type(exc).__name__

    def run(self):
        while not self.stop.is_set():
            start, kind, why = self.one()
            self.log.append((start, time.monotonic(), kind, why))


def fault(host, kind, on):
    if kind == "stop":
        testing.ssh(host, "systemctl %s kunlun-serve" % ("stop" if on else "start"))
    elif kind == "kill":
        if on:
            testing.ssh(host, "docker kill --signal KILL kunlun-serve")
        else:
            testing.ssh(host, "systemctl restart kunlun-serve")
    elif kind == "firewall":
        from kunlun_fleet.sim import config, engine

        rule = ["INPUT", "-p", "tcp", "--dport", "8000", "-j", "DROP"]
        engine.docker("exec", config.container_name(host), "iptables", "-I" if on else "-D", *rule, check=on)


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
    hostport = url.split("://", 1)[1].rstrip("/")
    host, port = hostport.rsplit(":", 1)
    stop, log = threading.Event(), []
    clients = [Client(host, int(port), model, key, stop, log, args.max_tokens) for _ in range(args.clients)]
    for c in clients:
        c.start()
    time.sleep(args.before)
    t_fault = time.monotonic()
    fault(args.host, args.fault, True)
    time.sleep(args.after)
    stop.set()
    for c in clients:
        c.join(timeout=90)
    fault(args.host, args.fault, False)

    def count(rows):
        out = {"served": 0, "before": 0, "in-flight": 0}
        for r in rows:
            out[r[2]] += 1
        return out

    before = [r for r in log if r[1] < t_fault]
    after = [r for r in log if r[1] >= t_fault]
    failures = [r for r in after if r[2] == "before"]
    last = max((r[1] - t_fault for r in failures), default=0.0)
    reasons = {}
    for r in after:
        if r[2] != "served":
            reasons[(r[2], r[3])] = reasons.get((r[2], r[3]), 0) + 1
    print(
        "fault: %s on kf-node-%d, %d clients, %.0f s before, %.0f s after"
        % (args.fault, args.host, args.clients, args.before, args.after)
    )
    print("before the fault: %s" % count(before))
    print("after the fault:  %s" % count(after))
    print("failed before their first byte after the fault, the last at +%.1f s" % last)
    for (kind, why), n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print("  %4d  %-9s %s" % (n, kind, why))


if __name__ == "__main__":
    main()
