"""The stand-in vllm 0.15.1 api_server, run from source on 127.0.0.1 with a small model."""

import concurrent.futures
import importlib.util
import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request

import pytest
from openai import OpenAI

import openai
from kunlun_fleet.sim.artifacts.model import build_model_dir
from plugins.filter.serving import vllm_argv
from standin_helpers import VLLM_SRC, Server, free_port, make_dev_dir, run_server_once, server_env

API_KEY = "test-key-123"
SERVED = "qwen38-test"


def serving_args(pins, model_dir, **over):
    """The product's serving flags with some changed, built by the filter the serve unit uses
    (plugins/filter/serving.py); the port is the test's own."""
    return ["--model", str(model_dir), *vllm_argv(dict(pins["kunlun_stack_serving"], port=None, **over))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, pins):
    d = tmp_path_factory.mktemp("models") / pins["kunlun_stack_model"]["directory"]
    build_model_dir(str(d), pins)
    return d


@pytest.fixture(scope="module")
def dev8(tmp_path_factory):
    return make_dev_dir(tmp_path_factory.mktemp("dev"), 8)


@pytest.fixture(scope="module")
def server(tmp_path_factory, pins, model_dir, dev8):
    """One server with the product's flags (TP 8 on 8 nodes), max-num-seqs 2 to queue."""
    args = serving_args(pins, model_dir, max_num_seqs=2) + ["--api-key", API_KEY, "--served-model-name", SERVED]
    env = server_env(
        dev8,
        KUNLUN_SIM_TOKENS_PER_SECOND="100",
        XPU_VISIBLE_DEVICES=pins["kunlun_stack_serving_env"]["XPU_VISIBLE_DEVICES"],
    )
    srv = Server(args, env, tmp_path_factory.mktemp("log") / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture()
def client(server):
    return OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def metrics(server) -> str:
    status, body = get(server.base + "/metrics")
    assert status == 200
    return body.decode()


def metric_value(text, name, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics")


# ----------------------------------------------------------------------------- flags
def test_unknown_flag_exits_2_like_argparse(tmp_path, dev8, model_dir):
    proc = run_server_once(["--model", str(model_dir), "--no-such-flag", "1"], server_env(dev8))
    assert proc.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag" in proc.stderr


def test_bad_choice_exits_2(dev8, model_dir):
    proc = run_server_once(["--model", str(model_dir), "--mamba-ssm-cache-dtype", "bfloat16"], server_env(dev8))
    assert proc.returncode == 2
    assert "argument --mamba-ssm-cache-dtype: invalid choice: 'bfloat16'" in proc.stderr


def test_product_flags_parse_to_their_values(pins, model_dir, dev8):
    args = serving_args(pins, model_dir) + [
        "--api-key",
        "k",
        "--served-model-name",
        "m",
        "--port",
        "8000",
        "--trust-remote-code",
        "--uvicorn-log-level",
        "warning",
        "--disable-log-requests",
    ]
    code = (
        "import json, sys; from vllm.entrypoints.openai.api_server import build_parser; "
        "a = build_parser().parse_args(sys.argv[1:]); print(json.dumps(vars(a)))"
    )
    proc = __import__("subprocess").run(
        [sys.executable, "-c", code, *args], env=server_env(dev8), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    ns = json.loads(proc.stdout.strip().splitlines()[-1])
    s = pins["kunlun_stack_serving"]
    assert ns["tensor_parallel_size"] == s["tensor_parallel_size"]
    assert ns["max_model_len"] == s["max_model_len"]
    assert ns["mamba_ssm_cache_dtype"] == s["mamba_ssm_cache_dtype"]
    assert ns["gpu_memory_utilization"] == s["gpu_memory_utilization"]
    assert ns["enable_prefix_caching"] is True
    assert ns["max_num_seqs"] == s["max_num_seqs"]
    assert ns["reasoning_parser"] == "qwen3" and ns["tool_call_parser"] == "qwen3_xml"
    assert ns["api_key"] == ["k"] and ns["served_model_name"] == ["m"]
    assert ns["trust_remote_code"] is True and ns["uvicorn_log_level"] == "warning"
    assert "argument 'disable_log_requests' is deprecated" in proc.stdout


# ----------------------------------------------------------------------------- refusals
def test_missing_model_dir_is_a_hub_id_error_offline(dev8, model_dir):
    shortened = str(model_dir.parent / "Qwen3.8")
    proc = run_server_once(["--model", shortened], server_env(dev8))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name'" in out
    assert shortened in out


def test_config_json_missing(tmp_path, dev8):
    d = tmp_path / "Qwen3.8-27B-W8A8-INT8-Dynamic"
    d.mkdir()
    proc = run_server_once(["--model", str(d)], server_env(dev8))
    assert proc.returncode != 0
    assert "Invalid repository ID or local directory specified" in proc.stderr
    assert "ensure the presence of a 'config.json'" in proc.stderr


def test_config_json_invalid(tmp_path, dev8, pins):
    d = tmp_path / "m"
    build_model_dir(str(d), pins)
    (d / "config.json").write_text("{not json")
    proc = run_server_once(["--model", str(d)], server_env(dev8))
    assert proc.returncode != 0
    assert "is not a valid JSON file" in proc.stderr


def test_max_model_len_beyond_config(pins, model_dir, dev8):
    proc = run_server_once(serving_args(pins, model_dir, max_model_len=300000), server_env(dev8))
    assert proc.returncode != 0
    assert (
        "User-specified max_model_len (300000) is greater than the derived max_model_len "
        "(max_position_embeddings=262144"
    ) in proc.stderr


def test_rope_scaling_beyond_native_window_refused(tmp_path, pins, dev8):
    d = tmp_path / "yarn"
    build_model_dir(str(d), pins)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
    (d / "config.json").write_text(json.dumps(cfg))
    proc = run_server_once(serving_args(pins, d, max_model_len=1048576), server_env(dev8))
    assert proc.returncode != 0
    assert "To serve at least one request with the models's max seq len (1048576)" in proc.stderr


def test_fewer_devices_than_tensor_parallel(pins, model_dir, tmp_path):
    dev7 = make_dev_dir(tmp_path / "dev7", 7)
    proc = run_server_once(serving_args(pins, model_dir), server_env(dev7))
    assert proc.returncode != 0
    assert "World size (8) is larger than the number of available GPUs (7)" in proc.stderr


def test_visible_devices_restrict_the_count(pins, model_dir, dev8):
    env = server_env(dev8, XPU_VISIBLE_DEVICES="0,1,2,3")
    proc = run_server_once(serving_args(pins, model_dir), env)
    assert proc.returncode != 0
    assert "available GPUs (4)" in proc.stderr


def test_quantization_mismatch(pins, model_dir, dev8):
    proc = run_server_once(serving_args(pins, model_dir, quantization="fp8"), server_env(dev8))
    assert proc.returncode != 0
    assert (
        "Quantization method specified in the model config (compressed-tensors) does not "
        "match the quantization method specified in the `quantization` argument (fp8)"
    ) in proc.stderr


def test_dtype_mismatch(pins, model_dir, dev8):
    proc = run_server_once(serving_args(pins, model_dir, dtype="bfloat16"), server_env(dev8))
    assert proc.returncode != 0
    assert "torch.bfloat16 is not supported for quantization method compressed-tensors" in proc.stderr


def test_auto_tool_choice_needs_a_registered_parser(pins, model_dir, dev8):
    proc = run_server_once(serving_args(pins, model_dir, tool_call_parser="qwen4_xml"), server_env(dev8))
    assert proc.returncode != 0
    assert "invalid tool call parser: qwen4_xml" in proc.stderr


def test_does_not_listen_while_loading(tmp_path, pins, model_dir, dev8):
    env = server_env(dev8, KUNLUN_SIM_LOAD_SECONDS="4")
    srv = Server(serving_args(pins, model_dir), env, tmp_path / "load.log")
    try:
        deadline = time.monotonic() + 10
        while "Starting to load model" not in srv.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Starting to load model" in srv.output()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
        srv.wait_ready()
        log = srv.output()
        assert f"Starting vLLM API server 0 on http://127.0.0.1:{srv.port}" in log
        assert "Application startup complete." in log
        assert log.index("Loading weights took") < log.index("Application startup complete.")
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- TLS
# What both servers do with the serve role's flags (TLS 1.2/1.3, plain HTTP closed) is the
# contract's (tests/real_engine, point tls_port); here what the lane does not start.
def _tls_get(port, ca_file, cert=None):
    import ssl

    context = ssl.create_default_context(cafile=str(ca_file))
    if cert:
        context.load_cert_chain(str(cert[1]), str(cert[0]))
    with urllib.request.urlopen("https://127.0.0.1:%d/health" % port, timeout=10, context=context) as r:
        return r.status


def test_tls_client_certificates_required_and_the_chain_refreshed(tmp_path, pins, model_dir, dev8):
    """--ssl-cert-reqs 2 with --ssl-ca-certs: only a client holding a certificate of that CA
    gets an answer (uvicorn's verify_mode); --enable-ssl-refresh: a certificate replaced on
    disk is served to the next connection without a restart (vllm's SSLCertRefresher)."""
    from standin_helpers import issue_cert, make_ca

    ca, clients = make_ca(tmp_path / "ca", "kf server CA"), make_ca(tmp_path / "clients", "kf client CA")
    key, cert = issue_cert(ca, tmp_path / "ca")
    client = issue_cert(clients, tmp_path / "clients", "client", ("kf-client",), client=True)
    tls = ["--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--enable-ssl-refresh"]
    tls += ["--ssl-ca-certs", str(clients["file"]), "--ssl-cert-reqs", "2"]
    srv = Server(serving_args(pins, model_dir) + tls, server_env(dev8), tmp_path / "tls.log", ca_file=ca["file"])
    try:
        deadline = time.monotonic() + 30
        while "Application startup complete." not in srv.output():
            assert srv.proc.poll() is None and time.monotonic() < deadline, srv.output()
            time.sleep(0.1)
        assert f"Starting vLLM API server 0 on https://127.0.0.1:{srv.port}" in srv.output()
        # No client certificate: the server ends the connection (TLS 1.3 refuses after the
        # handshake: no HTTP answer), as uvicorn's does (curl: "Empty reply from server").
        with pytest.raises(OSError):
            _tls_get(srv.port, ca["file"])
        assert _tls_get(srv.port, ca["file"], client) == 200
        # A chain of another CA written over the files: served from the next connection on.
        renewed = make_ca(tmp_path / "renewed", "kf renewed CA")
        new_key, new_cert = issue_cert(renewed, tmp_path / "renewed")
        cert.write_bytes(new_cert.read_bytes())
        key.write_bytes(new_key.read_bytes())
        deadline = time.monotonic() + 20
        while "Reloading SSL certificate chain" not in srv.output() or _refused(srv.port, renewed["file"], client):
            assert time.monotonic() < deadline, srv.output()
            time.sleep(0.2)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _tls_get(srv.port, ca["file"], client)
    finally:
        srv.stop()


def _refused(port, ca_file, cert):
    try:
        return _tls_get(port, ca_file, cert) != 200
    except urllib.error.URLError:
        return True


def test_tls_key_without_certificate_fails_after_the_load(pins, model_dir, dev8, tmp_path):
    """uvicorn's Config.load(): a key file and no certificate is an AssertionError, raised once
    the engine is up (vllm's serve_http loads the config then)."""
    proc = run_server_once(serving_args(pins, model_dir) + ["--ssl-keyfile", str(tmp_path / "k.pem")], server_env(dev8))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # The weights were loaded (the process ends at the assertion, so it came after them).
    assert "AssertionError" in out and "Loading weights took" in out, out[-2000:]


# ----------------------------------------------------------------------------- serving
def test_health_version_open_without_key(server):
    assert get(server.base + "/health")[0] == 200
    status, body = get(server.base + "/version")
    assert status == 200 and json.loads(body) == {"version": "0.15.1"}


def test_api_key_enforced_on_v1(server):
    status, body = get(server.base + "/v1/models")
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert get(server.base + "/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
    status, body = get(server.base + "/v1/models", {"Authorization": f"Bearer {API_KEY}"})
    assert status == 200
    data = json.loads(body)["data"]
    assert [m["id"] for m in data] == [SERVED]
    assert data[0]["max_model_len"] == 262144 and data[0]["owned_by"] == "vllm"


def test_openai_client_rejects_wrong_key(server):
    bad = OpenAI(base_url=server.base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_completion_usage_and_length(client):
    prompt = "hello, how are you?"
    r = client.completions.create(model=SERVED, prompt=prompt, max_tokens=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens == 6  # word-level tokenizer: hello , how are you ?
    assert r.usage.total_tokens == 13
    assert len(r.choices[0].text.split()) == 7


def test_completion_is_deterministic_for_a_prompt(client):
    a = client.completions.create(model=SERVED, prompt="the same prompt", max_tokens=5)
    b = client.completions.create(model=SERVED, prompt="the same prompt", max_tokens=5)
    assert a.choices[0].text == b.choices[0].text


def _short_natural_prompt():
    """A prompt whose natural answer (end-of-sequence) comes early, found with the engine."""
    spec = importlib.util.spec_from_file_location("_pacing", VLLM_SRC / "vllm" / "engine" / "pacing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for i in range(2000):
        prompt = f"question number {i}"
        seq = mod.Sequence("x", 0, 1, None, f"{prompt}\x000\x00", None)
        if seq.natural_length <= 40:
            return prompt, seq.natural_length
    raise AssertionError("no short prompt found")


def test_natural_stop_before_max_tokens(client):
    prompt, length = _short_natural_prompt()
    r = client.completions.create(model=SERVED, prompt=prompt, max_tokens=200)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == length


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content:
                pieces.append(delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert len(pieces) == 6 and finish == "length"
    assert usage is not None and usage.completion_tokens == 6
    # <|im_start|> user \n Say hello <|im_end|> \n <|im_start|> assistant \n (byte-level BPE:
    # the newlines are tokens, as in Qwen's tokenizer)
    assert usage.prompt_tokens == 10


def test_chat_non_streamed(client):
    r = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content.split()) == 4
    assert r.usage.completion_tokens == 4


def test_completion_stream(client):
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(model=SERVED, prompt="stream me", max_tokens=5, stream=True)
        if c.choices
    )
    assert len(text.split()) == 5


def test_errors_look_like_vllm(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="other-model", prompt="x", max_tokens=2)
    # vllm 0.15.1's words for completions (tests/real_engine compares every such answer).
    with pytest.raises(
        openai.BadRequestError, match=r"cannot be greater than the model's maximum context length \(262144\)"
    ):
        client.completions.create(model=SERVED, prompt="x", max_tokens=300000)


def test_metrics_have_vllm_names(server, client):
    client.completions.create(model=SERVED, prompt="count me", max_tokens=3)
    text = metrics(server)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
    ):
        assert re.search(rf'^{re.escape(name)}{{[^}}]*model_name="{SERVED}"', text, re.M), name
    assert metric_value(text, "vllm:generation_tokens_total") >= 3
    assert metric_value(text, "vllm:request_success_total", finished_reason="length") >= 1


def test_requests_beyond_max_num_seqs_wait(server):
    """max-num-seqs is 2: with 5 requests in flight, 3 wait (vllm:num_requests_waiting)."""

    def one(i):
        c = OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)
        return c.completions.create(
            model=SERVED, prompt=f"queue {i}", max_tokens=60, extra_body={"ignore_eos": True}
        ).usage.completion_tokens

    seen_waiting, seen_running = 0.0, 0.0
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(one, i) for i in range(5)]
        while not all(f.done() for f in futures):
            text = metrics(server)
            seen_waiting = max(seen_waiting, metric_value(text, "vllm:num_requests_waiting"))
            seen_running = max(seen_running, metric_value(text, "vllm:num_requests_running"))
            time.sleep(0.05)
        assert [f.result() for f in futures] == [60] * 5
    assert seen_waiting >= 1
    assert seen_running == 2


def test_vllm_cli_version():
    proc = __import__("subprocess").run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"],
        env=server_env(VLLM_SRC),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "0.15.1"


def test_port_in_use_fails_fast(pins, model_dir, dev8):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        proc = run_server_once(
            serving_args(pins, model_dir) + ["--host", "127.0.0.1", "--port", str(port)], server_env(dev8)
        )
    assert proc.returncode != 0
    assert "Address already in use" in proc.stderr


def test_client_disconnect_aborts_the_request(server):
    """A stream closed by the client stops generating (vllm aborts the request)."""
    body = json.dumps(
        {"model": SERVED, "prompt": "abort me", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer "
            + API_KEY.encode()
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(4096)
    deadline = time.monotonic() + 10
    while metric_value(metrics(server), "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric_value(metrics(server), "vllm:num_requests_running") == 0


def _fire(port, count, max_tokens):
    """`count` concurrent non-streamed completions over raw HTTP; returns the status codes."""
    import asyncio

    async def one(i):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps(
            {"model": SERVED, "prompt": f"load {i}", "max_tokens": max_tokens, "ignore_eos": True}
        ).encode()
        w.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + API_KEY.encode() + b"\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await w.drain()
        status = int((await r.readline()).split()[1])
        w.close()
        return status

    async def main():
        return await asyncio.gather(*(one(i) for i in range(count)))

    return asyncio.run(main())


def _memory_model():
    spec = importlib.util.spec_from_file_location("_memory", VLLM_SRC / "vllm" / "engine" / "memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_memory_model_follows_the_notes(pins):
    """96 GiB per card; KV 86.24 GiB at 0.9; the SSM state of 256 running does not fit at
    0.9 and does at 0.75; float32 state needs twice the room."""
    from types import SimpleNamespace

    from kunlun_fleet.sim.artifacts.model import config as model_config

    mem = _memory_model()
    cfg = model_config(pins)

    def model(util, dtype):
        return mem.MemoryModel(
            SimpleNamespace(tensor_parallel_size=8, gpu_memory_utilization=util, mamba_ssm_cache_dtype=dtype), cfg
        )

    assert mem.CARD_MIB == 98304
    assert round(model(0.9, "float16").kv_mib / 1024, 2) == 86.24
    assert model(0.9, "float16").max_running() == 255
    assert model(0.75, "float16").max_running() >= 256
    f16, f32 = model(0.9, "float16"), model(0.9, "float32")
    assert f32.max_running() < 256 // 2 + 8 and f32.per_seq_mib > 1.9 * f16.per_seq_mib
    assert model(0.9, "auto").state_dtype == "float32"  # the model's mamba_ssm_dtype


def test_one_card_holding_the_whole_model_needs_a_lower_utilization(tmp_path, model_dir):
    """TP 1: the 31 GiB of weights and a KV cache of 0.9 x 96 GiB leave no room for one
    sequence's SSM state; vllm refuses at start rather than at the first request. At 0.5
    it serves."""
    dev1 = make_dev_dir(tmp_path / "dev1", 1)
    args = ["--model", str(model_dir), "--tensor-parallel-size", "1", "--max-model-len", "4096"]
    proc = run_server_once(
        args + ["--gpu-memory-utilization", "0.9", "--port", str(free_port())], server_env(dev1), timeout=10
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ValueError: No available memory for the cache blocks." in proc.stdout + proc.stderr
    log = tmp_path / "serve.log"
    srv = Server(args + ["--gpu-memory-utilization", "0.5"], server_env(dev1), log)
    try:
        srv.wait_ready()
        assert "room for" in log.read_text()
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "gpu_util, ssm_dtype, count, dies",
    [
        (0.9, "float16", 256, True),  # KV cache 86.24 GiB: the 256th SSM state does not fit
        (0.9, "float32", 160, True),  # float32 state: twice the room, out well before 256
        (0.75, "float16", 256, False),  # the validated settings hold 256 concurrent requests
    ],
)
def test_ssm_state_out_of_memory_under_load(tmp_path, pins, model_dir, dev8, gpu_util, ssm_dtype, count, dies):
    args = serving_args(pins, model_dir, gpu_memory_utilization=gpu_util, mamba_ssm_cache_dtype=ssm_dtype) + [
        "--api-key",
        API_KEY,
        "--served-model-name",
        SERVED,
        "--disable-uvicorn-access-log",
    ]
    srv = Server(
        args,
        server_env(dev8, KUNLUN_SIM_TOKENS_PER_SECOND="1000", KUNLUN_SIM_PEAK_TOKENS_PER_SECOND="20000"),
        tmp_path / "oom.log",
    )
    try:
        srv.wait_ready()
        # not at start: it serves a request before the load
        assert _fire(srv.port, 1, 5) == [200]
        assert "out of memory" not in srv.output()
        statuses = _fire(srv.port, count, 2000 if dies else 20)
        if dies:
            assert set(statuses) == {500}
            assert srv.proc.wait(timeout=20) == 1
            log = srv.output()
            assert "torch.OutOfMemoryError: XPU out of memory. Tried to allocate" in log
            assert "XPU 0 has a total capacity of 96.00 GiB" in log
            assert "EngineDeadError" in log
        else:
            assert statuses == [200] * count
            assert srv.proc.poll() is None
    finally:
        srv.stop()
