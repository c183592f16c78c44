# SPDX-License-Identifier: Apache-2.0
"""vLLM's OpenAI-compatible API server (`python -m vllm.entrypoints.openai.api_server`).

Standard library only: an asyncio HTTP/1.1 server with the endpoints, authentication,
error formats and log lines of vllm 0.15.1, in front of the engine in
`vllm.engine.pacing` (continuous batching, queueing beyond --max-num-seqs, token pacing).

Start-up follows vllm: parse and validate the arguments, bind the socket (not yet
listening, so clients get "connection refused" while the model loads), resolve the model
(local directory or hub id; HF_HUB_OFFLINE=1 is honoured), check config.json against the
arguments, check the visible devices against the parallel size, load the weights
(KUNLUN_SIM_LOAD_SECONDS, default 20), then listen and serve.
"""

import asyncio
import email.utils
import os
import signal
import socket
import time
import uuid

from vllm.engine import model_check
from vllm.engine.memory import MemoryModel
from vllm.engine.metrics import Metrics
from vllm.engine.pacing import WORDS, Engine, Sequence, env_float
from vllm.entrypoints.errors import (
    HTTPError,
    VLLMValidationError,
    dumps,
    error_body,
    invalid,
    request_invalid,
)
from vllm.entrypoints.openai.cli_args import (
    DEFAULTS,
    FlexibleArgumentParser,
    make_arg_parser,
    validate_api_server_args,
    validate_parsed_serve_args,
)
from vllm.entrypoints.routes import LOGGED_ROUTES, ServeRoutes
from vllm.entrypoints.ssl import SSLCertRefresher, server_ssl_context
from vllm.logger import decorate_logs, init_logger, uvicorn_log
from vllm.platforms import current_platform
from vllm.version import __version__ as VLLM_VERSION

logger = init_logger("vllm.entrypoints.openai.api_server")

REASONS = {
    200: "OK",
    307: "Temporary Redirect",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
# What the launcher logs as the available routes; the route table is vllm.entrypoints.routes'.
ROUTES = LOGGED_ROUTES


# vllm 0.15.1's ModelConfig.max_logprobs default (config/model.py), --max-logprobs unset.
MAX_LOGPROBS = 20


def sampled_logprob(seed: int, position: int) -> float:
    """The stand-in's log-probability of the token it generates at `position`: a value in
    [-4.0, -0.001], fixed by the sequence's seed (its prompt) and the position, so that a
    greedy answer is the same, logprobs included, on every run."""
    h = ((seed ^ (position * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    h ^= h >> 31
    return -(1 + h % 3999) / 1000.0


def alternatives(seed: int, position: int, piece: str, count: int):
    """`count` other pieces (words of the vocabulary the engine says, with the position's
    leading space) for the top_logprobs after the sampled one, each less likely."""
    lead = " " if position else ""
    out, step = [], 1
    while len(out) < count and step <= 4 * len(WORDS):
        alt = lead + WORDS[(seed + position * 2654435761 + step * 7919) % len(WORDS)]
        step += 1
        if alt != piece and alt not in out:
            out.append(alt)
    return out


class Connection:
    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.head_only = False  # the request is a HEAD: headers only

    def _head(self, status, headers):
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}",
            f"date: {email.utils.formatdate(usegmt=True)}",
            "server: uvicorn",
        ]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, status, body: bytes, content_type="application/json", extra=()):
        # content_type None: none sent (Starlette's Response without a media type).
        headers = [("content-length", str(len(body)))] + ([("content-type", content_type)] if content_type else [])
        self.writer.write(self._head(status, headers + list(extra)) + (b"" if self.head_only else body))
        await self.writer.drain()

    async def start_stream(self, content_type="text/event-stream; charset=utf-8"):
        self.writer.write(self._head(200, [("content-type", content_type), ("transfer-encoding", "chunked")]))
        await self.writer.drain()

    async def chunk(self, data: bytes):
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def end_stream(self):
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()


class Server(ServeRoutes):
    def __init__(self, args, model_dir, config, max_model_len, tokenizer):
        self.args = args
        self.model_dir = model_dir
        self.config = config
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        names = args.served_model_name or [args.model]
        self.served_names = list(names)
        self.metrics = Metrics(self.served_names[0])
        self.engine = Engine(args.max_num_seqs or 256, self.metrics, args.max_num_batched_tokens or 8192)
        self.engine.memory = MemoryModel(args, config)
        keys = args.api_key or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else None)
        self.api_keys = set(keys) if keys else None
        self.created = int(time.time())
        self.stats = {"prompt": 0, "gen": 0, "t": time.monotonic()}
        self.init_routes()

    # ---------------------------------------------------------------- connection loop
    async def handle(self, reader, writer):
        conn = Connection(reader, writer)
        peer = writer.get_extra_info("peername") or ("-", 0)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
                except ValueError:
                    await conn.send(400, b"Invalid HTTP request received.", "text/plain; charset=utf-8")
                    break
                headers = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = h.decode("latin-1").partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            await reader.readline()
                            break
                        body += await reader.readexactly(size)
                        await reader.readline()
                status = await self.dispatch(conn, method.upper(), target, headers, body)
                if not self.args.disable_uvicorn_access_log:
                    uvicorn_log(
                        "INFO",
                        f'{peer[0]}:{peer[1]} - "{method} {target} {version}" {status} {REASONS.get(status, "OK")}',
                    )
                if version != "HTTP/1.1" or headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # pragma: no cover
                pass

    def models(self):
        data = []
        for name in self.served_names:
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": self.args.model,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex}",
                            "object": "model_permission",
                            "created": self.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            )
        return {"object": "list", "data": data}

    # ---------------------------------------------------------------- generation
    def _check_request(self, request, chat):
        logprobs = request.get("logprobs")
        if not chat and isinstance(logprobs, int) and logprobs < 0:
            # CompletionRequest.check_logprobs (entrypoints/openai/completion/protocol.py), a
            # model validator: FastAPI's validation error, whose param the handler takes
            # from the VLLMValidationError (api_server.py, validation_exception_handler).
            why = "`logprobs` must be a positive value."
            body = request_invalid(
                "value_error",
                ("body",),
                "Value error, %s (parameter=logprobs, value=%s)" % (why, logprobs),
                request,
                {"error": VLLMValidationError(why)},
            )
            body["error"]["param"] = "logprobs"
            raise HTTPError(400, body)
        model = request.get("model")
        if model is not None and model not in self.served_names:
            raise HTTPError(404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"))
        if chat:
            messages = request.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HTTPError(400, request_invalid("missing", ("body", "messages"), "Field required", request))
            prompts = [self.tokenizer.chat(messages)]
            tools = request.get("tools")
            choice = request.get("tool_choice", "auto" if tools else "none")
            if tools and choice == "auto" and not (self.args.enable_auto_tool_choice and self.args.tool_call_parser):
                raise HTTPError(
                    400,
                    error_body(
                        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
                    ),
                )
            max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
        else:
            prompt = request.get("prompt")
            if prompt is None or prompt == "":
                # CompletionRequest's validator (entrypoints/openai/completion/protocol.py).
                why = "Either prompt or prompt_embeds must be provided and non-empty."
                raise HTTPError(
                    400,
                    request_invalid(
                        "value_error", ("body",), "Value error, " + why, request, {"error": ValueError(why)}
                    ),
                )
            if isinstance(prompt, str):
                prompts = [prompt]
            elif isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
                prompts = [prompt]
            elif isinstance(prompt, list) and prompt:
                prompts = prompt
            else:
                raise HTTPError(400, error_body("Prompt cannot be empty"))
            max_tokens = request.get("max_tokens", 16)
            # OpenAIServingCompletion._build_render_config, before the prompt is read.
            if isinstance(max_tokens, int) and max_tokens > self.max_model_len:
                raise HTTPError(
                    400,
                    invalid(
                        f"'max_tokens' ({max_tokens}) cannot be greater than the model's maximum context "
                        f"length ({self.max_model_len}).",
                        "max_tokens",
                        max_tokens,
                    ),
                )
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise HTTPError(
                400, invalid("max_tokens must be at least 1, got %s." % max_tokens, "max_tokens", max_tokens)
            )
        n = request.get("n") or 1
        if not isinstance(n, int) or n < 1:
            raise HTTPError(400, error_body("n must be at least 1, got %s." % n))
        return prompts, max_tokens, n

    def _count(self, prompt) -> int:
        if isinstance(prompt, list):
            return len(prompt)
        return max(self.tokenizer.count(prompt), 1)

    async def generate(self, conn, request, chat) -> int:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        model = request.get("model") or self.served_names[0]
        created = int(time.time())
        seqs, queue, logprobs = await self.admit(request, chat, rid)
        stream = bool(request.get("stream"))
        include_usage, continuous = self.stream_usage(request.get("stream_options"))
        try:
            if stream:
                return await self._stream(
                    conn, seqs, queue, rid, model, created, chat, include_usage, continuous, logprobs
                )
            return await self._complete(conn, seqs, queue, rid, model, created, chat, logprobs)
        finally:
            self.release(seqs)

    async def admit(self, request, chat, rid):
        """A completion or chat request checked, its sequences made and added to the engine
        (once a /pause is lifted, as AsyncLLM.add_request waits): (seqs, their queue, the
        logprobs asked for). The caller release()s them when it has answered."""
        prompts, max_tokens, n = self._check_request(request, chat)
        queue = asyncio.Queue()
        seqs = []
        for p_index, prompt in enumerate(prompts):
            count = self._count(prompt)
            # Completions: the renderer's _create_tokens_prompt allows the context less
            # max_tokens (entrypoints/renderer.py); chat: OpenAIServing._validate_input
            # (entrypoints/openai/engine/serving.py), the prompt, then prompt + max_tokens.
            room = self.max_model_len if chat else self.max_model_len - (max_tokens or 0)
            if (count >= room) if chat else (count > room):
                raise HTTPError(
                    400,
                    invalid(
                        f"This model's maximum context length is {room} tokens. "
                        f"However, your request has {count} input tokens. Please reduce the "
                        "length of the input messages.",
                        "input_tokens",
                        count,
                    ),
                )
            limit = max_tokens
            if limit is None:
                limit = self.max_model_len - count
            elif count + limit > self.max_model_len:
                raise HTTPError(
                    400,
                    invalid(
                        f"'max_tokens' or 'max_completion_tokens' is too large: {limit}. This "
                        f"model's maximum context length is {self.max_model_len} tokens and your "
                        f"request has {count} input tokens ({limit} > {self.max_model_len} - {count}).",
                        "max_tokens",
                        limit,
                    ),
                )
            for j in range(n):
                text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
                seqs.append(
                    Sequence(
                        rid,
                        p_index * n + j,
                        count,
                        limit,
                        f"{text}\x00{j}\x00{request.get('seed', '')}",
                        queue,
                        ignore_eos=bool(request.get("ignore_eos")),
                        min_tokens=int(request.get("min_tokens") or 0),
                    )
                )
                seqs[-1].first_of_prompt = j == 0
        logprobs = self.logprobs_of(request, chat)
        await self.wait_unpaused()
        for seq in seqs:
            self.engine.add(seq)
        if self.args.enable_log_requests:
            logger.info("Added request %s.", rid)
        return seqs, queue, logprobs

    def release(self, seqs):
        """A request's sequences the client no longer waits for: aborted."""
        for seq in seqs:
            if seq.finished is None:
                seq.aborted = True
                if seq in self.engine.waiting:
                    self.engine.waiting.remove(seq)
                    self.engine._finish(seq, "abort", notify=False)

    def logprobs_of(self, request, chat):
        """A completion's token-level output: None (no `logprobs` asked), or (the number
        of top log-probabilities, tokens as "token_id:N"). Refuses more than --max-logprobs
        (20 by default) as vllm 0.15.1's InputProcessor._validate_logprobs does
        (v1/engine/input_processor.py), after the prompt's checks. Chat's logprobs are not
        reproduced (null)."""
        num = request.get("logprobs")
        if chat or not isinstance(num, int) or isinstance(num, bool):
            return None
        limit = self.args.max_logprobs if self.args.max_logprobs is not None else MAX_LOGPROBS
        if limit != -1 and num > limit:
            raise HTTPError(
                400,
                invalid(
                    "Requested sample logprobs of %d, which is greater than max allowed: %d" % (num, limit),
                    "logprobs",
                    num,
                ),
            )
        as_ids = request.get("return_tokens_as_token_ids")
        if as_ids is None:
            as_ids = bool(self.args.return_tokens_as_token_ids)
        return num, bool(as_ids)

    def completion_logprobs(self, seq, pieces, start, logprobs, initial_text_offset=0):
        """vllm 0.15.1's OpenAIServingCompletion._create_completion_logprobs
        (entrypoints/openai/completion/serving.py) over the pieces a sequence generated from
        its token `start` on: each token as its text, or "token_id:N" (N its id in the
        model's tokenizer, model_check.Tokenizer.token_id); its log-probability; the top
        log-probabilities, the sampled token first (greedy: it is the most likely), one
        entry for logprobs 0 and N for N > 0; text_offset from `initial_text_offset`, each
        the one before plus the length of the token string before it (so in
        "token_id:N" mode the lengths of those strings, as vllm computes it)."""
        num, as_ids = logprobs

        def token_string(piece):
            return "token_id:%d" % self.tokenizer.token_id(piece) if as_ids else piece

        offsets, token_logprobs, tokens, tops = [], [], [], []
        last_len = 0
        for k, piece in enumerate(pieces):
            position = start + k
            token = token_string(piece)
            lp = sampled_logprob(seq.seed, position)
            top = {token: lp}
            for rank, alt in enumerate(alternatives(seq.seed, position, piece, max(num - 1, 0)), 1):
                top.setdefault(token_string(alt), round(lp - 0.125 * rank, 6))
            tokens.append(token)
            token_logprobs.append(lp)
            tops.append(top)
            offsets.append(initial_text_offset if not offsets else offsets[-1] + last_len)
            last_len = len(token)
        return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": tops}

    async def collect(self, seqs, queue):
        """Every sequence's pieces and finish reason, once all have finished: ({index:
        [piece]}, {index: reason}); the engine's death is a 500. A sequence aborted by
        /pause ends with "abort" and what it had generated, answered with 200 as the real
        server does."""
        texts = {s.index: [] for s in seqs}
        reasons = {}
        while len(reasons) < len(seqs):
            index, text, reason = await queue.get()
            if text is not None:
                texts[index].append(text)
            if reason:
                reasons[index] = reason
        if any(r == "error" for r in reasons.values()):
            raise HTTPError(500, error_body(ENGINE_DEAD, "InternalServerError", 500))
        return texts, reasons

    async def _complete(self, conn, seqs, queue, rid, model, created, chat, logprobs=None) -> int:
        texts, reasons = await self.collect(seqs, queue)
        choices = []
        for s in sorted(seqs, key=lambda s: s.index):
            text = "".join(texts[s.index])
            if chat:
                choices.append(
                    {
                        "index": s.index,
                        "message": {
                            "role": self.args.response_role or "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            # ChatMessage: reasoning, and reasoning_content (deprecated) a copy
                            "reasoning": None,
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": reasons[s.index],
                        "stop_reason": None,
                        "token_ids": None,
                    }
                )
            else:
                choices.append(
                    {
                        "index": s.index,
                        "text": text,
                        "logprobs": self.completion_logprobs(s, texts[s.index], 0, logprobs) if logprobs else None,
                        "finish_reason": reasons[s.index],
                        "stop_reason": None,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                    }
                )
        body = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self.usage(seqs),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }
        if not chat:
            for key in ("prompt_logprobs", "prompt_token_ids"):
                body.pop(key)
        await conn.send(200, dumps(body))
        return 200

    @staticmethod
    def usage(seqs, completion=None):
        prompt = sum(s.prompt_tokens for s in seqs if s.first_of_prompt)
        if completion is None:
            completion = sum(s.generated for s in seqs)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    def stream_usage(self, opts):
        """(include_usage, continuous_usage_stats) of a streamed request, as vllm 0.15.1's
        should_include_usage (entrypoints/utils.py) reads them: stream_options given (any
        object, {} too) means include_usage unless it says false (StreamOptions defaults
        include_usage true, continuous_usage_stats false); without stream_options only
        --enable-force-include-usage turns it on; continuous only with include_usage."""
        force = bool(self.args.enable_force_include_usage)
        if isinstance(opts, dict):
            include = bool(opts.get("include_usage", True)) or force
            return include, include and bool(opts.get("continuous_usage_stats", False))
        return force, False

    async def _stream(
        self, conn, seqs, queue, rid, model, created, chat, include_usage, continuous=False, logprobs=None
    ) -> int:
        """vllm 0.15.1's completion_stream_generator / chat_completion_stream_generator, as
        they serialise: a completions chunk is dumped whole (exclude_unset=False: every
        choice field, and "usage": null unless continuous usage fills it), a chat chunk only
        with the fields set (no "usage" key unless continuous). Continuous usage: the
        prompt's tokens and the choice's tokens streamed so far (the chat role chunk: 0).
        The usage chunk closing the stream (include_usage) is dumped with exclude_none:
        choices [], usage without prompt_tokens_details."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        by_index = {s.index: s for s in seqs}
        streamed = {s.index: 0 for s in seqs}
        text_lens = {s.index: 0 for s in seqs}  # completion_stream_generator's previous_text_lens

        def running_usage(index, completion):
            prompt = by_index[index].prompt_tokens
            usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
            if not chat:
                usage["prompt_tokens_details"] = None
            return usage

        def chunk(choices, usage=None, first=False):
            body = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
            if usage is not None or not chat:
                body["usage"] = usage
            if chat and first:
                # the first chunk ever sets prompt_token_ids (None unless return_token_ids)
                body["prompt_token_ids"] = None
            return b"data: " + dumps(body) + b"\n\n"

        await conn.start_stream()
        if chat:
            for s in seqs:
                await conn.chunk(
                    chunk(
                        [
                            {
                                "index": s.index,
                                "delta": {
                                    "role": self.args.response_role or "assistant",
                                    "content": "",
                                    "reasoning_content": None,
                                },
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                        running_usage(s.index, 0) if continuous else None,
                        first=True,
                    )
                )
        done = 0
        while done < len(seqs):
            index, text, reason = await queue.get()
            if reason == "error":
                await conn.chunk(b"data: " + dumps(error_body(ENGINE_DEAD, "InternalServerError", 500)) + b"\n\n")
                break
            if reason:
                done += 1
            if text is None and reason is None:
                continue
            token_logprobs = None
            if logprobs and not chat:
                pieces = [text] if text is not None else []
                token_logprobs = self.completion_logprobs(
                    by_index[index], pieces, streamed[index], logprobs, text_lens[index]
                )
            if text is not None:
                streamed[index] += 1
                text_lens[index] += len(text)
            if chat:
                # DeltaMessage's validator sets reasoning_content (a copy of reasoning), so
                # exclude_unset keeps it in every delta; token_ids is set (None unless
                # return_token_ids) on every choice after the role chunk.
                delta = {"content": text} if text is not None else {}
                delta["reasoning_content"] = None
                choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
                if reason:
                    choice["stop_reason"] = None
                choice["token_ids"] = None
            else:
                choice = {
                    "index": index,
                    "text": text or "",
                    "logprobs": token_logprobs,
                    "finish_reason": reason,
                    "stop_reason": None,
                    "prompt_token_ids": None,
                    "token_ids": None,
                }
            await conn.chunk(chunk([choice], running_usage(index, streamed[index]) if continuous else None))
        if include_usage:
            final = self.usage(seqs, sum(streamed.values()))
            final.pop("prompt_tokens_details")
            await conn.chunk(chunk([], final))
        await conn.chunk(b"data: [DONE]\n\n")
        await conn.end_stream()
        return 200

    # ---------------------------------------------------------------- stats log
    async def log_stats(self):
        """vllm 0.15.1's LoggingStatLogger.log every 10 s (VLLM_LOG_STATS_INTERVAL;
        v1/metrics/loggers.py): at INFO unless this interval's and the last interval's
        throughputs are all 0 (engine_is_idle: DEBUG), so a stalled engine logs one line
        of 0.0 tokens/s, then nothing, whatever its running and waiting counts."""
        last_prompt, last_gen, last = 0, 0, time.monotonic()
        last_rates = (0.0, 0.0)
        while True:
            await asyncio.sleep(10)
            now = time.monotonic()
            m = self.metrics
            dp, dg = m.prompt_tokens - last_prompt, m.generation_tokens - last_gen
            rates = (dp / (now - last), dg / (now - last))
            log_fn = logger.info if any(rates + last_rates) else logger.debug
            last_rates = rates
            log_fn(
                "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation "
                "throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV "
                "cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                rates[0],
                rates[1],
                m.running,
                m.waiting,
                m.kv * 100,
                0.0,
            )
            last_prompt, last_gen, last = m.prompt_tokens, m.generation_tokens, now


ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def profile_run(config) -> None:
    """The engine core's profile run: the general plugins register the platform's kernels,
    a dummy forward pass calls each of them once, and the multimodal processor sizes the
    dummy inputs. A failure there is vLLM's "Engine core initialization failed"."""
    from vllm.model_executor.custom_op import dummy_forward
    from vllm.plugins import load_general_plugins
    from vllm.transformers_utils.processor import get_image_processor_info

    try:
        load_general_plugins()
        ops = dummy_forward()
        info = get_image_processor_info(config)
    except Exception as exc:
        logger.error("EngineCore failed to start.")
        logger.error("%s: %s", type(exc).__name__, exc)
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}") from exc
    logger.info("Profile run: %d custom ops, image processor max_pixels=%s", ops, info.get("max_pixels"))


def non_default_args(args) -> dict:
    out = {}
    for key, value in sorted(vars(args).items()):
        if key == "model_tag":
            continue
        if value != DEFAULTS.get(key) and not (value is False and key not in DEFAULTS):
            out[key] = value
    return out


def create_server_socket(host, port) -> socket.socket:
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host or "", port))
    return sock


async def run_server(args) -> None:
    logger.info("vLLM server version %s, serving model %s", VLLM_VERSION, args.model)
    # vllm/entrypoints/utils.py, log_non_default_args: every flag that differs from its
    # default, the API keys of --api-key (or a --config file) among them, at INFO.
    init_logger("vllm.entrypoints.utils").info("non-default args: %s", non_default_args(args))
    validate_api_server_args(args)
    sock = create_server_socket(args.host, args.port)
    sock.setblocking(False)

    # The platform plugin (vllm-kunlun) and the stack it runs on: an import error stops here.
    platform = current_platform()
    if platform is not None and hasattr(platform, "describe"):
        logger.info("Platform stack: %s", platform.describe())

    model_dir = model_check.resolve_model(args.model)
    config = model_check.load_config(model_dir)
    archs = config.get("architectures") or ["Qwen3_5ForCausalLM"]
    logger.info("Resolved architecture: %s", archs[0])
    max_model_len = model_check.check_config(args, config)
    logger.info("Using max model len %d", max_model_len)
    devices = model_check.check_devices(args, platform)
    logger.info("Chunked prefill is enabled with max_num_batched_tokens=%d.", args.max_num_batched_tokens or 8192)
    if args.enable_prefix_caching is not False:
        logger.info("Prefix caching is enabled (mamba_cache_mode=align).")
    logger.info(
        "world_size=%d rank=0 local_rank=0 distributed_init_method=env:// backend=nccl (%d devices visible)",
        args.tensor_parallel_size or 1,
        devices,
    )
    tokenizer = model_check.Tokenizer(model_dir)

    load_seconds = env_float("KUNLUN_SIM_LOAD_SECONDS", 20.0)
    start = time.monotonic()
    logger.info("Starting to load model %s...", model_dir)
    shards = model_check.read_safetensors(model_dir)
    for _index in range(len(shards)):
        await asyncio.sleep(load_seconds / max(len(shards), 1) * 0.85)
    logger.info("Loading weights took %.2f seconds", time.monotonic() - start)
    logger.info(
        "Model loading took %.4f GiB memory and %.6f seconds",
        31.0 / max(args.tensor_parallel_size or 1, 1),
        time.monotonic() - start,
    )
    await asyncio.sleep(load_seconds * 0.15)
    if platform is not None:
        profile_run(config)
    memory = MemoryModel(args, config)
    logger.info("Device memory: %s", memory.describe())
    if memory.max_running() < 1:
        # vllm's words when the memory left after the profile run holds no cache block.
        raise ValueError(
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    kv = model_check.kv_cache_gib(args)
    kv_tokens = int(kv * 2**30 / 65536)
    logger.info("Available KV cache memory: %.2f GiB", kv)
    logger.info("GPU KV cache size: %s tokens", f"{kv_tokens:,}")
    logger.info("Maximum concurrency for %s tokens per request: %.2fx", f"{max_model_len:,}", kv_tokens / max_model_len)
    logger.info("init engine (profile, create kv cache, warmup model) took %.2f seconds", time.monotonic() - start)

    server = Server(args, model_dir, config, max_model_len, tokenizer)
    engine_task = asyncio.ensure_future(server.engine.run())
    stats_task = None if args.disable_log_stats else asyncio.ensure_future(server.log_stats())
    # TLS as uvicorn's Config.load() makes it, after the engine is up (vllm/entrypoints/ssl.py).
    ssl_context = server_ssl_context(args)
    host = args.host or "0.0.0.0"
    scheme = "https" if args.ssl_keyfile and args.ssl_certfile else "http"
    logger.info("Starting vLLM API server %d on %s", 0, f"{scheme}://{host}:{args.port}")
    logger.info("Available routes are:")
    for path, methods in ROUTES:
        logger.info("Route: %s, Methods: %s", path, methods)
    sock.listen(2048)
    http = await asyncio.start_server(server.handle, sock=sock, limit=2**22, ssl=ssl_context)
    refresher = None
    if args.enable_ssl_refresh and ssl_context is not None:
        refresher = SSLCertRefresher(ssl_context, args.ssl_keyfile, args.ssl_certfile, args.ssl_ca_certs)
    uvicorn_log("INFO", f"Started server process [{os.getpid()}]")
    uvicorn_log("INFO", "Waiting for application startup.")
    uvicorn_log("INFO", "Application startup complete.")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def engine_done(task):
        if task.cancelled() or server.engine.dead is None:
            return
        exc = server.engine.dead
        logger.error("EngineCore encountered a fatal error.")
        logger.error("%s.%s: %s", type(exc).__module__, type(exc).__name__, exc)
        logger.error("AsyncLLM output_handler failed.")
        logger.error("vllm.v1.engine.exceptions.EngineDeadError: %s", ENGINE_DEAD)
        logger.error("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
        loop.call_later(1.0, stop.set)

    engine_task.add_done_callback(engine_done)
    await stop.wait()
    uvicorn_log("INFO", "Shutting down")
    if refresher is not None:
        refresher.stop()
    http.close()
    uvicorn_log("INFO", "Waiting for application shutdown.")
    uvicorn_log("INFO", "Application shutdown complete.")
    uvicorn_log("INFO", f"Finished server process [{os.getpid()}]")
    engine_task.cancel()
    if stats_task:
        stats_task.cancel()
    if server.engine.dead is not None:
        raise SystemExit(1)


def build_parser() -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server.")
    return make_arg_parser(parser)


def run(args) -> None:
    decorate_logs("APIServer")
    if args.model_tag:
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    try:
        asyncio.run(run_server(args))
    except KeyboardInterrupt:
        pass


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    run(args)


if __name__ == "__main__":
    main()
