#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: canary_measure
short_description: Measure a canary host and a baseline host side by side under the same load, and apply the canary gate
description:
  - The measurement of a stack upgrade's canary gate (docs/upgrades.md). The host on the new stack (the canary)
    and a host that stays on the current stack (the baseline) are measured at the same time with the same
    requests, each host directly at its own OpenAI-compatible server (not through the gateway), and the figures
    go to the gate of module_utils/canary.py.
  - In this order - readiness of both (C(GET /v1/models) lists I(model)); the golden-output check (the prompts
    generated on both at the same time, one at a time per host, greedy, I(golden_max_tokens) each, the
    baseline's token ids the record and the canary's compared with them, as the golden_outputs module does);
    the single stream on both at the same time (one streamed completion per host of I(single_stream_tokens)
    tokens, greedy, C(ignore_eos); decode rate = (tokens - 1) / (last token's time - first token's time));
    then the concurrency point on both at the same time (I(concurrency) streamed completions in flight per
    host, I(osl) tokens each with C(ignore_eos), for I(point_requests) requests per host or I(point_duration)
    seconds).
  - 'The point''s figures have vllm bench serve''s definitions (module_utils/bench_results.py) - output tok/s =
    output tokens of the completed requests / the point''s wall time on that host (first request sent to last
    answer ended); TTFT = request sent to first token; TPOT = (latency - TTFT) / (tokens - 1); p99 with linear
    interpolation. Output tokens are each response''s usage (C(stream_options.include_usage)), the chunks
    counted for a response without one.'
  - A failure is a request answered with an HTTP status other than 200, a stream that errs or breaks off before
    C([DONE]), one longer than I(timeout), or fewer tokens than asked (C(ignore_eos) makes every request
    generate I(osl)).
  - Returns both hosts' figures, a per-second output-rate series per host for the report's plot, the
    golden-output verdict, and the gate. A FAIL is a result, not a module failure - C(passed) false and
    C(message) naming every failed gate with both figures; the play decides (C(failed_when), or a rollback).
  - Fails before any request on a threshold that is unknown or has a bad value; fails naming the host and the
    fix when a server does not list the model, refuses the key or does not answer; fails when the baseline
    cannot give the golden record (no reference). A canary that cannot answer the golden prompts is a failed
    C(outputs) verdict.
  - Runs on the controller (C(delegate_to localhost)); threads, C(http.client) and ansible-core's C(open_url),
    standard library only. Changes nothing.
options:
  baseline_url:
    description: The baseline host's server, without C(/v1) (for example C(http://10.0.0.2:8000)).
    type: str
    required: true
  canary_url:
    description: The canary host's server, without C(/v1).
    type: str
    required: true
  api_key:
    description: The servers' API key. Omit for servers without one.
    type: str
  model:
    description: The served model name (the servers' C(--served-model-name)).
    type: str
    required: true
  single_stream_tokens:
    description: Tokens of the single stream on each host.
    type: int
    default: 256
  concurrency:
    description: Streams in flight on each host at the concurrency point.
    type: int
    default: 32
  point_requests:
    description: Requests sent to each host at the concurrency point. 0 - for I(point_duration) seconds instead.
    type: int
    default: 0
  point_duration:
    description:
      - Seconds requests are sent for at the concurrency point (when I(point_requests) is 0); the requests under
        way then are waited for.
    type: float
    default: 60
  prompt:
    description:
      - The text of every request of the single stream and the point. Each request's prompt starts with its
        number (C(Request 12.)), the same on both hosts, so that no two requests of a host share a prefix.
      - Omitted - a built-in paragraph of about 100 words.
    type: str
  osl:
    description: Tokens per request at the concurrency point (C(max_tokens), with C(ignore_eos)).
    type: int
    default: 256
  timeout:
    description: Seconds one request may take, and wait for any answer, before it counts as failed.
    type: float
    default: 300
  golden_prompts:
    description: The golden-output check's prompts. Omitted - the built-in set of 8 (module_utils/golden.py).
    type: list
    elements: str
  golden_max_tokens:
    description: Tokens per golden prompt.
    type: int
    default: 32
  golden_tolerance:
    description: For stacks known to change numerics - how much of each golden output must agree. C({}) - exact.
    type: dict
    default: {}
    suboptions:
      min_agreeing_tokens:
        description: Every prompt's first divergence must be at this token index or later. 0 - exact.
        type: int
        default: 0
  thresholds:
    description:
      - The gate's thresholds that differ from module_utils/canary.py's defaults - C(throughput_min_ratio) (0.95),
        C(single_stream_min_ratio) (0.95), C(ttft_p99_max_ratio) (1.10), C(tpot_p99_max_ratio) (1.10),
        C(failures_max) (0), C(outputs_must_pass) (true).
      - An unknown name or a bad value fails before any request.
    type: dict
    default: {}
  ca_file:
    description: A CA certificate file (PEM) to verify C(https) servers with, besides the system's.
    type: path
  validate_certs:
    description: Verify the servers' certificates (C(https)).
    type: bool
    default: true
notes:
  - Check mode - measures nothing and returns C(skipped) with what it would measure. Measuring only reads, but
    it loads two production hosts for minutes; an upgrade's C(--check) must not. The thresholds and the
    arguments are still checked.
  - Both hosts must carry no other traffic while measured (take them out of the gateway first) - the figures
    are compared, and another client's load on one host only is a difference the gate would read as the stack's.
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Measure the canary against the baseline, side by side
  canary_measure:
    baseline_url: "http://{{ hostvars[baseline_host].ansible_host }}:8000"
    canary_url: "http://{{ hostvars[canary_host].ansible_host }}:8000"
    api_key: "{{ vault_kunlun_api_key }}"
    model: Qwen3.8-27B-INT8-W8A8-Dynamic
    concurrency: 32
    point_duration: 60
    osl: 256
    thresholds:
      ttft_p99_max_ratio: 1.2
  delegate_to: localhost
  run_once: true
  register: canary

- name: Stop the upgrade on a FAIL
  ansible.builtin.fail:
    msg: "{{ canary.message }}"
  when: not ansible_check_mode and not canary.passed
"""

RETURN = r"""
measured:
  description: False in check mode (nothing was measured).
  returned: always
  type: bool
skipped:
  description: True in check mode.
  returned: check mode
  type: bool
settings:
  description: What is (or would be) measured - both URLs, the model, the single stream's tokens, the point's
    concurrency, requests or duration, osl, the golden prompts' count and tokens, the tolerance, and the
    thresholds in force.
  returned: always
  type: dict
figures:
  description: >-
    Per host (baseline, canary) - single_stream_tok_s, output_tok_s, ttft_p99_s, tpot_p99_s, failures,
    concurrency, requests (sent at the point), completed, output_tokens, duration_s, errors (message to count),
    ttft_p50_s, tpot_p50_s, single_stream_error (why the single stream gave no figure, else null); the canary's
    also outputs (the golden-output verdict). Null figures were not measured.
  returned: success
  type: dict
  sample:
    baseline: {single_stream_tok_s: 35.0, output_tok_s: 1090.0, ttft_p99_s: 0.41, tpot_p99_s: 0.028, failures: 0,
      concurrency: 32, requests: 320}
series:
  description: Per host (baseline, canary) - the point's output rate, second by second from the point's start
    (the same start for both), as [second, tok/s] pairs; the last second's rate is over the part it covers.
  returned: success
  type: dict
outputs:
  description: The golden-output verdict - passed, verdict (one line), failing, divergences (module_utils/golden.py
    compare), tolerance, prompts, max_tokens, and both digests.
  returned: success
  type: dict
gate:
  description: module_utils/canary.py's gate - passed, gates (name, passed, baseline, canary, limit, message
    each), failed, message.
  returned: success
  type: dict
passed:
  description: Every gate passed. Null in check mode.
  returned: always
  type: bool
message:
  description: The gate's message - C(PASS) with the number of gates, or C(FAIL) naming each failed gate with
    both figures.
  returned: success
  type: str
  sample: "FAIL (throughput): canary output 1020 tok/s is 21 % of the baseline's 4850 (needs >= 95 %)"
"""

import http.client as http_client
import json
import math
import ssl
import threading
import time

from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bench_results import summarize
from ansible.module_utils.canary import gate, thresholds_of
from ansible.module_utils.golden import DEFAULT_PROMPTS, Failed, check_record, compare, digest, generate

DEFAULT_PROMPT = (
    "You are helping the operators of a fleet of inference servers. Explain, in plain words and in some detail, "
    "how a server that generates text for many users at once decides which requests to run, how it keeps the "
    "memory of every conversation, what happens when more people ask than it can serve, and why the first word "
    "of an answer can take longer to arrive than the words after it. Give an example with numbers, and end with "
    "advice for someone who has to choose how many requests to send at the same time."
)
SERIES_INTERVAL_S = 1.0
HOSTS = ("baseline", "canary")


# ----------------------------------------------------------------------------- the maths
def decode_rate(tokens, first, last):
    """One stream's decode rate: (tokens - 1) / (last token's time - first token's time);
    None when it cannot be taken (one token, or no time between)."""
    if not tokens or tokens < 2 or first is None or last is None or last <= first:
        return None
    return (tokens - 1) / (last - first)


def rate_series(events, start, end, interval=SERIES_INTERVAL_S):
    """[[second, tok/s], ...] from (time, tokens) events: the tokens in each interval from
    start, divided by the interval (the last one by the part of it before end)."""
    if end is None or end <= start:
        return []
    count = int(math.ceil((end - start) / interval - 1e-9))
    bins = [0.0] * count
    for when, tokens in events:
        index = int((when - start) // interval)
        if 0 <= index < count:
            bins[index] += tokens
        elif index >= count and when <= end + 1e-9:
            bins[-1] += tokens
    out = []
    for index, total in enumerate(bins):
        width = min(interval, end - (start + index * interval))
        out.append([round(index * interval, 3), round(total / width, 2) if width > 0 else 0.0])
    return out


def request_prompt(prompt, index):
    """Request `index`'s prompt (its number first: no shared prefix between requests)."""
    return "Request %d. %s" % (index + 1, prompt)


def as_record(rec):
    """A request as module_utils/bench_results.summarize reads one (read_records' keys)."""
    ms = 1000.0
    return {
        "ok": rec["error"] is None,
        "cancelled": False,
        "start_ns": int(rec["start"] * 1e9),
        "end_ns": int(rec["end"] * 1e9),
        "ttft_ms": (rec["first"] - rec["start"]) * ms if rec["first"] is not None else None,
        "latency_ms": (rec["end"] - rec["start"]) * ms,
        "aiperf_output_tokens": len(rec["chunks"]),
        "usage_tokens": rec["usage_tokens"],
        "usage_prompt_tokens": rec["prompt_tokens"],
        "input_tokens": None,
        "itl_ms": [],
        "error": rec["error"],
    }


def tokens_of(rec):
    return rec["usage_tokens"] if rec["usage_tokens"] is not None else len(rec["chunks"])


def chunk_events(records):
    """(time, tokens) of every chunk with text: a response's tokens spread over its chunks."""
    events = []
    for rec in records:
        if rec["chunks"]:
            each = tokens_of(rec) / float(len(rec["chunks"]))
            events.extend((when, each) for when in rec["chunks"])
    return events


def _seconds(value):
    return None if value is None else round(value / 1000.0, 4)


def point_figures(records, concurrency):
    """The gate's figures of one host's concurrency point."""
    s = summarize([as_record(r) for r in records])
    return {
        "output_tok_s": round(s["output_tok_s"], 2) if s["completed"] else None,
        "ttft_p99_s": _seconds(s["ttft_ms"]["p99"]),
        "tpot_p99_s": _seconds(s["tpot_ms"]["p99"]),
        "ttft_p50_s": _seconds(s["ttft_ms"]["p50"]),
        "tpot_p50_s": _seconds(s["tpot_ms"]["p50"]),
        "failures": s["failed"],
        "errors": s["errors"],
        "concurrency": concurrency,
        "requests": s["requests"],
        "completed": s["completed"],
        "output_tokens": s["output_tokens"],
        "duration_s": s["duration_s"],
    }


# ----------------------------------------------------------------------------- the servers
class Refused(Exception):
    """A host cannot be measured; the message names it and the fix."""


class Host(object):
    """One host's server, reached directly (no proxy), the key in a header only."""

    def __init__(self, role, url, api_key, timeout, ca_file=None, validate_certs=True):
        self.role, self.url = role, url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        parts = urlsplit(self.url)
        self.https = parts.scheme == "https"
        self.netloc, self.prefix = parts.netloc, parts.path.rstrip("/")
        self.api_key, self.timeout = api_key, timeout
        self.context = None
        if self.https:
            self.context = ssl.create_default_context(cafile=ca_file)
            if not validate_certs:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def name(self):
        return "the %s (%s)" % (self.role, self.url)

    def connection(self):
        if self.https:
            return http_client.HTTPSConnection(self.netloc, timeout=self.timeout, context=self.context)
        return http_client.HTTPConnection(self.netloc, timeout=self.timeout)

    def headers(self, body=False):
        headers = {"Accept": "application/json"}
        if body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        return headers

    def ready(self, model):
        """Raises Refused unless GET /v1/models answers and lists the model."""
        where = "GET %s/v1/models" % self.url
        conn = self.connection()
        try:
            conn.request("GET", self.prefix + "/v1/models", headers=self.headers())
            resp = conn.getresponse()
            status, raw = resp.status, resp.read()
        except (OSError, http_client.HTTPException) as exc:
            raise Refused(
                "%s: %s got no answer (%s). Fix: start the host's serving (or wait until the serving_ready module "
                "passes), and check the URL" % (self.name(), where, exc)
            ) from None
        finally:
            conn.close()
        if status in (401, 403):
            raise Refused(
                "%s: %s answered HTTP %d: the server refuses the key. Fix: pass the key it was started with (the "
                "vault's vault_kunlun_api_key) as api_key" % (self.name(), where, status)
            )
        try:
            listed = [str(m.get("id")) for m in json.loads(raw.decode("utf-8")).get("data") or []]
        except (ValueError, AttributeError, UnicodeDecodeError):
            listed = None
        if status != 200 or listed is None:
            raise Refused(
                "%s: %s answered HTTP %d, not a model list: %r. Fix: the URL must be the host's vLLM OpenAI-compatible "
                "server (its --port), not the gateway or another service" % (self.name(), where, status, raw[:200])
            )
        if model not in listed:
            raise Refused(
                "%s: %s lists %s, not %r. Fix: set model to the servers' --served-model-name, or wait for the "
                "host to finish loading it" % (self.name(), where, ", ".join(listed) or "no model", model)
            )

    def stream(self, model, prompt, max_tokens, clock=time.monotonic):
        """One streamed completion, greedy, ignore_eos: {start, first, end, chunks (the time of
        each chunk with text), usage_tokens, prompt_tokens, error (None when it succeeded)}."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        rec = dict(start=clock(), first=None, end=None, chunks=[], usage_tokens=None, prompt_tokens=None, error=None)
        conn = self.connection()
        try:
            rec["error"] = self._read(conn, body, rec, clock)
        except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, not a stream: a failed request
            rec["error"] = "%s: %s" % (type(exc).__name__, exc)
        finally:
            conn.close()
            rec["end"] = clock()
        if rec["error"] is None and tokens_of(rec) < max_tokens:
            rec["error"] = "fewer tokens than asked (ignore_eos)"
        return rec

    def _read(self, conn, body, rec, clock):
        """Reads the stream into rec; the error, or None."""
        conn.request("POST", self.prefix + "/v1/completions", body=json.dumps(body), headers=self.headers(True))
        resp = conn.getresponse()
        if resp.status != 200:
            return "HTTP %d" % resp.status
        while True:
            line = resp.readline()
            if not line:
                return "the stream broke off before [DONE]"
            if clock() - rec["start"] > self.timeout:
                return "longer than the timeout"
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return None
            doc = json.loads(payload.decode("utf-8"))
            if doc.get("error"):
                return "streamed an error"
            usage = doc.get("usage") or {}
            if usage.get("completion_tokens") is not None:
                rec["usage_tokens"] = int(usage["completion_tokens"])
                rec["prompt_tokens"] = usage.get("prompt_tokens")
            if any(c.get("text") for c in doc.get("choices") or []):
                now = clock()
                rec["first"] = now if rec["first"] is None else rec["first"]
                rec["chunks"].append(now)


# ----------------------------------------------------------------------------- side by side
def side_by_side(hosts, model, prompt, max_tokens, concurrency, requests=0, duration=0.0, clock=time.monotonic):
    """The same load on every host at the same time: `concurrency` streams in flight per host,
    for `requests` requests per host, or sent for `duration` seconds. Returns (start,
    {role: [record, ...]}), start the common start of the load."""
    go = threading.Event()
    t0 = {}
    records = dict((h.role, []) for h in hosts)
    sent = dict((h.role, 0) for h in hosts)
    lock = threading.Lock()

    def worker(host):
        go.wait()
        while True:
            with lock:
                index = sent[host.role]
                if (requests and index >= requests) or (not requests and clock() >= t0["start"] + duration):
                    return
                sent[host.role] += 1
            rec = host.stream(model, request_prompt(prompt, index), max_tokens, clock)
            with lock:
                records[host.role].append(rec)

    threads = [threading.Thread(target=worker, args=(h,)) for h in hosts for _slot in range(concurrency)]
    for thread in threads:
        thread.daemon = True
        thread.start()
    t0["start"] = clock()
    go.set()
    for thread in threads:
        thread.join()
    return t0["start"], records


def golden_check(hosts, p, prompts, max_tokens, k):
    """The golden record on the baseline and the compare on the canary, generated at the same
    time. Raises Failed when the baseline gives no record; a canary that gives none fails the
    verdict."""
    got = {}

    def run(host):
        params = dict(url=host.url, model=p["model"], api_key=p["api_key"], timeout=p["timeout"])
        params.update(validate_certs=p["validate_certs"], use_proxy=False, ca_path=p["ca_file"])
        try:
            got[host.role] = generate(params, prompts, max_tokens)
        except Failed as exc:
            got[host.role] = exc

    threads = [threading.Thread(target=run, args=(h,)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    base, canary = got["baseline"], got["canary"]
    if isinstance(base, Failed):
        raise Failed("the baseline gave no golden record: %s" % base)
    check_record(base, max_tokens)
    known = dict(tolerance={"min_agreeing_tokens": k}, prompts=prompts, max_tokens=max_tokens)
    if isinstance(canary, Failed):
        verdict = {"passed": False, "verdict": "the canary gave no golden outputs: %s" % canary}
        verdict.update(failing=[], divergences=[], **known)
        return verdict
    verdict = compare(base, canary, max_tokens, k, prompts)
    verdict.update(baseline_digest=digest(base), canary_digest=digest(canary), **known)
    return verdict


def measure(p, limits, clock=time.monotonic):
    """The whole measurement; returns the module's result. Raises Refused or Failed."""
    hosts = [
        Host(role, p["%s_url" % role], p["api_key"], p["timeout"], p["ca_file"], p["validate_certs"]) for role in HOSTS
    ]
    for host in hosts:
        host.ready(p["model"])
    prompts = list(p["golden_prompts"]) if p["golden_prompts"] is not None else list(DEFAULT_PROMPTS)
    k = int((p["golden_tolerance"] or {}).get("min_agreeing_tokens") or 0)
    verdict = golden_check(hosts, p, prompts, p["golden_max_tokens"], k)
    prompt = p["prompt"] or DEFAULT_PROMPT

    _started, single = side_by_side(hosts, p["model"], prompt, p["single_stream_tokens"], 1, requests=1, clock=clock)
    start, point = side_by_side(
        hosts, p["model"], prompt, p["osl"], p["concurrency"], p["point_requests"], p["point_duration"], clock
    )
    figures, series = {}, {}
    for host in hosts:
        one = single[host.role][0]
        rate = decode_rate(tokens_of(one), one["first"], one["chunks"][-1] if one["chunks"] else None)
        figures[host.role] = dict(
            single_stream_tok_s=round(rate, 2) if rate is not None and one["error"] is None else None,
            single_stream_error=one["error"],
            **point_figures(point[host.role], p["concurrency"]),
        )
        ends = [r["end"] for r in point[host.role]]
        series[host.role] = rate_series(chunk_events(point[host.role]), start, max(ends) if ends else None)
    figures["canary"]["outputs"] = verdict
    verdict_gate = gate(figures["baseline"], figures["canary"], limits)
    return dict(
        figures=figures,
        series=series,
        outputs=verdict,
        gate=verdict_gate,
        passed=verdict_gate["passed"],
        message=verdict_gate["message"],
        msg=verdict_gate["message"],
    )


def problems(p):
    """What is wrong with the arguments (before any request), as messages."""
    found = []
    for role in HOSTS:
        url = p["%s_url" % role]
        if not url.startswith(("http://", "https://")) or not urlsplit(url).netloc:
            found.append(
                "%s_url %r is not an http:// or https:// URL. Fix: the host's own server, for example "
                "http://10.0.0.2:8000" % (role, url)
            )
    if p["baseline_url"].rstrip("/") == p["canary_url"].rstrip("/"):
        found.append("baseline_url and canary_url are the same server: the gate compares two hosts")
    for key in ("single_stream_tokens", "concurrency", "osl", "golden_max_tokens"):
        if p[key] < 1:
            found.append("%s is %d; it must be 1 or more" % (key, p[key]))
    if p["single_stream_tokens"] == 1:
        found.append("single_stream_tokens is 1; a decode rate needs 2 or more")
    if p["point_requests"] < 0 or (not p["point_requests"] and p["point_duration"] <= 0):
        found.append("give point_requests > 0, or point_duration > 0 seconds")
    if p["timeout"] <= 0:
        found.append("timeout is %s; it must be positive" % p["timeout"])
    if p["golden_prompts"] is not None and (
        not p["golden_prompts"] or not all(str(x).strip() for x in p["golden_prompts"])
    ):
        found.append("golden_prompts is empty or holds an empty prompt. Fix: leave it out for the built-in set")
    k = (p["golden_tolerance"] or {}).get("min_agreeing_tokens") or 0
    if k < 0 or k > p["golden_max_tokens"]:
        found.append(
            "golden_tolerance.min_agreeing_tokens is %d; it must be between 0 (exact) and golden_max_tokens (%d)"
            % (k, p["golden_max_tokens"])
        )
    return found


def settings_of(p, limits):
    return {
        "baseline_url": p["baseline_url"],
        "canary_url": p["canary_url"],
        "model": p["model"],
        "single_stream_tokens": p["single_stream_tokens"],
        "concurrency": p["concurrency"],
        "point_requests": p["point_requests"] or None,
        "point_duration_s": None if p["point_requests"] else p["point_duration"],
        "osl": p["osl"],
        "golden_prompts": len(p["golden_prompts"]) if p["golden_prompts"] is not None else len(DEFAULT_PROMPTS),
        "golden_max_tokens": p["golden_max_tokens"],
        "golden_tolerance": {"min_agreeing_tokens": (p["golden_tolerance"] or {}).get("min_agreeing_tokens") or 0},
        "thresholds": limits,
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            baseline_url=dict(type="str", required=True),
            canary_url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            single_stream_tokens=dict(type="int", default=256, no_log=False),  # a count, not a secret
            concurrency=dict(type="int", default=32),
            point_requests=dict(type="int", default=0),
            point_duration=dict(type="float", default=60.0),
            prompt=dict(type="str"),
            osl=dict(type="int", default=256),
            timeout=dict(type="float", default=300.0),
            golden_prompts=dict(type="list", elements="str"),
            golden_max_tokens=dict(type="int", default=32, no_log=False),  # a count, not a secret
            golden_tolerance=dict(
                type="dict",
                default={},
                options=dict(min_agreeing_tokens=dict(type="int", default=0, no_log=False)),
            ),
            thresholds=dict(type="dict", default={}),
            ca_file=dict(type="path"),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False, measured=False, passed=None)
    try:
        limits = thresholds_of(p["thresholds"])
    except ValueError as exc:
        module.fail_json(msg="%s. Fix: the thresholds of module_utils/canary.py, with valid values" % exc, **result)
    result["settings"] = settings_of(p, limits)
    found = problems(p)
    if found:
        module.fail_json(msg="; ".join(found), **result)
    if module.check_mode:
        s = result["settings"]
        load = "%d requests" % s["point_requests"] if s["point_requests"] else "%g s" % s["point_duration_s"]
        module.exit_json(
            skipped=True,
            msg="check mode: would measure %s against %s side by side (%d golden prompts, a %d-token single stream, "
            "%d streams for %s of %d tokens each), nothing sent"
            % (
                s["canary_url"],
                s["baseline_url"],
                s["golden_prompts"],
                s["single_stream_tokens"],
                s["concurrency"],
                load,
                s["osl"],
            ),
            **result,
        )
    try:
        result.update(measure(p, limits))
    except (Refused, Failed) as exc:
        module.fail_json(msg=str(exc), **result)
    result["measured"] = True
    module.exit_json(**result)


if __name__ == "__main__":
    main()
