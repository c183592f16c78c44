# SPDX-License-Identifier: Apache-2.0
"""Scheduler and token pacing of the serving engine.

Continuous batching with chunked prefill, like vLLM v1: up to `max_num_seqs` sequences
run; the rest wait in FIFO order (vllm:num_requests_waiting). The engine advances in
steps with a token budget of `max_num_batched_tokens` (default 8192): every decoding
sequence gets one token, the rest of the budget prefills prompts (oldest first) and
admits waiting requests. A sequence's first token comes in the step that finishes its
prefill.

Step time (seconds), B = decoding sequences in the step, P = prompt tokens prefilled in it:

    step(B, P) = t1 + k * (B - 1) + p * P

    t1 = 1 / single_stream_tok_s                 one stream alone: 35 tok/s by default
    k  = (256 / peak_tok_s - t1) / 255            decode-only throughput at 256 seqs = peak
    p  = 1 / prefill_tok_s                        prompt tokens per second of prefill

Defaults (one P800 host at TP 8, calibrated on the measured figures with this scheduler):
single stream 35 tok/s; decode-only 4850 output tok/s at 256 running (the measured
steady-state peak); prefill 9700 prompt tok/s, which makes 512-in/512-out x 256 land at
~3200 output tok/s (measured 3201.71). Decode-only throughput at B running,
B / (t1 + k (B-1)): 1 -> 35, 16 -> 533, 64 -> 1852, 128 -> 3150, 256 -> 4850
(max_num_seqs caps B, so the aggregate saturates there). With prompts of 512 tokens:
16 streams ~505, 64 ~1550, 256 ~3200 output tok/s. 32768-in/256-out x 16 gives ~65
tok/s, prefill-bound (measured 84: the one figure this model undershoots).

The sampler (vllm/v1/sample/ops/topk_topp_sampler.py, or the platform plugin's that its
import hook puts in its place) picks each step's tokens from the stand-in model's logits
(Sequence.logits); one that runs on the host (`runs_on_host`) makes every step the `slow`
fault's default (below): the CPU-sampler profile, from engine start.

Environment (read once at start):
    KUNLUN_SIM_TOKENS_PER_SECOND          single-stream decode rate (default 35)
    KUNLUN_SIM_PEAK_TOKENS_PER_SECOND     decode-only aggregate at 256 running (4850)
    KUNLUN_SIM_PREFILL_TOKENS_PER_SECOND  prefill rate (9700)
    KUNLUN_SIM_KV_CACHE_TOKENS            KV cache capacity in tokens, for kv_cache_usage_perc
    KUNLUN_SIM_ENGINE_FAULT_FILE          the engine-fault file (below; /tmp/kunlun-sim-engine-fault)

Engine faults (switched at run time, for the gateway's engine watchdog; EngineFault): the
engine stats the fault file at most once a second, at a step's start, and reads it again
when its mtime, size or inode changed. Absent or empty (blank): normal. Its first line:

    stall                 the engine core hangs before its next step (as in a device call
                          or a collective): nothing is scheduled, no token, no admission,
                          no finish; the HTTP layer still accepts requests, which wait;
                          /health, /v1/models and /metrics answer; the scheduler's gauges
                          and the token and request counters stay at their last values
                          (vLLM sets them from the EngineCore's per-step stats).
    slow [SINGLE PEAK]    the sampler on the CPU: one stream alone decodes SINGLE tok/s and
                          the decode-only aggregate tends to PEAK tok/s at any batch size,
                          never above max(SINGLE, PEAK) (default 32 and 32: the notes'
                          measured figure). Step time t1 + k (B - 1) with t1 = 1/SINGLE and
                          k = 1/PEAK (PEAK below SINGLE counts as SINGLE): aggregate
                          B / (t1 + k (B - 1)) goes from SINGLE at B = 1 to PEAK as B grows
                          (k = t1 for PEAK == SINGLE: flat at PEAK). Prefill as normal.

Anything else: one warning naming the file and the accepted values, and normal running.
Removing the file (or emptying it) resumes: what waited goes on as normal.
"""

import asyncio
import collections
import hashlib
import logging
import os
import time

# vllm.logger's handler sits on the "vllm" logger (the server sets it up); only the standard
# library here: tools load this file on its own (kunlun_fleet/sim/artifacts/model.py).
logger = logging.getLogger("vllm.engine.pacing")

WORDS = (
    "the model answers with tokens from a fixed list of plain english words so that every "
    "reply is deterministic for a given prompt while still looking like ordinary text "
    "about servers accelerators memory bandwidth tensor parallel kernels batches queues "
    "latency throughput cache prefill decode weights layers attention linear state "
    "request response stream endpoint fleet host card driver image container service "
    "deploy rollout check verify measure report result value number figure time rate"
).split()


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError"""

    __module__ = "torch"


class Pacing:
    def __init__(self):
        single = max(env_float("KUNLUN_SIM_TOKENS_PER_SECOND", 35.0), 0.001)
        peak = max(env_float("KUNLUN_SIM_PEAK_TOKENS_PER_SECOND", 4850.0), 0.001)
        prefill = max(env_float("KUNLUN_SIM_PREFILL_TOKENS_PER_SECOND", 9700.0), 0.001)
        self.t1 = 1.0 / single
        self.k = max((256.0 / peak - self.t1) / 255.0, 0.0)
        self.p = 1.0 / prefill

    @classmethod
    def capped(cls, single: float, peak: float, prefill_s_per_token: float) -> "Pacing":
        """The `slow` fault's pacing: one stream SINGLE tok/s, the decode-only aggregate
        B / step(B) rising to PEAK tok/s as B grows (k = 1/PEAK), prefill unchanged."""
        pacing = cls.__new__(cls)
        pacing.t1 = 1.0 / single
        pacing.k = 1.0 / max(peak, single)
        pacing.p = prefill_s_per_token
        return pacing

    def step_time(self, running: int, prefill_tokens: int) -> float:
        return self.t1 + self.k * max(running - 1, 0) + self.p * prefill_tokens


DEFAULT_FAULT_FILE = "/tmp/kunlun-sim-engine-fault"
SLOW_TOKENS_PER_SECOND = 32.0  # the deployment notes: a sampler on the CPU held 32 tok/s
FAULT_VALUES = "'stall', 'slow' or 'slow SINGLE PEAK' (tok/s), empty or absent for normal"


class EngineFault:
    """The fault file, looked at no more than once a second (one stat; read when changed)."""

    def __init__(self, normal: Pacing):
        self.path = os.environ.get("KUNLUN_SIM_ENGINE_FAULT_FILE") or DEFAULT_FAULT_FILE
        self.normal = normal
        self.pacing = normal
        self.stalled = False
        self.next_check = 0.0
        self.signature = None

    def poll(self, now: float) -> None:
        """Call with a monotonic clock; checks the file when a second has passed."""
        if now < self.next_check:
            return
        self.next_check = now + 1.0
        try:
            st = os.stat(self.path)
            signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            signature = None
        if signature == self.signature:
            return
        self.signature = signature
        text = ""
        if signature is not None:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read(4096)
            except OSError:
                text = ""
        self.apply(text)

    def apply(self, text: str) -> None:
        words = text.strip().split("\n", 1)[0].split() if text.strip() else []
        stalled, pacing = False, self.normal
        if not words:
            pass
        elif words == ["stall"]:
            stalled = True
        elif words[0] == "slow" and len(words) in (1, 3):
            rates = [SLOW_TOKENS_PER_SECOND, SLOW_TOKENS_PER_SECOND]
            if len(words) == 3:
                try:
                    rates = [float(w) for w in words[1:]]
                except ValueError:
                    rates = None
            if rates is None or not all(0 < r < float("inf") for r in rates):
                self.warn(text)
            else:
                pacing = Pacing.capped(rates[0], rates[1], self.normal.p)
        else:
            self.warn(text)
        if (stalled, pacing) != (self.stalled, self.pacing):
            logger.debug("Engine fault from %s: %s", self.path, " ".join(words) or "none")
        self.stalled, self.pacing = stalled, pacing

    def warn(self, text: str) -> None:
        logger.warning(
            "Engine fault file %s holds %r: not a fault; accepted: %s. Running normally.",
            self.path,
            text.strip()[:200],
            FAULT_VALUES,
        )


class Sequence:
    """One generation: prompt length, limits, and where its tokens go."""

    def __init__(self, request_id, index, prompt_tokens, max_tokens, seed_text, out, ignore_eos=False, min_tokens=0):
        self.request_id = request_id
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.out = out  # asyncio.Queue of (index, text or None, finish_reason or None)
        digest = hashlib.sha256(seed_text.encode("utf-8", "replace")).digest()
        self.seed = int.from_bytes(digest[:8], "big")
        # Where the "model" would emit its end-of-sequence token.
        self.natural_length = None if ignore_eos else max(24 + self.seed % 377, min_tokens)
        self.path = self.seed  # what the model's next logits follow (logits)
        self.generated = 0
        self.prefill_left = max(int(prompt_tokens), 1)
        self.arrival = time.monotonic()
        self.scheduled = None
        self.first_token = None
        self.last_token = None
        self.finished = None
        self.aborted = False

    def next_word(self) -> str:
        return self.take(self.logits(), 0)

    def logits(self) -> list:
        """The stand-in model's next-token logits, [(word index, logit)], the most likely
        first: the word of this position along the sequence's path, then a runner-up (the
        first word of the top_logprobs alternatives that differs from it). The path is the
        prompt's seed while every token taken was the most likely one (so greedy decoding
        gives the same words for a prompt on every run); a token off it re-seeds the path,
        as a real model's continuation follows the token it was given."""
        base = self.path + self.generated * 2654435761
        top = base % len(WORDS)
        step = 1
        while WORDS[(base + step * 7919) % len(WORDS)] == WORDS[top] and step < 4 * len(WORDS):
            step += 1
        return [(top, 0.0), ((base + step * 7919) % len(WORDS), -0.125)]

    def take(self, logits: list, index: int) -> str:
        """The token sampled (`index` into `logits`) as the text piece it adds."""
        word = WORDS[logits[index][0]]
        if index != 0:
            digest = hashlib.sha256(f"{self.path}\x00{self.generated}\x00{word}".encode()).digest()
            self.path = int.from_bytes(digest[:8], "big")
        piece = (" " if self.generated else "") + word
        return piece


class Engine:
    def __init__(self, max_num_seqs: int, metrics, max_num_batched_tokens: int = 8192, sampler=None):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max(max_num_batched_tokens, max_num_seqs)
        if sampler is None:
            # Imported here, after the platform plugin was resolved: its import hook may map
            # this module to the plugin's sampler (vllm/v1/sample/ops/topk_topp_sampler.py).
            from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

            sampler = TopKTopPSampler()
        self.sampler = sampler
        normal = Pacing()
        if getattr(sampler, "runs_on_host", False):
            # The logits sampled by the CPU: every step paced as the `slow` fault's default.
            normal = Pacing.capped(SLOW_TOKENS_PER_SECOND, SLOW_TOKENS_PER_SECOND, normal.p)
        self.fault = EngineFault(normal)
        self.metrics = metrics
        self.running = []
        self.waiting = collections.deque()
        self.wake = asyncio.Event()
        self.kv_capacity = max(env_float("KUNLUN_SIM_KV_CACHE_TOKENS", 2_000_000), 1.0)
        # Device memory (vllm.engine.memory.MemoryModel, None: unlimited). Set by the
        # server from --gpu-memory-utilization, --mamba-ssm-cache-dtype, the TP size and
        # the model's config: when the running sequences' SSM state no longer fits next to
        # the KV cache, the engine dies like an XPU out-of-memory.
        self.memory = None
        self.dead = None

    def add(self, seq: Sequence) -> None:
        if self.add_dead_check(seq):
            return
        self.waiting.append(seq)
        self.wake.set()
        if not self.fault.stalled:  # a hung core sends no stats: the gauges keep their values
            self.metrics.set_queue(len(self.running), len(self.waiting))

    def abort(self, request_id: str) -> None:
        for seq in list(self.waiting) + self.running:
            if seq.request_id == request_id and seq.finished is None:
                seq.aborted = True

    def kv_usage(self) -> float:
        used = sum(s.prompt_tokens + s.generated for s in self.running)
        return min(used / self.kv_capacity, 1.0)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = None  # planned end of the current step (keeps the rate exact under load)
        while True:
            if not self.running and not self.waiting:
                deadline = None
                self.wake.clear()
                await self.wake.wait()
                continue
            self.fault.poll(loop.time())
            if self.fault.stalled:
                # Hung before the step: nothing scheduled, emitted or counted until the
                # file says otherwise (looked at once a second).
                deadline = None
                await asyncio.sleep(max(self.fault.next_check - loop.time(), 0.01))
                continue
            # Token budget of one step (chunked prefill): one token per decoding sequence,
            # the rest goes to prompts being prefilled, oldest first; new requests are
            # admitted while there are free sequence slots and budget left.
            budget = self.max_num_batched_tokens
            decoding = [s for s in self.running if s.prefill_left == 0 and not s.aborted]
            budget -= len(decoding)
            prefill = 0
            completing = []
            for seq in self.running:
                if seq.prefill_left > 0 and budget > 0 and not seq.aborted:
                    chunk = min(seq.prefill_left, budget)
                    seq.prefill_left -= chunk
                    budget -= chunk
                    prefill += chunk
                    if seq.prefill_left == 0:
                        completing.append(seq)
            while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
                seq = self.waiting.popleft()
                if seq.aborted:
                    self._finish(seq, "abort")
                    continue
                seq.scheduled = time.monotonic()
                chunk = min(seq.prefill_left, budget)
                seq.prefill_left -= chunk
                budget -= chunk
                prefill += chunk
                self.running.append(seq)
                if seq.prefill_left == 0:
                    completing.append(seq)
            self.metrics.set_queue(len(self.running), len(self.waiting), self.kv_usage())
            if self.memory is not None and len(self.running) > self.memory.max_running():
                self._die(OutOfMemoryError(self.memory.oom_message(len(self.running))))
                return
            if not self.running:
                continue
            start = loop.time()
            dt = self.fault.pacing.step_time(len(decoding), prefill)
            if deadline is None or deadline < start - dt:
                deadline = start
            deadline += dt
            await asyncio.sleep(max(deadline - loop.time(), 0.0))
            now = time.monotonic()
            self.metrics.iteration(len(decoding), prefill, loop.time() - start)
            still = []
            emitting = set(map(id, decoding)) | set(map(id, completing))
            # The sampler, once per step over the sequences that emit a token in it.
            batch = [s for s in self.running if id(s) in emitting and not s.aborted]
            inputs = [(s.logits(), s.generated) for s in batch]
            sampled = self.sampler.forward(inputs)
            picks = {id(s): (inputs[n][0], sampled[n]) for n, s in enumerate(batch)}
            for seq in self.running:
                if seq.aborted:
                    self._finish(seq, "abort")
                    continue
                if id(seq) not in emitting:
                    still.append(seq)
                    continue
                text = seq.take(*picks[id(seq)])
                seq.generated += 1
                self.metrics.new_token(seq)
                if seq.first_token is None:
                    seq.first_token = now
                else:
                    self.metrics.observe_itl(now - seq.last_token)
                seq.last_token = now
                reason = None
                if seq.natural_length is not None and seq.generated >= seq.natural_length:
                    reason = "stop"
                elif seq.max_tokens is not None and seq.generated >= seq.max_tokens:
                    reason = "length"
                seq.out.put_nowait((seq.index, text, reason))
                if reason:
                    self._finish(seq, reason, notify=False)
                else:
                    still.append(seq)
            self.running = still
            self.metrics.set_queue(len(self.running), len(self.waiting), self.kv_usage())

    def _die(self, exc: Exception) -> None:
        """Engine failure: every request in flight ends with an error."""
        self.dead = exc
        for seq in self.running + list(self.waiting):
            seq.finished = time.monotonic()
            seq.out.put_nowait((seq.index, None, "error"))
        self.running, self.waiting = [], collections.deque()
        self.metrics.set_queue(0, 0, 0.0)

    def add_dead_check(self, seq: Sequence) -> bool:
        if self.dead is None:
            return False
        seq.finished = time.monotonic()
        seq.out.put_nowait((seq.index, None, "error"))
        return True

    def _finish(self, seq: Sequence, reason: str, notify: bool = True) -> None:
        seq.finished = time.monotonic()
        if notify:
            seq.out.put_nowait((seq.index, None, reason))
        self.metrics.finished(seq, reason)
