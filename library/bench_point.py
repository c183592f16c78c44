#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bench_point
short_description: One load point against an OpenAI-compatible endpoint with aiperf, read against the servers'
  own counters
description:
  - Runs the load generator aiperf once (I(aiperf), from the bench's own venv) against I(url) - streamed
    C(/v1/completions), I(concurrency) requests in flight, synthetic prompts of I(isl) tokens made with the
    model's tokenizer (I(tokenizer), a local directory, read offline) and I(osl) output tokens each
    (C(ignore_eos)), for I(requests) requests or I(duration) seconds.
  - Every request asks for the usage chunk (C(stream_options.include_usage)); output tokens are each
    response's usage, as vllm bench serve counts them.
  - Before and after the point it reads every server's own counters (C(vllm:generation_tokens_total),
    C(vllm:request_success_total), C(vllm:prompt_tokens_total)) from each I(metrics) URL, and compares the
    responses' usage (output and prompt tokens, summed) with the counters' deltas - two separate counts in the
    server. A point where they differ by more than I(tolerance_pct) percent, where a completed response
    carried no usage, or where a server's counters could not be read, is returned with C(valid) false and the
    reason; it is never dropped.
  - The client's own count of the text received (aiperf's tokenizer, I(retokenize)) is returned beside the
    usage and never decides validity - text decoded from the token ids a model sampled does not re-tokenize to
    the same count (25-60 % more against a real vLLM 0.15.1).
  - Returns the figures with vllm bench serve's definitions (TTFT, TPOT = (latency - TTFT) / (tokens - 1),
    ITL, output tok/s over the benchmark duration), the failed requests and their errors, and the load
    generator's own CPU and the machine's, flagged C(client_bound) when the client machine was saturated.
  - Requests that fail (a host down, errors, timeouts) are counted, not fatal; the point always ends within
    I(timeout) plus the duration and a margin (aiperf runs under C(timeout)), so nothing hangs.
  - Raises the open-files soft limit to the hard limit for the load generator when I(concurrency) needs it;
    fails before any load when even the hard limit is too low, with the fix.
  - The API key reaches aiperf through its environment (never a command line or a file); aiperf redacts it in
    its exports. Runs on the controller (C(delegate_to localhost)). Standard library only.
options:
  aiperf:
    description: The C(aiperf) executable (in the bench venv).
    type: path
    required: true
  url:
    description: Base URL of the endpoint, without C(/v1) (the gateway, or one host's server).
    type: str
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  tokenizer:
    description:
      Directory with the model's tokenizer files (C(tokenizer.json), C(tokenizer_config.json), C(config.json)).
    type: path
    required: true
  api_key:
    description: The fleet's API key. Omit for a server without one.
    type: str
  concurrency:
    description: Requests kept in flight.
    type: int
    required: true
  requests:
    description: Requests to send. 0 - run for I(duration) seconds instead.
    type: int
    default: 0
  duration:
    description: Seconds to send requests for (when I(requests) is 0); every request sent in that time is waited for.
    type: float
    default: 60
  isl:
    description: Prompt tokens per request.
    type: int
    default: 512
  osl:
    description: Output tokens per request.
    type: int
    default: 512
  corpus:
    description:
      - Where the prompts' tokens come from. C(random) - drawn from the tokenizer's vocabulary, as
        C(vllm bench serve --dataset-name random) makes them (no shared prefixes, so the prefix cache does
        not flatter the figures). C(sonnet) or C(coding) - aiperf's prose or code text.
    type: str
    choices: [random, sonnet, coding]
    default: random
  timeout:
    description: Seconds one request may take before it counts as failed.
    type: float
    default: 600
  workers:
    description: aiperf worker processes (at most I(concurrency)). Keep it at or below the controller's cores.
    type: int
    default: 2
  metrics:
    description: The servers whose counters are read before and after, each C(host) and C(url) (its C(/metrics)).
    type: list
    elements: dict
    default: []
  ca_file:
    description:
      - A CA certificate file (PEM) on the controller that verifies C(https) servers besides the system's trust store
        (the fleet CA's, for the workers) - for aiperf (a bundle of the system's certificates and this one, its
        C(SSL_CERT_FILE)) and for the counters' reads. Omitted or empty - the system's trust store only.
    type: path
  metrics_timeout:
    description: Seconds to read one server's counters.
    type: float
    default: 10
  tolerance_pct:
    description:
      - Largest difference, in percent, between the responses' usage and the servers' counters (output tokens,
        and prompt tokens) of a valid point.
      - With the bench the only client, vLLM's counters and usage agree exactly; the counters are the whole
        server's, so a little other traffic during the point is tolerated.
    type: float
    default: 3.0
  retokenize:
    description:
      - aiperf also counts the output text with the model's tokenizer (returned as C(retokenized_output_tokens),
        never gating).
      - False - aiperf runs with C(use_server_token_count) and skips that count (less CPU on the load
        generator; its own exports then count the usage).
    type: bool
    default: true
  fd_headroom:
    description: Open files the load generator needs besides one per concurrent stream.
    type: int
    default: 1024
  artifact_dir:
    description: Where aiperf writes this point's exports (made when missing).
    type: path
    required: true
  label:
    description: The point's name in the results.
    type: str
    default: point
  extra:
    description: Fields returned with the figures as they are (kind, target, ...).
    type: dict
    default: {}
notes:
  - Check mode - measures nothing, reads nothing, and says so.
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: 256 concurrent streams through the gateway for 60 s
  bench_point:
    aiperf: "{{ bench_venv }}/bin/aiperf"
    url: http://10.0.0.5:8080
    model: Qwen3.8-27B-INT8-W8A8-Dynamic
    tokenizer: /srv/bundle/models/Qwen3.8-27B-W8A8-INT8-Dynamic
    api_key: "{{ vault_kunlun_api_key }}"
    concurrency: 256
    duration: 60
    metrics:
      - {host: p800-a01, url: "https://10.0.0.11:8000/metrics"}
      - {host: p800-a02, url: "https://10.0.0.12:8000/metrics"}
    ca_file: inventories/site-a/.image-registry-pki/ca.crt
    artifact_dir: reports/bench-20260101T000000Z/points/fleet-c256
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
label:
  description: The point's name.
  returned: always
  type: str
measured:
  description: False in check mode (nothing was measured).
  returned: always
  type: bool
client:
  description: >-
    The client's figures - requests, completed, failed, errors (message to count), duration_s, output_tokens
    (the figures' count - each response's usage, the client's count for one without), usage_output_tokens and
    usage_prompt_tokens (the responses' usage fields, summed), responses_without_usage,
    retokenized_output_tokens (aiperf's tokenizer on the text received; null when not counted),
    input_tokens, output_tok_s, requests_per_s, decode_tok_s, and ttft_ms / tpot_ms / itl_ms / latency_ms each
    with mean, p50, p90, p99.
  returned: success
  type: dict
servers:
  description:
    Per server - the counter deltas over the point (generation_tokens, prompt_tokens, completed) or the error
    reading them.
  returned: success
  type: dict
server_output_tokens:
  description: The servers' generation tokens over the point, summed; null when any server could not be read.
  returned: success
  type: int
server_prompt_tokens:
  description: The servers' prompt tokens over the point, summed; null when any server could not be read.
  returned: success
  type: int
valid:
  description: >-
    Every completed response carried usage, and the responses' usage agrees with the servers' counters within
    tolerance_pct, for output and for prompt tokens.
  returned: success
  type: bool
diff_pct:
  description: (usage - counters) / counters output tokens, in percent.
  returned: success
  type: float
prompt_diff_pct:
  description: (usage - counters) / counters prompt tokens, in percent.
  returned: success
  type: float
retokenized_diff_pct:
  description: (re-tokenized - usage) / usage output tokens, in percent; shown, never gating.
  returned: success
  type: float
validity:
  description: Why the point is valid or not.
  returned: success
  type: str
load_generator:
  description: cpu_s, wall_s, cores_used, cpu_count, machine_busy_pct, client_bound and a note.
  returned: success
  type: dict
aiperf_rc:
  description: aiperf's exit status (non-zero when every request failed, or when it was stopped at the timeout).
  returned: success
  type: int
aiperf_tail:
  description: The last lines aiperf printed when it exited non-zero.
  returned: success
  type: list
  elements: str
settings:
  description: The point's settings (url, concurrency, requests, duration, isl, osl, workers).
  returned: always
  type: dict
"""

import json
import os
import resource
import shutil
import ssl
import tempfile
import time

import urllib.request as urllib_request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bench_results import (
    API_KEY_ENV,
    aiperf_config,
    client_load,
    counter_delta,
    counters,
    cpu_times,
    fd_plan,
    read_records,
    summarize,
    validity,
)

# aiperf's start-up (services, tokenizer, prompts) and shutdown, beyond the point itself.
STARTUP_MARGIN_S = 180
# How long aiperf's processes may take to start and register with its controller (its own
# defaults are 30 s: AIPERF_SERVICE_START_TIMEOUT, AIPERF_SERVICE_REGISTRATION_TIMEOUT);
# inside STARTUP_MARGIN_S.
SERVICE_START_TIMEOUT_S = 120


def tls_context(ca_file):
    """The context https servers are verified with: the system's trust store, and ca_file."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def trust_bundle(ca_file, directory):
    """A PEM file in `directory` holding the system's default CA file and ca_file, for a
    process told to trust both through SSL_CERT_FILE (which replaces the default file)."""
    path = os.path.join(directory, "trust.pem")
    system = ssl.get_default_verify_paths().openssl_cafile
    with open(path, "wb") as out:
        for source in (system, ca_file):
            if source and os.path.isfile(source):
                with open(source, "rb") as fh:
                    out.write(fh.read().rstrip(b"\n") + b"\n")
    return path


def read_counters(url, timeout, context=None):
    opener = urllib_request.build_opener(
        urllib_request.ProxyHandler({}), urllib_request.HTTPSHandler(context=context or tls_context(None))
    )
    with opener.open(url, timeout=timeout) as resp:
        return counters(resp.read().decode("utf-8", "replace"))


def snapshot(targets, timeout, context=None):
    out = {}
    for t in targets:
        try:
            out[t["host"]] = read_counters(t["url"], timeout, context)
        except Exception as exc:  # unreachable, refused, bad answer: recorded per host
            out[t["host"]] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    return out


def raise_fd_limit(module, concurrency, headroom):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed, action, message = fd_plan(concurrency, headroom, soft, hard)
    if action == "refuse":
        module.fail_json(msg=message, fd_soft=soft, fd_hard=hard, fd_needed=needed)
    if action == "raise":
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
    return {"soft": soft, "hard": hard, "needed": needed, "action": action, "message": message}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            aiperf=dict(type="path", required=True),
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            tokenizer=dict(type="path", required=True),
            api_key=dict(type="str", no_log=True),
            concurrency=dict(type="int", required=True),
            requests=dict(type="int", default=0),
            duration=dict(type="float", default=60.0),
            isl=dict(type="int", default=512),
            corpus=dict(type="str", default="random", choices=["random", "sonnet", "coding"]),
            osl=dict(type="int", default=512),
            timeout=dict(type="float", default=600.0),
            workers=dict(type="int", default=2),
            metrics=dict(type="list", elements="dict", default=[]),
            metrics_timeout=dict(type="float", default=10.0),
            ca_file=dict(type="path"),
            tolerance_pct=dict(type="float", default=3.0),
            retokenize=dict(type="bool", default=True),
            fd_headroom=dict(type="int", default=1024),
            artifact_dir=dict(type="path", required=True),
            label=dict(type="str", default="point"),
            extra=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    settings = {
        "url": p["url"],
        "concurrency": p["concurrency"],
        "requests": p["requests"],
        "duration_s": p["duration"] if not p["requests"] else None,
        "isl": p["isl"],
        "osl": p["osl"],
        "workers": max(1, min(p["workers"], p["concurrency"])),
        "timeout_s": p["timeout"],
        "output_token_count": "usage" + (", re-tokenized beside" if p["retokenize"] else ""),
    }
    result = dict(changed=False, label=p["label"], settings=settings, measured=False)
    result.update(p["extra"])
    if module.check_mode:
        module.exit_json(
            msg="check mode: bench point %s measures nothing (no load, no counters read)" % p["label"], **result
        )
    if p["concurrency"] < 1:
        module.fail_json(msg="concurrency must be at least 1, got %d" % p["concurrency"], **result)
    if p["requests"] < 0 or (not p["requests"] and p["duration"] <= 0):
        module.fail_json(msg="give requests > 0, or duration > 0 seconds", **result)
    if not os.access(p["aiperf"], os.X_OK):
        module.fail_json(
            msg="no aiperf at %s. Fix: make bench-setup (or run the bench role with "
            "bench_install_venv: true), which installs requirements-bench.txt" % p["aiperf"],
            **result,
        )
    if not os.path.isfile(os.path.join(p["tokenizer"], "tokenizer.json")):
        module.fail_json(
            msg="no tokenizer.json in %s: the load generator needs the model's tokenizer on the "
            "controller. Fix: set bench_tokenizer to a directory with the model's tokenizer "
            "files" % p["tokenizer"],
            **result,
        )
    timeout_bin = module.get_bin_path("timeout", required=True)
    limits = raise_fd_limit(module, p["concurrency"], p["fd_headroom"])

    art = os.path.abspath(p["artifact_dir"])
    if not os.path.isdir(art):
        os.makedirs(art)
    cfg = aiperf_config(
        p["url"].rstrip("/"),
        p["model"],
        p["tokenizer"],
        p["concurrency"],
        p["isl"],
        p["osl"],
        art,
        requests=p["requests"],
        duration=p["duration"],
        grace=p["timeout"],
        timeout=p["timeout"],
        workers=p["workers"],
        api_key=bool(p["api_key"]),
        corpus=p["corpus"],
        retokenize=p["retokenize"],
    )
    cfg_path = os.path.join(art, "aiperf-config.yaml")
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=1)
    # Every request sent is waited for (grace = the request timeout): the responses' usage
    # then covers every token the servers count.
    budget = (p["duration"] if not p["requests"] else 0) + 2 * p["timeout"] + STARTUP_MARGIN_S
    scratch = tempfile.mkdtemp(prefix="kf-aiperf-")
    env = {
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "COLUMNS": "160",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # aiperf leaves its shared-memory directories in the temporary directory: a short
        # one of its own (its IPC socket paths must stay short), removed after the point.
        "TMPDIR": scratch,
        "AIPERF_DATASET_MMAP_BASE_PATH": scratch,
        # aiperf gives its own processes 30 s to start and to register with its controller,
        # then gives up before any request ("Some services failed to register within
        # timeout"). On a busy controller (the run's own forks beside it; 2 cores) its starts
        # took longer (CI 2026-12-04, bench-local): the point then measured nothing. The
        # point's budget (STARTUP_MARGIN_S) holds the longer wait.
        "AIPERF_SERVICE_START_TIMEOUT": str(SERVICE_START_TIMEOUT_S),
        "AIPERF_SERVICE_REGISTRATION_TIMEOUT": str(SERVICE_START_TIMEOUT_S),
    }
    if p["api_key"]:
        env[API_KEY_ENV] = p["api_key"]
    # aiperf verifies https servers with Python's default context (aiohttp), whose only
    # option is SSL_CERT_FILE: the system's certificates and the fleet CA's, in one file.
    if p["ca_file"]:
        env["SSL_CERT_FILE"] = trust_bundle(p["ca_file"], scratch)
    context = tls_context(p["ca_file"])

    before = snapshot(p["metrics"], p["metrics_timeout"], context)
    machine0, usage0, t0 = cpu_times(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    try:
        rc, out, err = module.run_command(
            [timeout_bin, "--kill-after=30", str(int(budget)), p["aiperf"], "profile", "--config", cfg_path],
            environ_update=env,
            cwd=art,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.time() - t0
    usage1, machine1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
    after = snapshot(p["metrics"], p["metrics_timeout"], context)
    with open(os.path.join(art, "aiperf-console.txt"), "w") as fh:
        fh.write(out)
        fh.write(err)

    client = summarize(read_records(os.path.join(art, "profile_export.jsonl")), retokenized=p["retokenize"])
    servers, total, prompt_total, unreadable = {}, 0, 0, []
    for t in p["metrics"]:
        b, a = before.get(t["host"], {}), after.get(t["host"], {})
        if "error" in b or "error" in a:
            servers[t["host"]] = {"error": a.get("error") or b.get("error")}
            unreadable.append(t["host"])
            continue
        delta = counter_delta(b, a)
        servers[t["host"]] = delta
        if delta["generation_tokens"] is None:
            unreadable.append(t["host"])
        else:
            total += delta["generation_tokens"]
            prompt_total = (
                None
                if prompt_total is None or delta["prompt_tokens"] is None
                else (prompt_total + delta["prompt_tokens"])
            )
    server_tokens = None if unreadable or not p["metrics"] else total
    server_prompt = None if server_tokens is None else prompt_total
    check = validity(client, server_tokens, server_prompt, p["tolerance_pct"])
    why = check["validity"]
    if unreadable:
        why = "the counters of %s could not be read before and after the point (%s)" % (
            ", ".join(unreadable),
            "; ".join("%s: %s" % (h, servers[h].get("error", "counter reset")) for h in unreadable),
        )
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    load = client_load(cpu, wall, os.cpu_count() or 1, machine0, machine1)
    tail = []
    if rc != 0:
        tail = [line for line in (out + "\n" + err).splitlines() if line.strip()][-15:]
        if rc in (124, 137):
            tail.append("aiperf was stopped after %d s (the point's time budget)" % int(budget))
    result.update(
        measured=True,
        client=client,
        servers=servers,
        server_output_tokens=server_tokens,
        server_prompt_tokens=server_prompt,
        valid=check["valid"],
        validity=why,
        **dict(
            (k, None if check[k] is None else round(check[k], 3))
            for k in ("diff_pct", "prompt_diff_pct", "retokenized_diff_pct")
        ),
    )
    result.update(load_generator=load, aiperf_rc=rc, aiperf_tail=tail, fd_limit=limits, artifact_dir=art)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
