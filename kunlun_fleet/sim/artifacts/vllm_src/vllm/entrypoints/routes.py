# SPDX-License-Identifier: Apache-2.0
"""The routes of vllm 0.15.1's OpenAI-compatible server and what each answers.

ROUTES is the route table `build_app` (vllm/entrypoints/openai/api_server.py) makes with the
serve role's flags and environment, in its order: path, methods, whether FastAPI lists it in
/openapi.json, whether it refuses a body that is not JSON (the `validate_json_request`
dependency), the request model's required fields. `ServeRoutes.dispatch` does what the
middleware and Starlette's router do before a route runs, in their order: ScalingMiddleware
(503 while /scale_elastic_ep runs), AuthenticationMiddleware (the API key on paths under /v1
only, never OPTIONS), the first route whose path and method match, else 405 (a route of the
path with other methods), a 307 to the path with or without its trailing slash, or 404.
The sources of each answer: kunlun_fleet/sim/artifacts/README.md.
"""

import asyncio
import json
import re
import time
import uuid
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from vllm.entrypoints.errors import (
    HTTPError,
    dumps,
    error_body,
    http_exception,
    request_invalid,
    validation_error,
)
from vllm.logger import init_logger

logger = init_logger("vllm.entrypoints.openai.api_server")

# pydantic's location of a field of a request model that logs its extra fields
# (vllm's OpenAIBaseModel.__log_extra_fields__, a wrap validator).
WRAPPED = "function-wrap[__log_extra_fields__()]"
NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"
JSON_ONLY = "Unsupported Media Type: Only 'application/json' is allowed"
SCALING = "The model is currently scaling. Please try again later."


class Body(NamedTuple):
    """A route's request model as FastAPI validates the JSON body: one of `alternatives` (the
    members of a union, each a tuple of required fields) must be complete; `wrapped`: the
    fields' location goes through WRAPPED; `list_500`: a body that is not an object fails in
    the wrapper (Starlette's plain 500) rather than in pydantic (model_attributes_type)."""

    alternatives: tuple
    wrapped: bool = False
    list_500: bool = False


class Route(NamedTuple):
    path: str  # "{name}": a path parameter
    methods: tuple  # () for a mount: every method, and every path under it
    handler: str  # ServeRoutes.route_<handler>
    json_body: bool = False
    in_schema: bool = True
    body: Body = None  # None: no request model (the handler reads the body, or none)
    api: str = None  # the API a generation model does not serve ("Embeddings API", ...)
    load_aware: bool = False  # counted by /load with --enable-server-load-tracking (load_aware_call)
    docs: bool = False  # FastAPI's own, gone with --disable-fastapi-docs


POOLING_INPUT = Body((("input",), ("messages",)), wrapped=True, list_500=True)
SCORE_INPUT = Body((("queries", "documents"), ("data_1", "data_2"), ("text_1", "text_2")), wrapped=True)
RERANK_INPUT = Body((("query", "documents"),))

ROUTES = [
    Route("/openapi.json", ("GET", "HEAD"), "openapi", in_schema=False, docs=True),
    Route("/docs", ("GET", "HEAD"), "docs", in_schema=False, docs=True),
    Route("/docs/oauth2-redirect", ("GET", "HEAD"), "docs", in_schema=False, docs=True),
    Route("/redoc", ("GET", "HEAD"), "docs", in_schema=False, docs=True),
    Route("/scale_elastic_ep", ("POST",), "scale_elastic_ep", json_body=True),
    Route("/is_scaling_elastic_ep", ("POST",), "is_scaling_elastic_ep"),
    Route("/tokenize", ("POST",), "tokenize", True, body=Body((("prompt",), ("messages",)), True, True)),
    Route("/detokenize", ("POST",), "detokenize", True, body=Body((("tokens",),))),
    Route(
        "/inference/v1/generate",
        ("POST",),
        "generate_tokens",
        True,
        body=Body((("token_ids", "sampling_params"),)),
        load_aware=True,
    ),
    Route("/pause", ("POST",), "pause"),
    Route("/resume", ("POST",), "resume"),
    Route("/is_paused", ("GET",), "is_paused"),
    Route("/metrics", ("GET",), "metrics"),
    # prometheus_client's ASGI app mounted at /metrics: any method, any path under it.
    Route("/metrics", (), "metrics", in_schema=False),
    Route("/health", ("GET",), "health"),
    Route("/v1/chat/completions", ("POST",), "chat", True, load_aware=True),
    Route("/v1/chat/completions/render", ("POST",), "render_chat", True, body=Body((("messages",),), list_500=True)),
    Route("/v1/responses", ("POST",), "responses", True, body=Body((("input",),), list_500=True), load_aware=True),
    Route("/v1/responses/{response_id}", ("GET",), "retrieve_response", load_aware=True),
    Route("/v1/responses/{response_id}/cancel", ("POST",), "retrieve_response", load_aware=True),
    Route("/v1/audio/transcriptions", ("POST",), "audio", api="Transcriptions API", load_aware=True),
    Route("/v1/audio/translations", ("POST",), "audio", api="Translations API", load_aware=True),
    Route("/v1/completions", ("POST",), "completions", True, load_aware=True),
    Route("/v1/completions/render", ("POST",), "render_completion", True),
    Route(
        "/v1/messages", ("POST",), "messages", True, body=Body((("model", "messages", "max_tokens"),)), load_aware=True
    ),
    Route("/v1/models", ("GET",), "models"),
    Route("/load", ("GET",), "load"),
    Route("/version", ("GET",), "version"),
    Route("/ping", ("GET",), "health"),
    Route("/ping", ("POST",), "health"),
    Route("/invocations", ("POST",), "invocations", True),
    Route("/classify", ("POST",), "unsupported", True, body=POOLING_INPUT, api="Classification API", load_aware=True),
    Route("/v1/embeddings", ("POST",), "unsupported", True, body=POOLING_INPUT, api="Embeddings API", load_aware=True),
    Route("/score", ("POST",), "unsupported", True, body=SCORE_INPUT, api="Score API", load_aware=True),
    Route("/v1/score", ("POST",), "unsupported", True, body=SCORE_INPUT, api="Score API", load_aware=True),
    Route("/rerank", ("POST",), "unsupported", True, body=RERANK_INPUT, api="Rerank (Score) API", load_aware=True),
    Route("/v1/rerank", ("POST",), "unsupported", True, body=RERANK_INPUT, api="Rerank (Score) API", load_aware=True),
    Route("/v2/rerank", ("POST",), "unsupported", True, body=RERANK_INPUT, api="Rerank (Score) API", load_aware=True),
    Route(
        "/pooling",
        ("POST",),
        "unsupported",
        True,
        body=Body((("input",), ("messages",), ("data",)), wrapped=True, list_500=True),
        api="Pooling API",
        load_aware=True,
    ),
]

# What vllm's launcher logs as "Available routes are:" (vllm/entrypoints/launcher.py,
# serve_http): the app's routes with a path and methods at its top level. FastAPI keeps each
# included router as one entry without them, so only its own docs routes and the
# instrumentator's /metrics are listed (seen in the real server's log).
LOGGED_ROUTES = [
    ("/openapi.json", "HEAD, GET"),
    ("/docs", "HEAD, GET"),
    ("/docs/oauth2-redirect", "HEAD, GET"),
    ("/redoc", "HEAD, GET"),
    ("/metrics", "GET"),
]

_PATTERNS = {}


def _pattern(path: str):
    regex = _PATTERNS.get(path)
    if regex is None:
        regex = re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path)) + "$")
        _PATTERNS[path] = regex
    return regex


def served_routes(args):
    """The table as this server registers it: FastAPI's docs routes unless
    --disable-fastapi-docs (build_app: FastAPI(openapi_url=None, docs_url=None, ...))."""
    return [r for r in ROUTES if not (r.docs and args.disable_fastapi_docs)]


def match(routes, method: str, path: str):
    """Starlette's Router: the first route that matches the path and the method (a mount: the
    path or one under it, any method): (route, path parameters, None); else (None, {}, the
    first route of that path with other methods, or None)."""
    partial = None
    for route in routes:
        if not route.methods:
            if path == route.path or path.startswith(route.path + "/"):
                return route, {}, None
            continue
        found = _pattern(route.path).match(path)
        if found is None:
            continue
        if method in route.methods:
            return route, found.groupdict(), None
        partial = partial or route
    return None, {}, partial


def openapi(routes) -> dict:
    """/openapi.json as FastAPI writes it, reduced to what a client reads: every route it lists
    (in_schema) with its methods."""
    paths = {}
    for route in routes:
        if route.in_schema and route.methods:
            entry = paths.setdefault(route.path, {})
            for method in route.methods:
                entry[method.lower()] = {
                    "summary": route.handler.replace("_", " ").title(),
                    "operationId": f"{route.handler}_{route.path.strip('/').replace('/', '_')}_{method.lower()}",
                    "responses": {"200": {"description": "Successful Response"}},
                }
    return {"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths}


DOCS = {
    "/docs": "<title>FastAPI - Swagger UI</title>",
    "/docs/oauth2-redirect": "<title>Swagger UI: OAuth2 Redirect</title>",
    "/redoc": "<title>FastAPI - ReDoc</title>",
}


def docs_page(path: str) -> bytes:
    """FastAPI's documentation pages, their text shortened (the pages load their scripts
    from a CDN; no client of the product reads them)."""
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n%s\n</head>\n<body>\n<div data-openapi-url="/openapi.json"></div>\n'
        "</body>\n</html>\n" % DOCS[path]
    ).encode()


def query_bool(query: dict, name: str, default: bool) -> bool:
    """A boolean query parameter as pydantic reads it (FastAPI's Query(bool))."""
    values = query.get(name)
    if not values:
        return default
    value = values[-1]
    lowered = value.lower()
    if lowered in ("1", "on", "t", "true", "y", "yes"):
        return True
    if lowered in ("0", "off", "f", "false", "n", "no"):
        return False
    raise HTTPError(
        400,
        request_invalid(
            "bool_parsing", ("query", name), "Input should be a valid boolean, unable to interpret input", value
        ),
    )


def form_fields(headers: dict, body: bytes) -> dict:
    """A form body's fields, name -> "file" for an uploaded file or the value: multipart (each
    part's Content-Disposition) or urlencoded; {} for any other content type."""
    ctype = headers.get("content-type", "")
    media = ctype.split(";")[0].strip().lower()
    if media == "application/x-www-form-urlencoded":
        return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    found = re.search(r'boundary="?([^";]+)"?', ctype)
    if media != "multipart/form-data" or not found:
        return {}
    fields = {}
    for part in body.split(b"--" + found.group(1).encode()):
        head, _, value = part.partition(b"\r\n\r\n")
        disposition = re.search(rb'name="([^"]*)"(; filename="([^"]*)")?', head)
        if disposition:
            name = disposition.group(1).decode("utf-8", "replace")
            fields[name] = "file" if disposition.group(2) else value.rstrip(b"\r\n").decode("utf-8", "replace")
    return fields


def content(value) -> str:
    """A message's content as text: a string, or the text of its parts (OpenAI, Anthropic
    and Responses parts all carry "text")."""
    if isinstance(value, list):
        return " ".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return "" if value is None else str(value)


class Req(NamedTuple):
    method: str
    path: str
    params: dict
    query: dict
    headers: dict
    body: bytes


class ServeRoutes:
    """The server's routes (a base of api_server.Server, whose engine, tokenizer, checks and
    generation they use)."""

    def init_routes(self):
        self.routes = served_routes(self.args)
        self.scaling = False
        self.paused = False
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.server_load = 0

    # ------------------------------------------------------------ before the route
    async def dispatch(self, conn, method, target, headers, body) -> int:
        conn.head_only = method == "HEAD"  # uvicorn sends no body to HEAD
        parts = urlsplit(target)
        path = unquote(parts.path)
        root = self.args.root_path or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        try:
            if self.scaling:
                # ScalingMiddleware, the outermost: every request while a scale runs.
                await conn.send(503, dumps({"error": SCALING}))
                return 503
            if path.startswith("/v1") and method != "OPTIONS" and self.api_keys is not None:
                # AuthenticationMiddleware.verify_token: the scheme in any case, one space.
                scheme, _, token = headers.get("authorization", "").partition(" ")
                if not (scheme.lower() == "bearer" and token in self.api_keys):
                    await conn.send(401, dumps({"error": "Unauthorized"}))
                    return 401
            route, params, partial = match(self.routes, method, path)
            if route is None:
                return await self._no_route(conn, method, path, parts, headers, partial)
            req = Req(method, path, params, parse_qs(parts.query), headers, body)
            if route.json_body:
                # validate_json_request (vllm/entrypoints/openai/utils.py), a dependency.
                if headers.get("content-type", "").lower().split(";")[0].strip() != "application/json":
                    raise HTTPError(400, validation_error([JSON_ONLY], str([JSON_ONLY])))
            tracked = route.load_aware and self.args.enable_server_load_tracking
            if tracked:
                self.server_load += 1
            try:
                return await getattr(self, "route_" + route.handler)(conn, req, route)
            finally:
                if tracked:
                    self.server_load -= 1
        except PlainError as exc:
            await conn.send(exc.status, exc.text, "text/plain; charset=utf-8")
            return exc.status
        except HTTPError as exc:
            await conn.send(exc.status, dumps(exc.body))
            return exc.status

    async def _no_route(self, conn, method, path, parts, headers, partial) -> int:
        if partial is not None:
            await conn.send(405, dumps({"detail": "Method Not Allowed"}), extra=[("allow", ", ".join(partial.methods))])
            return 405
        if path != "/":
            # Starlette's redirect_slashes: the other form of the path, if a route takes it.
            other = path[:-1] if path.endswith("/") else path + "/"
            found, _, other_partial = match(self.routes, method, other)
            if found is not None or other_partial is not None:
                scheme = "https" if conn.writer.get_extra_info("ssl_object") is not None else "http"
                location = f"{scheme}://{headers.get('host', '')}{(self.args.root_path or '')}{other}"
                if parts.query:
                    location += "?" + parts.query
                await conn.send(307, b"", None, extra=[("location", location)])
                return 307
        await conn.send(404, dumps({"detail": "Not Found"}))
        return 404

    def json_request(self, req, route):
        """The JSON body as FastAPI hands it to the route's model: json_invalid, missing
        (no body), not an object, and the model's required fields."""
        if not req.body:
            raise HTTPError(400, request_invalid("missing", ("body",), "Field required", None))
        try:
            request = json.loads(req.body)
        except ValueError as exc:
            raise HTTPError(
                400,
                request_invalid(
                    "json_invalid",
                    ("body", getattr(exc, "pos", 0)),
                    "JSON decode error",
                    {},
                    {"error": getattr(exc, "msg", str(exc))},
                ),
            ) from exc
        spec = route.body
        loc = ("body", WRAPPED) if spec is not None and spec.wrapped else ("body",)
        if not isinstance(request, dict):
            if spec is None or spec.list_500:
                # The handler or the model's wrapper fails on it: Starlette's plain 500.
                raise PlainError(500, b"Internal Server Error")
            detail = {"type": "model_attributes_type", "loc": loc, "msg": NOT_AN_OBJECT, "input": request}
            raise HTTPError(400, validation_error([detail] * len(spec.alternatives)))
        if spec is not None and not any(all(f in request for f in alt) for alt in spec.alternatives):
            missing = [
                {"type": "missing", "loc": loc + (f,), "msg": "Field required", "input": request}
                for alt in spec.alternatives
                for f in alt
                if f not in request
            ]
            raise HTTPError(400, validation_error(missing))
        return request

    def check_model(self, request, anthropic=False):
        model = request.get("model")
        if model is not None and model not in self.served_names:
            message = f"The model `{model}` does not exist."
            if anthropic:
                raise HTTPError(404, {"type": "error", "error": {"type": "NotFoundError", "message": message}})
            raise HTTPError(404, error_body(message, "NotFoundError", 404, "model"))
        return model or self.served_names[0]

    # ------------------------------------------------------------ FastAPI's, the server's own
    async def route_openapi(self, conn, req, route) -> int:
        await conn.send(200, dumps(openapi(self.routes)))
        return 200

    async def route_docs(self, conn, req, route) -> int:
        await conn.send(200, docs_page(route.path), "text/html; charset=utf-8")
        return 200

    async def route_health(self, conn, req, route) -> int:
        # health (vllm/entrypoints/serve/instrumentator/health.py): an empty Response, 503 when
        # the engine is dead; /ping answers as /health (entrypoints/sagemaker/routes.py).
        status = 503 if self.engine.dead is not None else 200
        await conn.send(status, b"", None)
        return status

    async def route_load(self, conn, req, route) -> int:
        await conn.send(200, dumps({"server_load": self.server_load}))
        return 200

    async def route_version(self, conn, req, route) -> int:
        from vllm.version import __version__

        await conn.send(200, dumps({"version": __version__}))
        return 200

    async def route_metrics(self, conn, req, route) -> int:
        await conn.send(200, self.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
        return 200

    async def route_models(self, conn, req, route) -> int:
        await conn.send(200, dumps(self.models()))
        return 200

    # ------------------------------------------------------------ generation
    async def route_completions(self, conn, req, route) -> int:
        return await self.generate(conn, self.json_request(req, route), chat=False)

    async def route_chat(self, conn, req, route) -> int:
        return await self.generate(conn, self.json_request(req, route), chat=True)

    async def route_invocations(self, conn, req, route) -> int:
        """SageMaker's /invocations (vllm/entrypoints/sagemaker/routes.py): the body validated
        as a ChatCompletionRequest, else a CompletionRequest, and handed to that route's
        handler: chat and completion bodies answer as /v1/chat/completions and
        /v1/completions, streamed too. Outside /v1: no API key is asked for."""
        try:
            request = json.loads(req.body)
        except ValueError as exc:
            raise HTTPError(400, http_exception(400, f"JSON decode error: {exc}")) from exc
        if not isinstance(request, dict):
            raise PlainError(500, b"Internal Server Error")
        adapter = req.headers.get("x-amzn-sagemaker-adapter-identifier")
        if adapter:
            # inject_adapter_id(adapter_path="model"): the header replaces the body's model.
            request["model"] = adapter
        messages = request.get("messages")
        if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages):
            return await self.generate(conn, request, chat=True)
        prompt = request.get("prompt")
        logprobs = request.get("logprobs")
        if prompt not in (None, "") and not (isinstance(logprobs, int) and logprobs < 0):
            return await self.generate(conn, request, chat=False)
        raise HTTPError(
            400,
            error_body(
                "Cannot find suitable handler for request. Expected one of: "
                "['ChatCompletionRequest', 'CompletionRequest']"
            ),
        )

    async def route_generate_tokens(self, conn, req, route) -> int:
        """/inference/v1/generate (vllm/entrypoints/serve/disagg): token ids in, token ids out,
        never streamed (a `stream` request gets the whole answer too, as on the real server).
        Outside /v1: no API key is asked for."""
        body = self.json_request(req, route)
        model = self.check_model(body)
        params = body.get("sampling_params") or {}
        request = {
            "model": model,
            "prompt": list(body.get("token_ids") or []) or [0],
            # SamplingParams' default max_tokens (vllm/sampling_params.py).
            "max_tokens": params.get("max_tokens", 16),
            "n": params.get("n", 1),
            "ignore_eos": params.get("ignore_eos"),
            "min_tokens": params.get("min_tokens"),
            "seed": params.get("seed", ""),
        }
        rid = body.get("request_id") or uuid.uuid4().hex[:16]
        seqs, queue, _ = await self.admit(request, False, rid)
        try:
            texts, reasons = await self.collect(seqs, queue)
        finally:
            self.release(seqs)
        choices = [
            {
                "index": s.index,
                "logprobs": None,
                "finish_reason": reasons[s.index],
                "token_ids": [self.tokenizer.token_id(p) for p in texts[s.index]],
            }
            for s in sorted(seqs, key=lambda s: s.index)
        ]
        await conn.send(
            200, dumps({"request_id": rid, "choices": choices, "prompt_logprobs": None, "kv_transfer_params": None})
        )
        return 200

    async def route_messages(self, conn, req, route) -> int:
        """Anthropic's /v1/messages (vllm/entrypoints/anthropic): a chat completion under
        Anthropic's names, streamed as its events."""
        body = self.json_request(req, route)
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens < 1:
            why = "max_tokens must be positive"
            raise HTTPError(
                400,
                request_invalid(
                    "value_error", ("body", "max_tokens"), "Value error, " + why, max_tokens, {"error": ValueError(why)}
                ),
            )
        model = self.check_model(body, anthropic=True)
        messages = [{"role": m.get("role"), "content": content(m.get("content"))} for m in body["messages"]]
        if body.get("system"):
            messages.insert(0, {"role": "system", "content": content(body["system"])})
        request = {"model": model, "messages": messages, "max_tokens": max_tokens}
        rid = "chatcmpl-" + uuid.uuid4().hex[:16]
        seqs, queue, _ = await self.admit(request, True, rid)
        (seq,) = seqs
        try:
            if body.get("stream"):
                return await self._messages_stream(conn, seq, queue, rid, model)
            texts, reasons = await self.collect(seqs, queue)
        finally:
            self.release(seqs)
        answer = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "".join(texts[seq.index])}],
            "model": model,
            "stop_reason": ANTHROPIC_STOP.get(reasons[seq.index], reasons[seq.index]),
            "usage": {"input_tokens": seq.prompt_tokens, "output_tokens": seq.generated},
        }
        await conn.send(200, dumps(answer))
        return 200

    async def _messages_stream(self, conn, seq, queue, rid, model) -> int:
        def event(name, doc):
            return f"event: {name}\ndata: ".encode() + dumps(doc) + b"\n\n"

        await conn.start_stream()
        start = {
            "id": rid,
            "content": [],
            "model": model,
            "usage": {"input_tokens": seq.prompt_tokens, "output_tokens": 0},
        }
        await conn.chunk(event("message_start", {"type": "message_start", "message": start}))
        block = {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
        await conn.chunk(event("content_block_start", block))
        reason = None
        while reason is None:
            _, text, reason = await queue.get()
            if text:
                delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}, "index": 0}
                await conn.chunk(event("content_block_delta", delta))
        await conn.chunk(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        usage = {"input_tokens": seq.prompt_tokens, "output_tokens": seq.generated}
        stop = {"type": "message_delta", "delta": {"stop_reason": ANTHROPIC_STOP.get(reason, reason)}, "usage": usage}
        await conn.chunk(event("message_delta", stop))
        await conn.chunk(event("message_stop", {"type": "message_stop"}))
        await conn.chunk(b"data: [DONE]\n\n")
        await conn.end_stream()
        return 200

    async def route_responses(self, conn, req, route) -> int:
        """The Responses API's create (vllm/entrypoints/openai/responses): instructions and
        input as a chat, one message item out; nothing is stored
        (VLLM_ENABLE_RESPONSES_API_STORE unset), so background mode is refused."""
        body = self.json_request(req, route)
        if body.get("background"):
            raise HTTPError(
                400,
                error_body(
                    "This vLLM engine does not support `store=True` and therefore does not support the background "
                    "mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` "
                    "when launching the vLLM server.",
                    "invalid_request_error",
                    400,
                    "background",
                ),
            )
        model = self.check_model(body)
        messages = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": content(body["instructions"])})
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        for item in items:
            if isinstance(item, dict) and "content" in item:
                messages.append({"role": item.get("role", "user"), "content": content(item["content"])})
        request = {"model": model, "messages": messages, "max_tokens": body.get("max_output_tokens")}
        rid = "resp_" + uuid.uuid4().hex[:16]
        seqs, queue, _ = await self.admit(request, True, rid)
        (seq,) = seqs
        created = int(time.time())
        try:
            if body.get("stream"):
                return await self._responses_stream(conn, body, seq, queue, rid, model, created)
            texts, reasons = await self.collect(seqs, queue)
        finally:
            self.release(seqs)
        await conn.send(
            200, dumps(self.response_object(body, seq, rid, model, created, texts[seq.index], reasons[seq.index]))
        )
        return 200

    def response_object(self, body, seq, rid, model, created, pieces, reason):
        """A ResponsesResponse as vllm 0.15.1 dumps it (every field; seen on the real server)."""
        done = reason is not None
        output = []
        if done:
            part = {"annotations": [], "text": "".join(pieces), "type": "output_text", "logprobs": None}
            output.append(
                {
                    "id": "msg_" + uuid.uuid4().hex[:16],
                    "content": [part],
                    "role": "assistant",
                    "status": "completed",
                    "type": "message",
                    "phase": None,
                }
            )
        usage = None
        if done:
            usage = {
                "input_tokens": seq.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0, "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
                "output_tokens": seq.generated,
                "output_tokens_details": {
                    "reasoning_tokens": 0,
                    "tool_output_tokens": 0,
                    "output_tokens_per_turn": [],
                    "tool_output_tokens_per_turn": [],
                },
                "total_tokens": seq.prompt_tokens + seq.generated,
            }
        status = "in_progress" if not done else ("incomplete" if reason == "length" else "completed")
        return {
            "id": rid,
            "created_at": created,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": float(body.get("temperature") if body.get("temperature") is not None else 1.0),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": float(body.get("top_p") if body.get("top_p") is not None else 1.0),
            "background": False,
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": None,
            "service_tier": body.get("service_tier", "auto"),
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": body.get("truncation", "disabled"),
            "usage": usage,
            "user": body.get("user"),
            "input_messages": None,
            "output_messages": None,
        }

    async def _responses_stream(self, conn, body, seq, queue, rid, model, created) -> int:
        """The events as vllm 0.15.1 sends them (seen on the real server), its counters
        included: content_index grows by one at every text event after the part is added."""
        number = 0

        async def event(doc):
            nonlocal number
            doc["sequence_number"] = number
            number += 1
            await conn.chunk(f"event: {doc['type']}\ndata: ".encode() + dumps(doc) + b"\n\n")

        await conn.start_stream()
        for name in ("response.created", "response.in_progress"):
            await event({"response": self.response_object(body, seq, rid, model, created, [], None), "type": name})
        item_id = str(uuid.uuid4())
        item = {
            "id": item_id,
            "content": [],
            "role": "assistant",
            "status": "in_progress",
            "type": "message",
            "phase": None,
        }
        await event({"item": item, "output_index": 0, "type": "response.output_item.added"})
        part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        ids = {"item_id": item_id, "output_index": 0}
        await event({"content_index": 0, **ids, "part": part, "type": "response.content_part.added"})
        pieces, reason, index = [], None, 0
        while reason is None:
            _, text, reason = await queue.get()
            if text is not None:
                index += 1
                pieces.append(text)
                delta = {"content_index": index, "delta": text, **ids, "logprobs": []}
                await event(dict(delta, type="response.output_text.delta"))
        text = "".join(pieces)
        await event(
            {"content_index": index + 1, **ids, "logprobs": [], "text": text, "type": "response.output_text.done"}
        )
        final = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
        await event({"content_index": index + 2, **ids, "part": final, "type": "response.content_part.done"})
        item = dict(item, content=[final], status="completed", summary=[])
        await event({"item": item, "output_index": 0, "type": "response.output_item.done"})
        response = self.response_object(body, seq, rid, model, created, pieces, reason)
        await event({"response": response, "type": "response.completed"})
        await conn.end_stream()
        return 200

    async def route_retrieve_response(self, conn, req, route) -> int:
        # Nothing is stored without VLLM_ENABLE_RESPONSES_API_STORE: retrieve and cancel find no id.
        rid = req.params["response_id"]
        raise HTTPError(
            404, error_body(f"Response with id '{rid}' not found.", "invalid_request_error", 404, "response_id")
        )

    # ------------------------------------------------------------ tokens
    async def route_tokenize(self, conn, req, route) -> int:
        body = self.json_request(req, route)
        self.check_model(body)
        if "prompt" in body:
            text = str(body["prompt"])
        else:
            messages = body["messages"] if isinstance(body["messages"], list) else []
            text = self.tokenizer.chat(messages, add_generation_prompt=body.get("add_generation_prompt", True))
        ids, strs = self.tokenizer.encode(text)
        answer = {
            "count": len(ids),
            "max_model_len": self.max_model_len,
            "tokens": ids,
            "token_strs": strs if body.get("return_token_strs") else None,
        }
        await conn.send(200, dumps(answer))
        return 200

    async def route_detokenize(self, conn, req, route) -> int:
        body = self.json_request(req, route)
        self.check_model(body)
        tokens = body.get("tokens") or []
        if any(isinstance(t, int) and not 0 <= t < 2**32 for t in tokens):
            # The tokenizer's u32 ids (the handler turns its OverflowError into a validation error).
            why = "out of range integral type conversion attempted"
            raise HTTPError(400, validation_error([why], str([why])))
        await conn.send(200, dumps({"prompt": self.tokenizer.decode([t for t in tokens if isinstance(t, int)])}))
        return 200

    async def route_render_completion(self, conn, req, route) -> int:
        """/v1/completions/render: each prompt and its token ids, nothing generated."""
        body = self.json_request(req, route)
        prompt = body.get("prompt")
        if prompt is None or prompt == "":
            why = "Either prompt or prompt_embeds must be provided and non-empty."
            raise HTTPError(
                400, request_invalid("value_error", ("body",), "Value error, " + why, body, {"error": ValueError(why)})
            )
        self.check_model(body)
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            rendered = [{"prompt_token_ids": prompt}]
        else:
            prompts = prompt if isinstance(prompt, list) else [prompt]
            rendered = [{"prompt_token_ids": self.tokenizer.encode(str(p))[0], "prompt": str(p)} for p in prompts]
        await conn.send(200, dumps(rendered))
        return 200

    async def route_render_chat(self, conn, req, route) -> int:
        """/v1/chat/completions/render: the conversation and the prompt the template makes."""
        body = self.json_request(req, route)
        self.check_model(body)
        messages = body["messages"] if isinstance(body["messages"], list) else []
        conversation = [{"role": m.get("role"), "content": content(m.get("content"))} for m in messages]
        text = self.tokenizer.chat(conversation, add_generation_prompt=body.get("add_generation_prompt", True))
        ids, _ = self.tokenizer.encode(text)
        await conn.send(200, dumps([conversation, [{"prompt": text, "prompt_token_ids": ids}]]))
        return 200

    # ------------------------------------------------------------ what a generation model does not serve
    async def route_unsupported(self, conn, req, route) -> int:
        # The route's handler is None for a generation model: the base server's error
        # response, returned as the endpoint's value, which FastAPI sends with status 200.
        self.json_request(req, route)
        await conn.send(200, dumps(error_body(f"The model does not support {route.api}")))
        return 200

    async def route_audio(self, conn, req, route) -> int:
        fields = form_fields(req.headers, req.body)
        if "file" not in fields:
            raise HTTPError(400, request_invalid("missing", ("body", "file"), "Field required", fields))
        await conn.send(200, dumps(error_body(f"The model does not support {route.api}")))
        return 200

    # ------------------------------------------------------------ the engine's controls (no key: outside /v1)
    async def route_pause(self, conn, req, route) -> int:
        """AsyncLLM.pause_generation (vllm/v1/engine/async_llm.py): in-flight requests aborted
        (they end with finish_reason "abort") unless wait_for_inflight_requests, then drained;
        new requests wait until /resume. A second pause does nothing."""
        wait = query_bool(req.query, "wait_for_inflight_requests", False)
        query_bool(req.query, "clear_cache", True)  # no prefix cache to clear here
        if not self.paused:
            self.paused = True
            self.resumed.clear()
            if not wait:
                for seq in self.engine.running + list(self.engine.waiting):
                    seq.aborted = True
                self.engine.wake.set()
            while self.engine.running or self.engine.waiting:
                await asyncio.sleep(0.05)
        await conn.send(200, dumps({"status": "paused"}))
        return 200

    async def route_resume(self, conn, req, route) -> int:
        self.paused = False
        self.resumed.set()
        await conn.send(200, dumps({"status": "resumed"}))
        return 200

    async def route_is_paused(self, conn, req, route) -> int:
        await conn.send(200, dumps({"is_paused": self.paused}))
        return 200

    async def wait_unpaused(self):
        """AsyncLLM.add_request waits here while the engine is paused."""
        await self.resumed.wait()

    async def route_is_scaling_elastic_ep(self, conn, req, route) -> int:
        await conn.send(200, dumps({"is_scaling_elastic_ep": self.scaling}))
        return 200

    async def route_scale_elastic_ep(self, conn, req, route) -> int:
        """vllm/entrypoints/serve/elastic_ep/api_router.py: the body's checks, then the scaling
        flag (every request 503) while AsyncLLM.scale_elastic_ep runs. To the same size it
        skips; to another, a single engine (no data-parallel client) counts as drained at once
        (dp_engines_running is False) and its core client cannot scale (NotImplementedError):
        500 "Scale failed"."""
        try:
            body = json.loads(req.body)
        except ValueError as exc:
            raise HTTPError(400, http_exception(400, "Invalid JSON format")) from exc
        if not isinstance(body, dict):
            raise PlainError(500, b"Internal Server Error")
        size = body.get("new_data_parallel_size")
        drain = body.get("drain_timeout", 120)
        if size is None:
            raise HTTPError(400, http_exception(400, "new_data_parallel_size is required"))
        if not isinstance(size, int) or size <= 0:
            raise HTTPError(400, http_exception(400, "new_data_parallel_size must be a positive integer"))
        if not isinstance(drain, int) or drain <= 0:
            raise HTTPError(400, http_exception(400, "drain_timeout must be a positive integer"))
        self.scaling = True
        try:
            if size == (self.args.data_parallel_size or 1):
                logger.info("Data parallel size is already %s, skipping scale", size)
                await conn.send(200, dumps({"message": f"Scaled to {size} data parallel engines"}))
                return 200
            logger.info("Waiting for requests to drain before scaling up to %s engines...", size)
            logger.info("Engines are idle, requests have been drained")
            logger.info("Requests have been drained, proceeding with scale to %s engines", size)
            logger.error("Scale failed: ")
            raise HTTPError(500, http_exception(500, "Scale failed"))
        finally:
            self.scaling = False


ANTHROPIC_STOP = {"length": "max_tokens", "stop": "end_turn"}


class PlainError(HTTPError):
    """An answer that is not JSON (Starlette's plain 500)."""

    def __init__(self, status, text: bytes):
        super().__init__(status, None)
        self.text = text
