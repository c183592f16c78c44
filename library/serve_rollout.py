#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: serve_rollout
short_description: Plan the serve rollout's batches and hold a batch back while the rest cannot carry the load
description:
  - Reads every serving host's own vLLM C(/metrics) (C(vllm:num_requests_running) + C(vllm:num_requests_waiting))
    in parallel, the load the fleet carries now, including requests sent straight to a host. A host that does
    not answer carries nothing and adds no capacity.
  - Compares it with what the hosts that stay in service can carry, a host carrying the concurrency of its best
    output on the bench's per-host curve (results.json C(plan.per_host_curve)), within I(ttft_p99) when given.
    Without a curve only the max-unavailable bound applies, and the module says so.
  - I(mode=plan) returns the rollout's batches for the hosts that need a restart (the play's C(serial)), a canary
    of one, then I(max_unavailable) hosts (an int or a percentage of I(total), at least one), shrunk when the
    current load lets fewer hosts out; or the explicit I(batches), percentages taken of I(total).
  - In the plan, the hosts whose C(/metrics) does not answer serve nothing (a first deploy, hosts added or down) and
    carry no load. They come first, the canary among them, and after the canary start together, at most
    I(idle_batch_max) at once; only the serving hosts go in the I(max_unavailable) batches.
  - I(mode=gate) runs before a batch. When taking I(hosts) out would overload the rest it waits, polling every
    I(interval) seconds for at most I(timeout) seconds, then fails (the rollout stops; the batch was not touched).
  - Changes nothing. In check mode the gate does not wait and never fails; it reports what it would do.
  - Reads with ansible-core's C(open_url) (urllib) in threads, no other dependency; Python 3.8+.
options:
  mode:
    description: C(plan) (the batches) or C(gate) (before one batch).
    type: str
    choices: [plan, gate]
    required: true
  workers:
    description: Every serving host of the fleet and its server's base URL (C(https://address:port)).
    type: dict
    required: true
  ca_cert:
    description:
      - The CA certificate (PEM text, not a file) that alone verifies the C(https) workers - the fleet CA's, read on the
        controller, so that it needs no file on the host the module runs on. Empty - the system's trust store.
    type: str
    default: ""
  hosts:
    description: C(plan) - the hosts that need a restart, in rollout order; C(gate) - the batch.
    type: list
    elements: str
    default: []
  total:
    description: Serving hosts in the fleet, the base of percentages. Defaults to the number of I(workers).
    type: int
  max_unavailable:
    description: Hosts out of service at once after the canary, an int or a percentage like C(10%).
    type: raw
    default: "10%"
  idle_batch_max:
    description:
      - C(plan) - the hosts that serve nothing start after the canary at most this many at once; C(0) - all at once.
    type: int
    default: 0
  batches:
    description: Explicit batches (ints or percentages of I(total)); empty to use I(max_unavailable).
    type: list
    elements: raw
    default: []
  curve:
    description: The per-host curve, C([{concurrency, output_tok_s, ttft_p99_s}]); empty when no bench ran.
    type: list
    elements: dict
    default: []
  ttft_p99:
    description: A host's capacity keeps TTFT p99 within this many seconds (unset - its best output).
    type: float
  timeout:
    description: Seconds a gate waits for the load to fit before it fails.
    type: int
    default: 600
  interval:
    description: Seconds between two reads of the load while a gate waits.
    type: float
    default: 10
  request_timeout:
    description: Seconds one C(/metrics) read may take.
    type: float
    default: 5
author: kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: The batches for the hosts that need a restart
  serve_rollout:
    mode: plan
    workers: {kf-node-1: "https://172.31.250.11:8000", kf-node-2: "https://172.31.250.12:8000"}
    hosts: [kf-node-2]
    max_unavailable: "10%"
    curve: >-
      {{ (lookup('ansible.builtin.file', 'reports/bench-20261130T193349Z/results.json')
      | from_json).plan.per_host_curve }}
  register: serve_rollout_plan

- name: Before a batch, the rest of the fleet can carry the load
  serve_rollout:
    mode: gate
    workers: {kf-node-1: "https://172.31.250.11:8000", kf-node-2: "https://172.31.250.12:8000"}
    hosts: "{{ ansible_play_batch }}"
    curve: []
    timeout: 600
"""

RETURN = r"""
serial:
  description: (plan) the play's serial list, host counts; empty when no host needs a restart.
  returned: mode is plan
  type: list
  elements: int
  sample: [1, 4]
load:
  description: Requests running or waiting on the serving hosts (their own count), at the last read.
  returned: always
  type: float
  sample: 118
hosts:
  description:
    - (plan) the hosts that need a restart, in rollout order - the ones that serve nothing first (the canary the
      first of them), then the serving ones, each in the order given.
  returned: mode is plan
  type: list
  elements: str
idle:
  description: (plan) the hosts of I(hosts) that serve nothing now (their C(/metrics) did not answer).
  returned: mode is plan
  type: list
  elements: str
loads:
  description: The same per host that answered.
  returned: always
  type: dict
capacity:
  description: Concurrent requests one host carries, or null without a curve.
  returned: always
  type: float
  sample: 256
capacity_left:
  description: What the hosts staying in service carry (gate), or null without a curve.
  returned: always
  type: float
ok:
  description: The batch fits (gate), at the last read.
  returned: always
  type: bool
waited:
  description: Seconds the gate waited for the load to fit.
  returned: always
  type: float
not_answering:
  description: Hosts whose /metrics did not answer (counted as not serving).
  returned: always
  type: list
msg:
  description: One line - the load, the capacity left, what the rollout does.
  returned: always
  type: str
"""

import ssl
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import Request
from ansible.module_utils.rollout_capacity import assess, describe, host_capacity, in_flight, plan, rollout_order


def read_loads(workers, request_timeout, ca_cert=""):
    """{host: in flight} for the hosts that answer, [hosts that did not]."""
    context = ssl.create_default_context(cadata=ca_cert) if ca_cert else None

    def one(item):
        host, url = item
        try:
            # As a plain urlopen: environment proxies, no credentials from ~/.netrc.
            with Request().open(
                "GET", url.rstrip("/") + "/metrics", timeout=request_timeout, use_netrc=False, context=context
            ) as resp:
                return host, in_flight(resp.read().decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - any failure means: not serving now
            return host, None

    items = sorted(workers.items())
    if not items:
        return {}, []
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        got = list(pool.map(one, items))
    return {h: v for h, v in got if v is not None}, [h for h, v in got if v is None]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", required=True, choices=["plan", "gate"]),
            workers=dict(type="dict", required=True),
            hosts=dict(type="list", elements="str", default=[]),
            total=dict(type="int"),
            max_unavailable=dict(type="raw", default="10%"),
            batches=dict(type="list", elements="raw", default=[]),
            idle_batch_max=dict(type="int", default=0),
            curve=dict(type="list", elements="dict", default=[]),
            ttft_p99=dict(type="float"),
            timeout=dict(type="int", default=600),
            interval=dict(type="float", default=10.0),
            request_timeout=dict(type="float", default=5.0),
            ca_cert=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    workers = dict((str(k), str(v)) for k, v in p["workers"].items())
    total = p["total"] if p["total"] is not None else len(workers)
    try:
        capacity, note = host_capacity(p["curve"], p["ttft_p99"])
    except (KeyError, TypeError, ValueError) as exc:
        module.fail_json(msg="curve: each point needs concurrency, output_tok_s and ttft_p99_s (%s)" % exc)

    loads, not_answering = read_loads(workers, p["request_timeout"], p["ca_cert"])
    out = dict(changed=False, capacity=capacity, not_answering=not_answering, waited=0.0)

    if p["mode"] == "plan":
        verdict = assess(loads, [], capacity)
        if p["idle_batch_max"] < 0:
            module.fail_json(msg="serve_idle_batch_max: %d; give 0 (all at once) or a host count" % p["idle_batch_max"])
        hosts = rollout_order(p["hosts"], loads)
        idle = [h for h in hosts if h not in loads]
        try:
            serial, why = plan(
                hosts,
                total,
                p["max_unavailable"],
                p["batches"],
                None if capacity is None else verdict["can_go"],
                idle=len(idle),
                idle_batch_max=p["idle_batch_max"] or None,
            )
        except ValueError as exc:
            module.fail_json(msg="serve_max_unavailable / serve_rollout_batches: %s" % exc, **out)
        load_text = (
            "%d request(s) in flight on %d serving host(s); %s" % (verdict["load"], verdict["serving"], note)
            if capacity is not None
            else "%s: only serve_max_unavailable bounds the batches" % note
        )
        msg = (
            "rollout: %d of %d host(s) need a restart (%s): %s; %s"
            % (len(hosts), total, ", ".join(hosts), why, load_text)
            if hosts
            else "rollout: no host needs a restart; every host was checked (running, ready, in the gateways)"
        )
        module.exit_json(
            serial=serial,
            hosts=hosts,
            idle=idle,
            load=verdict["load"],
            loads=loads,
            capacity_left=None,
            ok=True,
            msg=msg,
            **out,
        )

    batch = p["hosts"]
    start = time.monotonic()
    while True:
        verdict = assess(loads, batch, capacity)
        waited = round(time.monotonic() - start, 1)
        out.update(
            load=verdict["load"],
            loads=loads,
            capacity_left=verdict["capacity_left"],
            ok=verdict["ok"],
            waited=waited,
            not_answering=not_answering,
        )
        if verdict["ok"]:
            action = "go" if waited == 0 else "go after waiting %.0f s for the load to fit" % waited
            module.exit_json(msg=describe(verdict, batch, capacity, note, action), **out)
        if module.check_mode:
            module.exit_json(
                msg=describe(
                    verdict,
                    batch,
                    capacity,
                    note,
                    "would wait up to %d s for the load to fit (check mode: not waiting)" % p["timeout"],
                ),
                **out,
            )
        if waited >= p["timeout"]:
            module.fail_json(
                msg=describe(
                    verdict,
                    batch,
                    capacity,
                    note,
                    (
                        "still over after %.0f s (serve_capacity_timeout): the rollout stops here, this batch was not "
                        "touched and keeps serving; run again when the load is lower, give more time, or set "
                        "serve_capacity_check: false"
                    )
                    % waited,
                ),
                **out,
            )
        if waited == 0:
            # Said once, as the wait starts: the line an operator watching the run needs.
            module.warn(
                describe(verdict, batch, capacity, note, "waiting up to %d s for the load to fit" % p["timeout"])
            )
        time.sleep(min(p["interval"], max(0.0, p["timeout"] - waited)) or 0.1)
        loads, not_answering = read_loads(workers, p["request_timeout"], p["ca_cert"])


if __name__ == "__main__":
    main()
