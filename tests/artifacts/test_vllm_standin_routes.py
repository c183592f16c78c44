"""The stand-in vllm 0.15.1's routes beyond the OpenAI ones, run from source without the real
engine (tests/real_engine/test_routes.py compares every route with the real server's): what
answers without the API key (everything outside /v1), the engine's controls, the routes a
generation model does not serve, and the flags that change the route table."""

import json
import threading
import urllib.error
import urllib.request

import pytest

from kunlun_fleet.sim.artifacts.model import build_model_dir
from plugins.filter.serving import vllm_argv
from standin_helpers import Server, make_dev_dir, server_env

API_KEY = "test-key-routes"
SERVED = "qwen38-test"
# The sim model's byte-level BPE, as vLLM 0.15.1's /tokenize answered for it (the real engine
# lane's tiny model carries the same tokenizer files).
HELLO_WORLD = [543, 312, 261, 75, 67]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, pins):
    d = tmp_path_factory.mktemp("models") / pins["kunlun_stack_model"]["directory"]
    build_model_dir(str(d), pins)
    return d


@pytest.fixture(scope="module")
def dev8(tmp_path_factory):
    return make_dev_dir(tmp_path_factory.mktemp("dev"), 8)


def start(tmp_path_factory, pins, model_dir, dev8, *extra):
    args = ["--model", str(model_dir), *vllm_argv(dict(pins["kunlun_stack_serving"], port=None))]
    args += ["--api-key", API_KEY, "--served-model-name", SERVED, *extra]
    env = server_env(dev8, XPU_VISIBLE_DEVICES=pins["kunlun_stack_serving_env"]["XPU_VISIBLE_DEVICES"])
    srv = Server(args, env, tmp_path_factory.mktemp("log") / "server.log")
    srv.wait_ready()
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory, pins, model_dir, dev8):
    srv = start(tmp_path_factory, pins, model_dir, dev8)
    yield srv
    srv.stop()


def call(server, method, path, body=None, key=None, raw=None, ctype="application/json", timeout=60):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(server.base + path, data=data, method=method)
    if data is not None and ctype:
        req.add_header("Content-Type", ctype)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def post(server, path, body=None, **kw):
    status, _, data = call(server, "POST", path, body, **kw)
    return status, json.loads(data) if data else None


def running(server) -> float:
    _, _, text = call(server, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:num_requests_running")


def wait_for(condition, budget=30.0):
    import time

    deadline = time.monotonic() + budget
    while not condition():
        assert time.monotonic() < deadline, "not within %s s" % budget
        time.sleep(0.05)


class LongStream:
    """A streamed completion that runs until the server ends it; its last finish_reason."""

    def __init__(self, server):
        self.finish = None
        body = {"model": SERVED, "prompt": "hello", "max_tokens": 100000, "ignore_eos": True, "stream": True}
        self.thread = threading.Thread(target=self._run, args=(server, body), daemon=True)
        self.thread.start()

    def _run(self, server, body):
        _, _, data = call(server, "POST", "/v1/completions", body, key=API_KEY, timeout=120)
        for block in data.decode().split("\n\n"):
            if block.startswith("data: {"):
                for choice in json.loads(block[len("data: ") :])["choices"]:
                    self.finish = choice["finish_reason"] or self.finish


# ----------------------------------------------------------------------------- no key outside /v1
def test_invocations_serves_completions_and_chats_without_a_key(server):
    status, doc = post(server, "/invocations", {"prompt": "hello world", "max_tokens": 3, "ignore_eos": True})
    assert status == 200 and doc["object"] == "text_completion" and doc["usage"]["completion_tokens"] == 3
    status, doc = post(server, "/invocations", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200 and doc["object"] == "chat.completion" and doc["usage"]["completion_tokens"] == 2
    body = {"prompt": "hello", "max_tokens": 2, "ignore_eos": True, "stream": True}
    status, headers, data = call(server, "POST", "/invocations", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert data.decode().endswith("data: [DONE]\n\n")
    status, doc = post(server, "/invocations", {"model": SERVED})
    assert status == 400 and doc["error"]["message"].startswith("Cannot find suitable handler for request.")
    # /v1/completions still asks for the key.
    assert post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 1})[0] == 401


def test_tokenize_and_detokenize_without_a_key(server):
    status, doc = post(server, "/tokenize", {"prompt": "hello world"})
    assert status == 200 and doc == {"count": 5, "max_model_len": 262144, "tokens": HELLO_WORLD, "token_strs": None}
    _, doc = post(server, "/tokenize", {"prompt": "hello world", "return_token_strs": True})
    assert doc["token_strs"] == ["hello", "Ġw", "or", "l", "d"]
    _, doc = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert doc["tokens"][0] == 993 and doc["count"] == 9  # <|im_start|>, the generation prompt
    assert post(server, "/detokenize", {"tokens": HELLO_WORLD}) == (200, {"prompt": "hello world"})
    status, doc = post(server, "/detokenize", {"tokens": [-1]})
    assert status == 400 and "out of range integral type conversion attempted" in doc["error"]["message"]
    status, doc = post(server, "/tokenize", {"prompt": "x", "model": "other"})
    assert status == 404 and doc["error"]["type"] == "NotFoundError"


def test_generate_token_ids_without_a_key(server):
    body = {"token_ids": HELLO_WORLD, "sampling_params": {"max_tokens": 4, "ignore_eos": True}}
    status, doc = post(server, "/inference/v1/generate", body)
    assert status == 200
    (choice,) = doc["choices"]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4
    # The ids are the model's: they decode to the words the engine says.
    _, text = post(server, "/detokenize", {"tokens": choice["token_ids"]})
    assert text["prompt"].strip()


def test_pause_cuts_requests_in_flight_and_resume_serves_again(server):
    stream = LongStream(server)
    wait_for(lambda: running(server) >= 1)
    assert post(server, "/pause") == (200, {"status": "paused"})
    stream.thread.join(30)
    assert stream.finish == "abort"
    assert post(server, "/is_paused", None)[0] == 405  # GET only
    assert json.loads(call(server, "GET", "/is_paused")[2]) == {"is_paused": True}
    held = {}
    thread = threading.Thread(
        target=lambda: held.update(status=post(server, "/invocations", {"prompt": "x", "max_tokens": 1})[0])
    )
    thread.start()
    assert post(server, "/resume") == (200, {"status": "resumed"})
    thread.join(30)
    assert held == {"status": 200}
    assert json.loads(call(server, "GET", "/is_paused")[2]) == {"is_paused": False}


def test_scale_elastic_ep_without_a_key(server):
    assert post(server, "/scale_elastic_ep", {"new_data_parallel_size": 1}) == (
        200,
        {"message": "Scaled to 1 data parallel engines"},
    )
    status, doc = post(server, "/scale_elastic_ep", {"new_data_parallel_size": 2})
    assert status == 500 and doc["error"] == {
        "message": "Scale failed",
        "type": "Internal Server Error",
        "param": None,
        "code": 500,
    }
    status, doc = post(server, "/scale_elastic_ep", {})
    assert status == 400 and doc["error"]["message"] == "new_data_parallel_size is required"
    assert post(server, "/is_scaling_elastic_ep") == (200, {"is_scaling_elastic_ep": False})


# ----------------------------------------------------------------------------- under /v1, with the key
def test_what_a_generation_model_does_not_serve_answers_200_with_an_error(server):
    for path, api in (("/v1/embeddings", "Embeddings"), ("/pooling", "Pooling"), ("/classify", "Classification")):
        status, doc = post(server, path, {"model": SERVED, "input": "x"}, key=API_KEY)
        assert status == 200 and doc["error"]["message"] == f"The model does not support {api} API", path
    status, doc = post(server, "/v2/rerank", {"query": "a", "documents": ["b"]})
    assert status == 200 and doc["error"]["code"] == 400
    status, doc = post(server, "/v1/embeddings", {"model": SERVED}, key=API_KEY)
    assert status == 400 and doc["error"]["message"].startswith("2 validation errors:")


def test_responses_and_messages(server):
    body = {"model": SERVED, "input": "hello", "max_output_tokens": 3}
    status, doc = post(server, "/v1/responses", body, key=API_KEY)
    assert status == 200 and doc["status"] == "incomplete" and doc["usage"]["output_tokens"] == 3
    assert doc["output"][0]["content"][0]["type"] == "output_text"
    status, doc = post(server, "/v1/responses/" + doc["id"], None, key=API_KEY)
    assert status == 405
    status, _, data = call(server, "GET", "/v1/responses/resp_x", key=API_KEY)
    assert status == 404 and json.loads(data)["error"]["param"] == "response_id"
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, doc = post(server, "/v1/messages", body, key=API_KEY)
    assert status == 200 and doc["stop_reason"] == "max_tokens" and doc["usage"]["output_tokens"] == 2
    status, _, data = call(server, "POST", "/v1/messages", dict(body, stream=True), key=API_KEY)
    events = [b.split("\n", 1)[0] for b in data.decode().split("\n\n") if b]
    assert events[0] == "event: message_start" and events[-2:] == ["event: message_stop", "data: [DONE]"]


def test_the_router_before_a_route(server):
    assert call(server, "GET", "/%76%31/models")[0] == 401  # decoded before the key is checked
    assert call(server, "GET", "/%76%31/models", key=API_KEY)[0] == 200
    status, headers, _ = call(server, "POST", "/invocations/", {"prompt": "x"})
    assert status == 307 and headers["location"].endswith("/invocations")
    assert call(server, "HEAD", "/health")[0] == 405
    status, headers, data = call(server, "HEAD", "/openapi.json")
    assert status == 200 and data == b"" and int(headers["content-length"]) > 0
    assert call(server, "POST", "/metrics")[0] == 200  # prometheus' app, mounted: any method
    status, headers, _ = call(server, "PUT", "/ping")
    assert status == 405 and headers["allow"] == "GET"
    status, _, data = call(server, "POST", "/tokenize", raw=b'{"prompt": "x"}', ctype="text/plain")
    assert status == 400 and "Unsupported Media Type" in json.loads(data)["error"]["message"]
    paths = json.loads(call(server, "GET", "/openapi.json")[2])["paths"]
    assert {"/invocations", "/tokenize", "/pause", "/v1/completions", "/v2/rerank"} <= set(paths)


# ----------------------------------------------------------------------------- flags
def test_load_counts_only_with_server_load_tracking(server, tmp_path_factory, pins, model_dir, dev8):
    stream = LongStream(server)
    wait_for(lambda: running(server) >= 1)
    assert json.loads(call(server, "GET", "/load")[2]) == {"server_load": 0}
    post(server, "/pause")
    stream.thread.join(30)
    post(server, "/resume")
    tracked = start(tmp_path_factory, pins, model_dir, dev8, "--enable-server-load-tracking", "--disable-fastapi-docs")
    try:
        stream = LongStream(tracked)
        wait_for(lambda: json.loads(call(tracked, "GET", "/load")[2]) == {"server_load": 1})
        post(tracked, "/pause")
        stream.thread.join(30)
        wait_for(lambda: json.loads(call(tracked, "GET", "/load")[2]) == {"server_load": 0})
        assert call(tracked, "GET", "/openapi.json")[0] == 404
        assert call(tracked, "GET", "/docs")[0] == 404
    finally:
        tracked.stop()
