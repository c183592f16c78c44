# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics with vLLM v1's names, labels and buckets (text exposition 0.0.4).

With KUNLUN_SIM_LOAD_FILE set (the sim's serving environment), the engine's load (running
and waiting requests, KV cache usage) is also written there, at most once a second and
when it falls idle: the sim kit's xpu-smi reads it from the process that holds the
devices, so device memory, utilisation, power and temperature move with the load."""

import json
import os
import time

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FINISH_REASONS = ("stop", "length", "abort", "error")


class Histogram:
    def __init__(self, name, doc, buckets):
        self.name, self.doc, self.buckets = name, doc, list(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value):
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def render(self, labels):
        out = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        for bound, count in zip(self.buckets, self.counts, strict=True):
            out.append(f'{self.name}_bucket{{{labels},le="{float(bound)}"}} {float(count)}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {float(self.total)}')
        out.append(f"{self.name}_count{{{labels}}} {float(self.total)}")
        out.append(f"{self.name}_sum{{{labels}}} {self.sum}")
        return out


class Metrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.created = time.time()
        self.running = 0
        self.waiting = 0
        self.kv = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.load_file = os.environ.get("KUNLUN_SIM_LOAD_FILE") or None
        self.load_written = (0.0, None)
        self.success = {r: 0 for r in FINISH_REASONS}
        self.h = {
            "ttft": Histogram(
                "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
            ),
            "itl": Histogram(
                "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
            ),
            "tpot": Histogram(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                ITL_BUCKETS,
            ),
            "e2e": Histogram(
                "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS
            ),
            "queue": Histogram(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                LATENCY_BUCKETS,
            ),
            "prefill": Histogram(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                LATENCY_BUCKETS,
            ),
            "decode": Histogram(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                LATENCY_BUCKETS,
            ),
            "req_prompt": Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS),
            "req_gen": Histogram(
                "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS
            ),
            "iter": Histogram(
                "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", TOKEN_BUCKETS
            ),
        }

    def set_queue(self, running, waiting, kv=None):
        self.running, self.waiting = running, waiting
        if kv is not None:
            self.kv = kv
        if self.load_file:
            self.write_load()

    def write_load(self):
        now, state = time.monotonic(), (self.running, self.waiting, round(self.kv, 3))
        last, written = self.load_written
        if state == written or (now - last < 1.0 and self.running):
            return
        tmp = "%s.%d" % (self.load_file, os.getpid())
        try:
            with open(tmp, "w") as fh:
                json.dump({"running": self.running, "waiting": self.waiting, "kv_usage": self.kv}, fh)
            os.replace(tmp, self.load_file)
            self.load_written = (now, state)
        except OSError:
            pass

    def iteration(self, running, prefill, seconds):
        self.h["iter"].observe(running + prefill)

    def observe_itl(self, seconds):
        self.h["itl"].observe(seconds)

    def new_token(self, seq):
        """vLLM v1 counts tokens per engine step (IterationStats): every generated token,
        and a prompt's tokens when its first token comes; an aborted request's tokens count."""
        self.generation_tokens += 1
        if seq.generated == 1:
            self.prompt_tokens += seq.prompt_tokens

    def finished(self, seq, reason):
        if reason == "abort":
            self.success["abort"] += 0  # aborted requests are not successes
            return
        self.success[reason] = self.success.get(reason, 0) + 1
        self.h["req_prompt"].observe(seq.prompt_tokens)
        self.h["req_gen"].observe(seq.generated)
        end = seq.finished
        if seq.first_token is not None:
            self.h["ttft"].observe(seq.first_token - seq.arrival)
            if seq.generated > 1:
                self.h["tpot"].observe((end - seq.first_token) / (seq.generated - 1))
            self.h["prefill"].observe(seq.first_token - (seq.scheduled or seq.arrival))
            self.h["decode"].observe(end - seq.first_token)
        self.h["e2e"].observe(end - seq.arrival)
        self.h["queue"].observe((seq.scheduled or end) - seq.arrival)

    def render(self) -> str:
        labels = f'model_name="{self.model_name}",engine="0"'
        out = []

        def gauge(name, doc, value):
            out.extend([f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)}"])

        def counter(name, doc, value, extra=None):
            out.extend([f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter"])
            rows = extra if extra is not None else [("", value)]
            for lab, val in rows:
                out.append(f"{name}_total{{{labels}{lab}}} {float(val)}")
            out.extend([f"# HELP {name}_created {doc}", f"# TYPE {name}_created gauge"])
            for lab, _ in rows:
                out.append(f"{name}_created{{{labels}{lab}}} {self.created}")

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", self.running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting)
        gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            1,
        )
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv)
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_queries,
        )
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", self.prefix_hits)
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", self.preemptions)
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        counter("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens)
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            None,
            [(f',finished_reason="{r}"', n) for r, n in self.success.items()],
        )
        for key in ("req_prompt", "req_gen", "iter", "ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode"):
            out.extend(self.h[key].render(labels))
        return "\n".join(out) + "\n"
