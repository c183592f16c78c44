"""Streamed load through the fleet endpoint, each request classed as a client sees it; faults
on one sim host; the router's view of its workers. Used by test_failover_sim.py (asserts)
and scripts/bench_failover.py (prints figures).

A request is one of:
  served      a finish reason and the usage chunk arrived
  before      failed before a worker took it: a status other than 200, a refused or reset
              connection, a timeout with nothing received (what the gateway must retry)
  in-flight   a 200 came (a worker had accepted it) and the stream ended or broke before
              its end (lost with its host: counted)
No client retry: a plain client's view.
"""

import http.client
import json
import re
import threading
import time


from kunlun_fleet.sim.testing import refuse_port, ssh
from kunlun_fleet.bundle import load_pins as stack_pins

SERVED, BEFORE, IN_FLIGHT = "served", "before", "in-flight"
PINS = stack_pins()
SERVING_PORT = PINS["kunlun_stack_serving"]["port"]


class Client(threading.Thread):
    def __init__(self, endpoint, model, key, stop, log, max_tokens):
        super().__init__(daemon=True)
        self.host, self.port = endpoint
        self.model, self.key, self.stop, self.log, self.max_tokens = model, key, stop, log, max_tokens

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
                return start, BEFORE, "HTTP %d" % resp.status
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
                usage = usage or bool(chunk.get("usage"))
                for choice in chunk.get("choices") or []:
                    finished = finished or bool(choice.get("finish_reason"))
            conn.close()
            if finished and usage:
                return start, SERVED, ""
            # A 200 came: a worker had accepted the request (the router passes a worker's
            # headers on as it gets them, before the first token) and it was lost with that
            # worker, in flight, whether or not a token had come yet.
            return start, IN_FLIGHT, "stream ended early"
        except Exception as exc:  # every failure is a figure here
            return start, BEFORE if first is None else IN_FLIGHT, type(exc).__name__

    def run(self):
        while not self.stop.is_set():
            start, kind, why = self.one()
            self.log.append((start, time.monotonic(), kind, why))


class Load:
    """N clients in a loop until stop(); rows: (start, end, class, reason), monotonic s."""

    def __init__(self, endpoint, model, key, clients, max_tokens):
        self.stop_event, self.rows = threading.Event(), []
        self.clients = [Client(endpoint, model, key, self.stop_event, self.rows, max_tokens) for _ in range(clients)]

    def start(self):
        for c in self.clients:
            c.start()

    def stop(self):
        self.stop_event.set()
        for c in self.clients:
            c.join(timeout=90)
        return list(self.rows)


def fault(host, kind, on):
    """stop: systemctl stop (vLLM's graceful shutdown); kill: the container SIGKILLed (the
    unit's Restart= brings it back); firewall: the serving port DROPped (no answer at all)."""
    if kind == "stop":
        ssh(host, "systemctl %s kunlun-serve" % ("stop" if on else "start"))
    elif kind == "kill":
        if on:
            ssh(host, "docker kill --signal KILL kunlun-serve")
        else:
            # systemd restarted it once already: clear the unit's start limit first
            ssh(host, "systemctl reset-failed kunlun-serve; systemctl restart kunlun-serve")
    elif kind == "firewall":
        refuse_port(host, SERVING_PORT, on, silent=True)
    else:
        raise ValueError(kind)


def count(rows):
    out = {SERVED: 0, BEFORE: 0, IN_FLIGHT: 0}
    for r in rows:
        out[r[2]] += 1
    return out


def reasons(rows):
    out = {}
    for r in rows:
        if r[2] != SERVED:
            out["%s: %s" % (r[2], r[3])] = out.get("%s: %s" % (r[2], r[3]), 0) + 1
    return out


METRIC = re.compile(r'^(vllm_router_(?:cb_state|worker_health))\{worker="([^"]+)"\} (\S+)$')


def router_view(gateway_host, metrics_port):
    """{worker URL: (circuit breaker state, health)} from the router's own metrics on the
    gateway host's loopback: cb_state 0 is closed (in the pool), health 1 is healthy."""
    out = ssh(gateway_host, "curl -sf http://127.0.0.1:%d/metrics" % metrics_port, timeout=30).stdout
    view = {}
    for line in out.splitlines():
        m = METRIC.match(line)
        if m:
            cb, health = view.get(m.group(2), (None, None))
            if m.group(1).endswith("cb_state"):
                cb = float(m.group(3))
            else:
                health = float(m.group(3))
            view[m.group(2)] = (cb, health)
    return view


def in_pool(view, worker):
    """Healthy, its breaker closed (the router exports a breaker's state from its first
    request on: none yet is closed)."""
    cb, health = view.get(worker, (None, None))
    return cb in (None, 0) and health == 1
