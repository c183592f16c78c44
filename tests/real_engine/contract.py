"""The contract between the product and vLLM 0.15.1's OpenAI-compatible server, in one list.

Each point is a request (or a few) and what is kept of the answers: an observation, made
the same way on the real engine and on the stand-in, and compared for equality
(test_contract.py). An observation keeps what the product, its alert rules and its
dashboard rely on, and the shape of every JSON answer (its keys and their types, values
left out: generated text, ids and timestamps differ from run to run). The real engine is
the reference; a point also states what the real engine must answer (`expect`), so that a
change of the contract itself is seen.

Where the stand-in differs and its fix belongs to code another change is editing (the
stand-in's usage and stream code), the point carries `standin_differs`: the difference,
precisely (the test is then an expected failure, strict: it fails once the stand-in
agrees, so the mark is removed with the fix).
"""

import json
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings

from kunlun_fleet import monitoring

import engine
from engine import OPENER

# The metric names the product's own code reads from a vLLM /metrics: the bench's counters
# (module_utils/bench_results.py), the requests in flight (roles/serve/tasks/drain.yml,
# the drain; library/host_status.py; module_utils/rollout_capacity.py, the capacity gate).
PRODUCT_METRICS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)


def read_metric_names():
    """Every vLLM series the product, the alert rules and the dashboard read."""
    names = set(PRODUCT_METRICS)
    for _, expr in monitoring.queries():
        names.update(n for n in monitoring.metric_names(expr) if n.startswith("vllm:"))
    # An alert's text names vllm:num_preemptions_total for the operator to look at.
    names.add("vllm:num_preemptions_total")
    return sorted(names)


# ----------------------------------------------------------------------------- client
class Reply:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def events(self):
        """The SSE stream: (framing problems, [payloads]) - each event one `data: ` line
        followed by a blank line."""
        text = self.body.decode("utf-8")
        problems, payloads = [], []
        blocks = text.split("\n\n")
        if blocks and blocks[-1] == "":
            blocks.pop()
        else:
            problems.append("the stream does not end with a blank line")
        for block in blocks:
            if not block.startswith("data: ") or "\n" in block:
                problems.append("not one `data: ` line: %r" % block[:80])
                continue
            payloads.append(block[len("data: ") :])
        return problems, payloads


KEEP = object()


class Client:
    """One server: its base URL, key, and what it was started with."""

    def __init__(self, server):
        self.server = server
        self.base = server.base
        self.key = server.api_key
        self.served = server.rendered.served_name
        self.model_dir = str(server.rendered.model_dir)
        args = server.rendered.args
        self.max_model_len = int(args[args.index("--max-model-len") + 1])

    def call(self, method, path, body=None, raw=None, key=KEEP, headers=None, timeout=120):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        key = self.key if key is KEEP else key
        if key is not None:
            req.add_header("Authorization", "Bearer " + key)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with OPENER.open(req, timeout=timeout) as resp:
                return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())

    def post(self, path, body, **kw):
        return self.call("POST", path, body=body, **kw)

    def metrics(self):
        return parse_metrics(self.call("GET", "/metrics", key=None).body.decode())


# ----------------------------------------------------------------------------- helpers
def shape(value):
    """The keys and value types of a JSON document, values left out (lists: the shape of
    each distinct element, in order)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        out = []
        for item in value:
            s = shape(item)
            if s not in out:
                out.append(s)
        return out
    if value is None:
        return "null"
    return type(value).__name__


def error_of(reply, message=True):
    """An error answer: its status and error object (type, code, param, the message when
    `message`; "head": its first paragraph), and its shape."""
    try:
        doc = reply.json()
    except ValueError:
        return {"status": reply.status, "body": reply.body[:200].decode("utf-8", "replace")}
    err = doc.get("error") if isinstance(doc, dict) else None
    out = {"status": reply.status, "shape": shape(doc)}
    if isinstance(err, dict):
        out.update(type=err.get("type"), code=err.get("code"), param=err.get("param"))
        if message == "head":
            out["message"] = str(err.get("message")).split("\n\n")[0]
        elif message:
            out["message"] = err.get("message")
    else:
        out["body"] = doc
    return out


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{"types": {family: type}, "samples": [(name, {label: value}, float)]}."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            types[family] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if m:
                samples.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return {"types": types, "samples": samples}


def family_type(types, name):
    for suffix in ("", "_bucket", "_sum", "_count"):
        if suffix and name.endswith(suffix) and name[: -len(suffix)] in types:
            return types[name[: -len(suffix)]]
        if not suffix and name in types:
            return types[name]
    return None


def total(metrics, name, **labels):
    return sum(
        v for n, lab, v in metrics["samples"] if n == name and all(lab.get(k) == want for k, want in labels.items())
    )


COUNTED = {
    "generation_tokens": ("vllm:generation_tokens_total", {}),
    "prompt_tokens": ("vllm:prompt_tokens_total", {}),
    "finished_length": ("vllm:request_success_total", {"finished_reason": "length"}),
    "finished_stop": ("vllm:request_success_total", {"finished_reason": "stop"}),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", {}),
    "e2e_count": ("vllm:e2e_request_latency_seconds_count", {}),
    "request_generation_tokens_sum": ("vllm:request_generation_tokens_sum", {}),
    "request_prompt_tokens_sum": ("vllm:request_prompt_tokens_sum", {}),
}


def counted(metrics):
    return {key: total(metrics, name, **labels) for key, (name, labels) in COUNTED.items()}


def wait_idle(client, budget=60.0):
    """Until the server runs and queues nothing (a request cut by a test has ended)."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        m = client.metrics()
        if total(m, "vllm:num_requests_running") == 0 and total(m, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.2)
    raise AssertionError("%s still busy after %s s" % (client.base, budget))


class InFlight:
    """One long streamed completion held open until close() (which cuts it)."""

    def __init__(self, client, max_tokens=100000):
        body = {"model": client.served, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        req = urllib.request.Request(
            client.base + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + client.key, "Content-Type": "application/json"},
        )
        self.resp = OPENER.open(req, timeout=120)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            while not self.stop.is_set() and self.resp.readline():
                pass
        except Exception:  # noqa: BLE001 - close() cuts the stream under this reader
            pass

    def close(self):
        self.stop.set()
        try:
            self.resp.fp.raw._sock.shutdown(2)  # noqa: SLF001 - cut the connection now, as a client that goes away
        except (AttributeError, OSError):
            pass
        self.resp.close()
        self.thread.join(10)


# ----------------------------------------------------------------------------- points
class Point:
    def __init__(self, name, observe, expect=None, standin_differs=None):
        self.name, self.observe, self.expect, self.standin_differs = name, observe, expect, standin_differs


POINTS = []


def point(name, expect=None, standin_differs=None):
    def register(fn):
        POINTS.append(Point(name, fn, expect, standin_differs))
        return fn

    return register


def _hello(c, **extra):
    return dict({"model": c.served, "prompt": "hello world", "max_tokens": 5, "ignore_eos": True}, **extra)


def _chat(c, **extra):
    return dict(
        {"model": c.served, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "ignore_eos": True},
        **extra,
    )


@point("401 without a key", expect=lambda o: o["models"]["status"] == 401 == o["completions"]["status"])
def no_key(c):
    return {
        "models": error_of(c.call("GET", "/v1/models", key=None)),
        "completions": error_of(c.post("/v1/completions", _hello(c), key=None)),
    }


@point("401 with a wrong key", expect=lambda o: o["status"] == 401)
def wrong_key(c):
    return error_of(c.call("GET", "/v1/models", key=c.key + "x"))


@point("the key a rotation replaces is accepted too (--api-key of two keys)", expect=lambda o: o == 200)
def previous_key(c):
    return c.call("GET", "/v1/models", key=engine.previous_key(c.key)).status


@point("the key's scheme is case-insensitive (bearer)", expect=lambda o: o == 200)
def lower_scheme(c):
    return c.call("GET", "/v1/models", key=None, headers={"Authorization": "bearer " + c.key}).status


@point("/health answers without a key, empty", expect=lambda o: o == {"status": 200, "body": ""})
def health(c):
    r = c.call("GET", "/health", key=None)
    return {"status": r.status, "body": r.body.decode()}


@point("/metrics answers without a key, as text", expect=lambda o: o == [200, "text/plain"])
def metrics_open(c):
    r = c.call("GET", "/metrics", key=None)
    return [r.status, r.headers.get("content-type", "").split(";")[0]]


@point("/version", expect=lambda o: o == {"status": 200, "body": {"version": "0.15.1"}})
def version(c):
    r = c.call("GET", "/version", key=None)
    return {"status": r.status, "body": r.json()}


@point(
    "/v1/models: fields, the served name, root and max_model_len",
    expect=lambda o: o["ids"] == ["Qwen3.8-27B-INT8-W8A8-Dynamic"] and o["root_is_model"],
)
def models(c):
    r = c.call("GET", "/v1/models")
    doc = r.json()
    first = doc["data"][0]
    return {
        "status": r.status,
        "shape": shape(doc),
        "object": doc["object"],
        "ids": [m["id"] for m in doc["data"]],
        "owned_by": first["owned_by"],
        "root_is_model": first["root"] == c.model_dir,
        "parent": first["parent"],
        "max_model_len_is_served": first["max_model_len"] == c.max_model_len,
        "permission_object": first["permission"][0]["object"],
    }


@point("404 for an unknown model (completions and chat)", expect=lambda o: o["completions"]["status"] == 404)
def unknown_model(c):
    return {
        "completions": error_of(c.post("/v1/completions", _hello(c, model="no-such-model"))),
        "chat": error_of(c.post("/v1/chat/completions", _chat(c, model="no-such-model"))),
    }


@point("404 for an unknown path under /v1", expect=lambda o: o["status"] == 404)
def unknown_path(c):
    return error_of(c.call("GET", "/v1/no-such-path"))


@point("400 for a prompt over the context (completions)", expect=lambda o: o["status"] == 400)
def prompt_over_context(c):
    # "hello" and " hello" are one token each in the sim model's vocabulary.
    prompt = "hello" + " hello" * c.max_model_len
    return error_of(c.post("/v1/completions", _hello(c, prompt=prompt, max_tokens=4)))


@point("400 for a prompt over the context (chat)", expect=lambda o: o["status"] == 400)
def chat_over_context(c):
    messages = [{"role": "user", "content": "hello" + " hello" * c.max_model_len}]
    return error_of(c.post("/v1/chat/completions", _chat(c, messages=messages)))


@point("400 for max_tokens above the context (completions)", expect=lambda o: o["status"] == 400)
def max_tokens_over_context(c):
    return error_of(c.post("/v1/completions", _hello(c, max_tokens=c.max_model_len + 1)))


@point("400 for a prompt plus max_tokens over the context (completions)", expect=lambda o: o["status"] == 400)
def prompt_plus_max_tokens(c):
    return error_of(c.post("/v1/completions", _hello(c, max_tokens=c.max_model_len)))


@point("400 for a prompt plus max_tokens over the context (chat)", expect=lambda o: o["status"] == 400)
def chat_prompt_plus_max_tokens(c):
    return error_of(c.post("/v1/chat/completions", _chat(c, max_tokens=c.max_model_len)))


# FastAPI's validation errors: vllm's message ends with the endpoint's source file and
# line (its install path), after a blank line; the part before it is compared.
@point("400 for a body that is not JSON", expect=lambda o: o["status"] == 400 and o["type"] == "Bad Request")
def bad_json(c):
    return error_of(c.post("/v1/completions", None, raw=b'{"model": '), message="head")


@point("a JSON body that is not an object: a plain 500", expect=lambda o: o["status"] == 500)
def body_not_object(c):
    r = c.post("/v1/completions", None, raw=b"[1, 2]")
    return {"status": r.status, "content_type": r.headers.get("content-type"), "body": r.body.decode()}


@point(
    "400 for a request without its prompt or messages",
    expect=lambda o: o["completions"]["status"] == 400 == o["chat"]["status"],
)
def missing_prompt(c):
    return {
        "completions": error_of(c.post("/v1/completions", {"model": c.served}), message="head"),
        "chat": error_of(c.post("/v1/chat/completions", {"model": c.served}), message="head"),
    }


@point("400 for max_tokens 0", expect=lambda o: o["status"] == 400 and o["param"] == "max_tokens")
def max_tokens_zero(c):
    return error_of(c.post("/v1/completions", _hello(c, max_tokens=0)))


@point(
    "a completion: fields, finish_reason and usage",
    expect=lambda o: o["finish_reason"] == "length" and o["usage"]["completion_tokens"] == 5,
)
def completion(c):
    r = c.post("/v1/completions", _hello(c))
    doc = r.json()
    return {
        "status": r.status,
        "shape": shape(doc),
        "object": doc["object"],
        "model": doc["model"],
        "finish_reason": doc["choices"][0]["finish_reason"],
        "usage": doc["usage"],
    }


@point(
    "a chat completion: message fields (reasoning, reasoning_content), finish_reason and usage",
    expect=lambda o: o["message_nulls"]["reasoning"] is None and o["usage"]["completion_tokens"] == 4,
)
def chat(c):
    r = c.post("/v1/chat/completions", _chat(c))
    doc = r.json()
    msg = doc["choices"][0]["message"]
    return {
        "status": r.status,
        "shape": shape(doc),
        "object": doc["object"],
        "role": msg["role"],
        # Without <think> in the output both are null (vllm's ChatMessage copies reasoning
        # into the deprecated reasoning_content).
        "message_nulls": {k: msg.get(k, "absent") for k in ("reasoning", "reasoning_content", "refusal")},
        "tool_calls": msg["tool_calls"],
        "finish_reason": doc["choices"][0]["finish_reason"],
        "usage": doc["usage"],
    }


def _any_finish(docs):
    """The chunks with each choice's finish_reason as one placeholder: how many chunks the
    tokens come in is the engine's timing (a loaded real vLLM sent three tokens and the finish
    in one chunk, where it usually sends a chunk a token), so a chunk's shape is compared
    whether it ends the stream or not; which finish reasons came is compared apart. Likewise
    stop_reason, which the chunk that finishes carries (null) and the chunks before it do not:
    a null one is left out of the shape (a loaded real vLLM sent its four tokens in two chunks,
    so none came without it, where the stand-in sends a chunk a token), and `_stream` compares apart
    that the finishing chunk carries it."""
    out = []
    for d in docs:
        d = dict(d)
        if isinstance(d.get("choices"), list):
            d["choices"] = [
                {k: v for k, v in dict(ch, finish_reason="<finish>").items() if not (k == "stop_reason" and v is None)}
                if "finish_reason" in ch
                else ch
                for ch in d["choices"]
            ]
        out.append(d)
    return out


def _stream(c, path, body):
    r = c.post(path, body)
    problems, payloads = r.events()
    docs = [json.loads(p) for p in payloads if p != "[DONE]"]
    choices = [ch for d in docs for ch in d.get("choices", [])]
    usage = [d["usage"] for d in docs if d.get("usage")]
    return {
        "status": r.status,
        "content_type": r.headers.get("content-type"),
        "framing": problems,
        "done_last": bool(payloads) and payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1,
        "chunk_shapes": shape(_any_finish(docs)),
        "finish_reasons": [ch["finish_reason"] for ch in choices if ch.get("finish_reason")],
        "stop_reason_with_the_finish": ["stop_reason" in ch for ch in choices if ch.get("finish_reason")],
        "usage_chunks": [{"choices": d["choices"], "usage": d["usage"]} for d in docs if d.get("usage")],
        "usage": usage[-1] if usage else None,
    }


@point(
    "a streamed completion with usage: SSE framing, [DONE], finish_reason, the usage chunk",
    expect=lambda o: (
        o["framing"] == []
        and o["done_last"]
        and o["finish_reasons"] == ["length"]
        and o["usage"]["completion_tokens"] == 7
    ),
)
def stream_completion(c):
    return _stream(c, "/v1/completions", _hello(c, max_tokens=7, stream=True, stream_options={"include_usage": True}))


@point(
    "a streamed completion without usage: no usage chunk", expect=lambda o: o["done_last"] and o["usage_chunks"] == []
)
def stream_completion_no_usage(c):
    return _stream(c, "/v1/completions", _hello(c, max_tokens=3, stream=True))


@point(
    "a streamed chat completion with usage: role first, deltas, finish_reason, the usage chunk",
    expect=lambda o: (
        o["framing"] == []
        and o["done_last"]
        and o["finish_reasons"] == ["length"]
        and o["usage"]["completion_tokens"] == 4
    ),
)
def stream_chat(c):
    return _stream(c, "/v1/chat/completions", _chat(c, stream=True, stream_options={"include_usage": True}))


# Token-level output, as library/golden_outputs.py asks for it (logprobs 0 and
# return_tokens_as_token_ids, greedy, fixed length): vLLM 0.15.1's
# OpenAIServingCompletion._create_completion_logprobs (entrypoints/openai/completion/serving.py).
# The tokens and the keys of top_logprobs are the generated tokens (their ids or texts differ
# between the two models): the shape is taken with those keys replaced by "<token N>", and
# what the product relies on is kept as facts.
TOKEN_ID = re.compile(r"^token_id:\d+$")


def _greedy(c, **extra):
    return _hello(c, **dict({"max_tokens": 6, "temperature": 0, "logprobs": 0}, **extra))


def _token_keys(doc):
    """The document with the keys of every top_logprobs entry replaced by "<token N>"."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k == "top_logprobs" and isinstance(v, list):
                out[k] = [
                    {"<token %d>" % i: x for i, x in enumerate(entry.values())} if isinstance(entry, dict) else entry
                    for entry in v
                ]
            else:
                out[k] = _token_keys(v)
        return out
    if isinstance(doc, list):
        return [_token_keys(x) for x in doc]
    return doc


def _logprob_facts(lp, initial_offset=0):
    """What the product relies on in a choice's logprobs (None when there are none)."""
    if not isinstance(lp, dict):
        return None
    tokens, top = lp["tokens"], lp["top_logprobs"]
    offsets, at = [], initial_offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "lengths": [len(lp[k]) for k in ("text_offset", "token_logprobs", "tokens", "top_logprobs")],
        "tokens_are_ids": all(TOKEN_ID.match(t) for t in tokens),
        "top_first_is_the_token": all(next(iter(e)) == t for e, t in zip(top, tokens, strict=True)),
        "top_sizes": [len(e) for e in top],
        "top_logprob_of_the_token": all(e[t] == v for e, t, v in zip(top, tokens, lp["token_logprobs"], strict=True)),
        "logprobs_at_most_0": all(v <= 0 for v in lp["token_logprobs"]),
        "text_offset_runs_over_the_token_strings": lp["text_offset"] == offsets,
    }


@point(
    "token ids of a greedy completion (logprobs 0, return_tokens_as_token_ids): the golden outputs' request",
    expect=lambda o: (
        o["status"] == 200
        and o["facts"] is not None
        and o["facts"]["tokens_are_ids"]
        and o["facts"]["lengths"] == [6, 6, 6, 6]
        and o["facts"]["top_sizes"] == [1] * 6
        and o["facts"]["text_offset_runs_over_the_token_strings"]
        and o["usage"] == 6
    ),
)
def token_ids(c):
    r = c.post("/v1/completions", _greedy(c, return_tokens_as_token_ids=True, repetition_penalty=1.0, n=1))
    doc = r.json()
    return {
        "status": r.status,
        "shape": shape(_token_keys(doc)),
        "facts": _logprob_facts(doc["choices"][0]["logprobs"]),
        "usage": doc["usage"]["completion_tokens"],
    }


@point(
    "logprobs 0 without return_tokens_as_token_ids: the tokens as text",
    expect=lambda o: (
        o["facts"] is not None
        and not o["facts"]["tokens_are_ids"]
        and o["facts"]["text_offset_runs_over_the_token_strings"]
    ),
)
def token_texts(c):
    doc = c.post("/v1/completions", _greedy(c)).json()
    return {"shape": shape(_token_keys(doc)), "facts": _logprob_facts(doc["choices"][0]["logprobs"])}


@point(
    "logprobs 2: the token and one other in top_logprobs (greedy: the token is the most likely)",
    expect=lambda o: o is not None and o["top_sizes"] == [2, 2, 2] and o["top_first_is_the_token"],
)
def top_two(c):
    doc = c.post("/v1/completions", _greedy(c, max_tokens=3, logprobs=2, return_tokens_as_token_ids=True)).json()
    return _logprob_facts(doc["choices"][0]["logprobs"])


@point(
    "return_tokens_as_token_ids without logprobs: logprobs null",
    expect=lambda o: o == [None],
)
def token_ids_without_logprobs(c):
    doc = c.post("/v1/completions", _hello(c, max_tokens=2, return_tokens_as_token_ids=True)).json()
    return [ch["logprobs"] for ch in doc["choices"]]


@point(
    "a streamed completion with logprobs: the tokens in order over the chunks, one or more a chunk "
    "(vLLM sends several when the engine runs ahead of the client: 2 a chunk on a loaded machine), "
    "text_offset the text streamed before each chunk",
    expect=lambda o: o["tokens"] == 4 and o["chunks"] == [[True, True, True]] and o["offsets_run_over_the_text"],
)
def stream_token_ids(c):
    r = c.post("/v1/completions", _greedy(c, max_tokens=4, return_tokens_as_token_ids=True, stream=True))
    _, payloads = r.events()
    docs = [json.loads(p) for p in payloads if p != "[DONE]"]
    choices = [ch for d in docs for ch in d["choices"]]
    # What holds for every chunk, whatever their number: token ids, the chosen token first in
    # its top_logprobs, one logprob and one top entry per token.
    chunks, offsets, text, tokens = set(), [], 0, 0
    for ch in choices:
        lp = ch["logprobs"]
        if not isinstance(lp, dict):
            chunks.add(json.dumps(None))
            continue
        facts = _logprob_facts(lp, lp["text_offset"][0])
        n = len(lp["tokens"])
        tokens += n
        whole = len(lp["top_logprobs"]) == len(lp["token_logprobs"]) == n
        chunks.add(json.dumps([facts["tokens_are_ids"], facts["top_first_is_the_token"], whole]))
        offsets.append(lp["text_offset"][0] == text)
        text += len(ch["text"])
    return {
        "chunk_shapes": shape(_token_keys(docs)),
        "tokens": tokens,
        "chunks": sorted(json.loads(x) for x in chunks),
        "offsets_run_over_the_text": bool(offsets) and all(offsets),
    }


@point(
    "400 for logprobs below 0 and above the maximum (20)",
    expect=lambda o: o["negative"]["param"] == "logprobs" == o["over"]["param"] and o["over"]["status"] == 400,
)
def logprobs_refused(c):
    return {
        "negative": error_of(c.post("/v1/completions", _hello(c, logprobs=-1)), message="head"),
        "over": error_of(c.post("/v1/completions", _hello(c, logprobs=21))),
    }


@point(
    "every metric the product, the alert rules and the dashboard read: type and labels",
    expect=lambda o: all(v["type"] for v in o.values()),
)
def metric_names(c):
    m = c.metrics()
    out = {}
    for name in read_metric_names():
        rows = [lab for n, lab, _ in m["samples"] if n == name]
        out[name] = {
            "type": family_type(m["types"], name),
            "labels": sorted({k for lab in rows for k in lab}),
            "model_name": sorted({lab.get("model_name") for lab in rows}),
        }
        if name.endswith("_bucket"):
            out[name]["le"] = sorted({lab["le"] for lab in rows}, key=float)
        if name == "vllm:request_success_total":
            out[name]["finished_reason"] = sorted({lab["finished_reason"] for lab in rows})
    return out


@point("the counters move by exactly what was served", expect=lambda o: o["deltas"] == o["served"])
def counters_move(c):
    wait_idle(c)
    before = counted(c.metrics())
    usages = [
        c.post("/v1/completions", _hello(c)).json()["usage"],
        c.post("/v1/chat/completions", _chat(c)).json()["usage"],
    ]
    streamed = _stream(
        c, "/v1/completions", _hello(c, max_tokens=7, stream=True, stream_options={"include_usage": True})
    )
    usages.append(streamed["usage"])
    served = {
        "generation_tokens": sum(u["completion_tokens"] for u in usages),
        "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
        "finished_length": 3,
        "finished_stop": 0,
        "ttft_count": 3,
        "e2e_count": 3,
    }
    served["request_generation_tokens_sum"] = served["generation_tokens"]
    served["request_prompt_tokens_sum"] = served["prompt_tokens"]
    # The engine's statistics reach /metrics just after the last answer: wait for them.
    deadline = time.monotonic() + 10
    while True:
        after = counted(c.metrics())
        deltas = {k: after[k] - before[k] for k in after}
        if deltas == served or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"deltas": deltas, "served": served}


# ----------------------------------------------------------------------------- routes
# Every route of the real server's table (route_table.py: its FastAPI app as vLLM 0.15.1 builds
# it with the serve role's flags and environment) is sent the same requests on both servers
# (test_routes.py): without a key, with a wrong one, with the key; a route that reads a JSON
# body also with a body of another content type, an empty object and a JSON list. The request
# a route gets is ROUTE_PROBES' (one that changes nothing on the server: /pause and
# /scale_elastic_ep get requests they refuse before acting), else a plain GET or a POST of
# `{}`, so a route a new pin adds is probed too. What is compared: route_answer.
BOUNDARY = "kf-contract-boundary"


def form(fields, boundary=BOUNDARY):
    """A multipart/form-data body; a field whose value is bytes is an uploaded file."""
    out = b""
    for name, value in fields.items():
        head = 'Content-Disposition: form-data; name="%s"' % name
        if isinstance(value, bytes):
            head += '; filename="%s.wav"\r\nContent-Type: audio/wav' % name
        else:
            value = value.encode()
        out += b"--%s\r\n%s\r\n\r\n%s\r\n" % (boundary.encode(), head.encode(), value)
    return out + b"--%s--\r\n" % boundary.encode()


def route_probes(c):
    """{(method, path): (filled path, Client.call keywords)} for the routes that need a body,
    a path parameter or a harmless request."""
    m = c.served
    audio = {
        "raw": form({"file": b"RIFF", "model": m}),
        "headers": {"Content-Type": "multipart/form-data; boundary=" + BOUNDARY},
    }
    pooling = {"body": {"model": m, "input": "hello"}}
    rerank = {"body": {"model": m, "query": "hello", "documents": ["world"]}}
    score = {"body": {"model": m, "text_1": "hello", "text_2": "world"}}
    return {
        # Refused before it scales (no size): nothing changes.
        ("POST", "/scale_elastic_ep"): ("/scale_elastic_ep", {"body": {}}),
        ("POST", "/tokenize"): ("/tokenize", {"body": {"model": m, "prompt": "hello world"}}),
        ("POST", "/detokenize"): ("/detokenize", {"body": {"model": m, "tokens": [543, 312]}}),
        ("POST", "/inference/v1/generate"): (
            "/inference/v1/generate",
            {"body": {"model": m, "token_ids": [543, 312], "sampling_params": {"max_tokens": 2, "ignore_eos": True}}},
        ),
        # Refused before it pauses (a query value that is not a boolean): nothing changes.
        ("POST", "/pause"): ("/pause?wait_for_inflight_requests=maybe", {}),
        ("POST", "/v1/chat/completions"): ("/v1/chat/completions", {"body": _chat(c, max_tokens=2)}),
        ("POST", "/v1/chat/completions/render"): (
            "/v1/chat/completions/render",
            {"body": {"model": m, "messages": [{"role": "user", "content": "hello"}]}},
        ),
        ("POST", "/v1/responses"): (
            "/v1/responses",
            {"body": {"model": m, "input": "hello", "max_output_tokens": 2, "temperature": 0}},
        ),
        ("GET", "/v1/responses/{response_id}"): ("/v1/responses/resp_0", {}),
        ("POST", "/v1/responses/{response_id}/cancel"): ("/v1/responses/resp_0/cancel", {}),
        ("POST", "/v1/audio/transcriptions"): ("/v1/audio/transcriptions", audio),
        ("POST", "/v1/audio/translations"): ("/v1/audio/translations", audio),
        ("POST", "/v1/completions"): ("/v1/completions", {"body": _hello(c, max_tokens=2)}),
        ("POST", "/v1/completions/render"): ("/v1/completions/render", {"body": {"model": m, "prompt": "hello"}}),
        ("POST", "/v1/messages"): (
            "/v1/messages",
            {
                "body": {
                    "model": m,
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 2,
                    "temperature": 0,
                }
            },
        ),
        ("POST", "/invocations"): ("/invocations", {"body": _hello(c, max_tokens=2)}),
        ("POST", "/classify"): ("/classify", pooling),
        ("POST", "/v1/embeddings"): ("/v1/embeddings", pooling),
        ("POST", "/pooling"): ("/pooling", pooling),
        ("POST", "/score"): ("/score", score),
        ("POST", "/v1/score"): ("/v1/score", score),
        ("POST", "/rerank"): ("/rerank", rerank),
        ("POST", "/v1/rerank"): ("/v1/rerank", rerank),
        ("POST", "/v2/rerank"): ("/v2/rerank", rerank),
    }


def route_requests(c, route):
    """[(case, method, path, Client.call keywords)]: every request a route of the table gets."""
    probes = route_probes(c)
    if route["mount"]:
        # A mounted app serves every path under it, any method.
        targets = [("GET", route["path"] + "/probe", {}), ("POST", route["path"], {})]
    else:
        targets = []
        for method in route["methods"]:
            if method == "HEAD" and "GET" in route["methods"]:
                continue  # HEAD is probed apart (the router's points)
            path, kw = probes.get((method, route["path"]), (None, None))
            if path is None:
                path, kw = re.sub(r"\{[^}]+\}", "x", route["path"]), ({"body": {}} if method == "POST" else {})
            targets.append((method, path, kw))
    out = []
    for method, path, kw in targets:
        out += [
            ("no key", method, path, dict(kw, key=None)),
            ("a wrong key", method, path, dict(kw, key=c.key + "x")),
            ("the key", method, path, kw),
        ]
        if route["json_body"]:
            data = json.dumps(kw.get("body", {})).encode()
            out += [
                ("a text/plain body", method, path, {"raw": data, "headers": {"Content-Type": "text/plain"}}),
                ("an empty object", method, path, {"body": {}}),
                ("a JSON list", method, path, {"raw": b"[1]"}),
            ]
    return out


# The part of an answer whose shape depends on where the engine stopped (a random model may
# end before max_tokens): its shape is not compared.
VOLATILE = ("incomplete_details",)


def _steady(doc):
    if isinstance(doc, dict):
        return {k: ("<stop-dependent>" if k in VOLATILE else _steady(v)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_steady(x) for x in doc]
    return doc


def route_answer(reply):
    """What is compared of a route's answer: status and media type; an error's type, code,
    param and message (its first paragraph); another JSON answer's shape; /openapi.json's
    routes (path: methods)."""
    media = (reply.headers.get("content-type") or "").split(";")[0] or None
    out = {"status": reply.status, "media_type": media}
    if media == "application/json":
        try:
            doc = reply.json()
        except ValueError:
            out["body"] = reply.body[:200].decode("utf-8", "replace")
            return out
        if isinstance(doc, dict) and "error" in doc:
            out["error"] = error_of(reply, message="head")
        elif isinstance(doc, dict) and "openapi" in doc:
            out["routes"] = {p: sorted(ms) for p, ms in doc["paths"].items()}
        else:
            out["shape"] = shape(_steady(doc))
    elif media == "text/plain" and reply.status >= 400:
        out["body"] = reply.body.decode("utf-8", "replace")
    return out


NOT_SERVED = ({"detail": "Not Found"}, {"detail": "Method Not Allowed"})


def routed(reply):
    """False when the router answered (no route of that path or method), not a route."""
    try:
        return reply.status not in (404, 405) or reply.json() not in NOT_SERVED
    except ValueError:
        return True


# ----------------------------------------------------------------------------- routes outside /v1
# The API key is asked for on /v1 only (AuthenticationMiddleware): what the rest serves to
# anyone who reaches the port, which the firewall has to contain.
@point(
    "/invocations serves completions and chats without a key, streamed too",
    expect=lambda o: (
        o["completion"]["status"] == 200 == o["chat"]["status"]
        and o["completion"]["usage"]["completion_tokens"] == 3
        and o["stream"]["done_last"]
        and o["stream"]["usage"]["completion_tokens"] == 3
    ),
)
def invocations(c):
    def answer(body):
        r = c.post("/invocations", body, key=None)
        doc = r.json()
        return {"status": r.status, "shape": shape(doc), "object": doc["object"], "usage": doc["usage"]}

    streamed = _hello(c, max_tokens=3, stream=True, stream_options={"include_usage": True})
    r = c.post("/invocations", streamed, key=None)
    problems, payloads = r.events()
    docs = [json.loads(p) for p in payloads if p != "[DONE]"]
    usage = [d["usage"] for d in docs if d.get("usage")]
    return {
        "completion": answer(_hello(c, max_tokens=3)),
        "chat": answer(_chat(c, max_tokens=3)),
        "stream": {
            "status": r.status,
            "framing": problems,
            "done_last": bool(payloads) and payloads[-1] == "[DONE]",
            "chunk_shapes": shape(_any_finish(docs)),
            "usage": usage[-1] if usage else None,
        },
        "neither": error_of(c.post("/invocations", {"model": c.served}, key=None)),
        "not_json": error_of(c.post("/invocations", None, raw=b'{"prompt": ', key=None)),
    }


@point(
    "/tokenize and /detokenize without a key: the model's token ids and text",
    expect=lambda o: o["hello"]["tokens"] == [543, 312, 261, 75, 67] and o["round_trip"] == "hello world",
)
def tokens(c):
    def tokenize(body):
        r = c.post("/tokenize", body, key=None)
        return r.json() if r.status == 200 else error_of(r)

    def detokenize(ids):
        r = c.post("/detokenize", {"tokens": ids}, key=None)
        return r.json()["prompt"] if r.status == 200 else error_of(r, message="head")

    hello = tokenize({"prompt": "hello world"})
    return {
        "hello": hello,
        "specials_and_utf8": tokenize({"prompt": "a <|im_end|> é 日本", "return_token_strs": True}),
        "chat": tokenize({"model": c.served, "messages": [{"role": "user", "content": "hi"}]}),
        "chat_no_generation_prompt": tokenize(
            {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}
        ),
        "unknown_model": tokenize({"model": "no-such-model", "prompt": "x"}),
        "round_trip": detokenize(hello.get("tokens", [])),
        "special_and_partial_utf8": detokenize([994, 5, 127]),
        "unknown_id": detokenize([4294967295, 5]),
        "out_of_range": detokenize([-1]),
    }


@point(
    "/inference/v1/generate generates without a key (token ids in and out, never streamed)",
    expect=lambda o: o["plain"]["status"] == 200 and o["plain"]["lengths"] == [3] and o["stream"]["status"] == 200,
)
def generate_tokens(c):
    def answer(**extra):
        body = dict({"token_ids": [543, 312], "sampling_params": {"max_tokens": 3, "ignore_eos": True}}, **extra)
        r = c.post("/inference/v1/generate", body, key=None)
        doc = r.json()
        return {
            "status": r.status,
            "media_type": r.headers.get("content-type"),
            "shape": shape(doc),
            "lengths": [len(ch["token_ids"]) for ch in doc.get("choices", [])],
            "finish": [ch["finish_reason"] for ch in doc.get("choices", [])],
        }

    return {"plain": answer(), "stream": answer(stream=True)}


def _stream_until_cut(c, results):
    """A long streamed completion; `results` gets its status and last finish_reason."""
    body = {"model": c.served, "prompt": "hello", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    r = c.post("/v1/completions", body, timeout=300)
    _, payloads = r.events()
    docs = [json.loads(p) for p in payloads if p != "[DONE]"]
    reasons = [ch.get("finish_reason") for d in docs for ch in d.get("choices", []) if ch.get("finish_reason")]
    results.update(status=r.status, finish=reasons[-1:], done_last=bool(payloads) and payloads[-1] == "[DONE]")


@point(
    "/pause without a key cuts every request in flight (finish_reason abort) until /resume",
    expect=lambda o: (
        o["pause"] == {"status": "paused"}
        and o["cut"] == {"status": 200, "finish": ["abort"], "done_last": True}
        and o["paused"] == {"is_paused": True}
        and o["resumed"] == {"is_paused": False}
        and o["served_after"] == 200
    ),
)
def pause(c):
    wait_idle(c)
    results = {}
    reader = threading.Thread(target=_stream_until_cut, args=(c, results), daemon=True)
    reader.start()
    # Until the engine runs it.
    deadline = time.monotonic() + 60
    while total(c.metrics(), "vllm:num_requests_running") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        paused = c.post("/pause", None, key=None).json()
        reader.join(60)
        during = c.call("GET", "/is_paused", key=None).json()
    finally:
        resumed = c.post("/resume", None, key=None).json()
    return {
        "pause": paused,
        "cut": results,
        "paused": during,
        "resume": resumed,
        "resumed": c.call("GET", "/is_paused", key=None).json(),
        "pause_twice": [c.post("/pause", None, key=None).json(), c.post("/pause", None, key=None).json()],
        "resume_again": c.post("/resume", None, key=None).json(),
        "served_after": c.post("/v1/completions", _hello(c, max_tokens=1)).status,
        "bad_query": error_of(c.post("/pause?clear_cache=maybe", None, key=None), message="head"),
    }


@point(
    "/scale_elastic_ep without a key: the same size skips, another fails (one engine), bad sizes refused",
    expect=lambda o: o["same"]["status"] == 200 and o["other"]["status"] == 500 and o["health_after"] == 200,
)
def scale(c):
    def answer(body, raw=None):
        r = c.post("/scale_elastic_ep", body, raw=raw, key=None)
        return error_of(r) if r.status != 200 else {"status": 200, "body": r.json()}

    return {
        "same": answer({"new_data_parallel_size": 1}),
        "other": answer({"new_data_parallel_size": 2, "drain_timeout": 5}),
        "zero": answer({"new_data_parallel_size": 0}),
        "bad_timeout": answer({"new_data_parallel_size": 1, "drain_timeout": 0}),
        "not_json": answer(None, raw=b"{"),
        "scaling": c.post("/is_scaling_elastic_ep", None, key=None).json(),
        "health_after": c.call("GET", "/health", key=None).status,
    }


def _sse(reply):
    """An SSE answer: (event name, shape of its data) in order, each distinct pair once."""
    out = []
    for block in reply.body.decode("utf-8").split("\n\n"):
        if not block:
            continue
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
        item = [name, "[DONE]" if data == "[DONE]" else shape(_steady(json.loads(data)))]
        if item not in out:
            out.append(item)
    return out


# These APIs have no ignore_eos: greedy decoding makes where the real model stops the same on every run.
GREEDY = {"temperature": 0}


@point(
    "/v1/messages and /v1/responses streamed: their events",
    expect=lambda o: o["messages"]["status"] == 200 == o["responses"]["status"],
)
def other_streams(c):
    messages = c.post(
        "/v1/messages",
        {"model": c.served, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True, **GREEDY},
    )
    responses = c.post(
        "/v1/responses", {"model": c.served, "input": "hi", "max_output_tokens": 4, "stream": True, **GREEDY}
    )
    return {
        "messages": {"status": messages.status, "events": _sse(messages)},
        "responses": {"status": responses.status, "events": _sse(responses)},
        "messages_unknown_model": error_of(
            c.post("/v1/messages", {"model": "no-such-model", "messages": [], "max_tokens": 2})
        ),
        "responses_background": error_of(
            c.post("/v1/responses", {"model": c.served, "input": "hi", "background": True})
        ),
    }


@point(
    "before a route: 405 with its methods, a 307 to the other form of the path, %-escapes decoded, HEAD",
    expect=lambda o: o["slash"]["status"] == 307 and o["escaped_no_key"] == 401 and o["head_health"] == 405,
)
def router(c):
    slash = c.post("/invocations/", _hello(c, max_tokens=1), key=None)
    return {
        "method": [
            c.call("GET", "/invocations", key=None).status,
            c.call("PUT", "/ping", key=None).headers.get("allow"),
        ],
        "slash": {
            "status": slash.status,
            "location_path": urllib.parse.urlsplit(slash.headers.get("location", "")).path,
        },
        "escaped_no_key": c.call("GET", "/%76%31/models", key=None).status,
        "escaped": c.call("GET", "/%76%31/models").status,
        "head_health": c.call("HEAD", "/health", key=None).status,
        "head_openapi": [c.call("HEAD", "/openapi.json", key=None).status, len(c.call("HEAD", "/openapi.json").body)],
        "v1_prefix_only": c.call("GET", "/v1x", key=None).status,
    }


# ----------------------------------------------------------------------------- TLS
# Both servers run with the serve role's --ssl-keyfile and --ssl-certfile (engine.make_tls):
# vllm 0.15.1 hands them to uvicorn, whose context is Python's ssl.SSLContext(PROTOCOL_TLS_SERVER)
# with the chain loaded (uvicorn/config.py, create_ssl_context).
def _handshake(c, version=None):
    """The protocol and ALPN a client trusting the test CA negotiates (pinned to `version`
    when given), or the error the server's refusal raised."""
    parts = urllib.parse.urlsplit(c.base)
    context = ssl.create_default_context(cafile=engine.CA_FILE)
    if version is not None:
        context.minimum_version = context.maximum_version = version
        context.set_ciphers("ALL:@SECLEVEL=0")  # the client offers it; the server decides
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname=parts.hostname) as tls:
                return [tls.version(), tls.selected_alpn_protocol()]
    except (ssl.SSLError, OSError) as exc:
        return "refused (%s)" % type(exc).__name__


# What the real engine answers: TLS 1.3 by default, 1.2 when asked, no ALPN; 1.1 refused (the
# server closes the handshake: Python's minimum_version is TLS 1.2); a plain HTTP request
# read as a failed handshake, the connection closed without a byte.
TLS_PORT = {
    "default": ["TLSv1.3", None],
    "TLSv1.2": ["TLSv1.2", None],
    "TLSv1.1": "refused (SSLEOFError)",
    "plain http": "",
}


@point("the port speaks TLS 1.2 and 1.3 only; plain HTTP gets no HTTP answer", expect=lambda o: o == TLS_PORT)
def tls_port(c):
    parts = urllib.parse.urlsplit(c.base)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as raw:
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: %s\r\n\r\n" % parts.hostname.encode())
        answer = b""
        while True:
            try:
                data = raw.recv(4096)
            except OSError:
                break
            if not data:
                break
            answer += data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSVersion.TLSv1_1: asked on purpose
        old = _handshake(c, ssl.TLSVersion.TLSv1_1)
    return {
        "default": _handshake(c),
        "TLSv1.2": _handshake(c, ssl.TLSVersion.TLSv1_2),
        "TLSv1.1": old,
        "plain http": answer[:60].decode("latin-1"),
    }
