"""What makes the bench meaningful on the simulated fleet, checked on local stand-in
servers (no sim host): the model directory's tokenizer loads in the load generator's
transformers and counts exactly as the server does; the server queues beyond
--max-num-seqs like vLLM (waiting requests, later first tokens, no errors); long prompts
cost prefill time; its counters are exact, for completed and for aborted requests; it
reports usage in streams as vllm 0.15.1 does (the bench's validity rests on that usage)."""

import concurrent.futures
import json
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from benchkit import API_KEY, BENCH_VENV, NO_VENV, SERVED, model_dir, start_servers

pytestmark = pytest.mark.slow
# The stand-in's prefill rate in these tests (its default, set explicitly).
PREFILL_TOK_S = 9700


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standin")
    (srv,) = start_servers(
        tmp,
        1,
        max_num_seqs=4,
        KUNLUN_SIM_TOKENS_PER_SECOND="200",
        KUNLUN_SIM_PREFILL_TOKENS_PER_SECOND=str(PREFILL_TOK_S),
    )
    yield srv
    srv.stop()


def metrics(srv):
    with urllib.request.urlopen(srv.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("vllm:") and "_created" not in line:
            name = line.split("{", 1)[0]
            if "finished_reason=" in line:
                name += ":" + line.split('finished_reason="', 1)[1].split('"', 1)[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def stream(srv, prompt, max_tokens, stop_after=None):
    """A streamed completion over raw HTTP: (seconds to the first token, chunks with text,
    the usage the server reported). stop_after: close the connection after that many chunks."""
    body = json.dumps(
        {
            "model": SERVED,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    start = time.monotonic()
    first, chunks, usage = None, 0, None
    with socket.create_connection(("127.0.0.1", srv.port), timeout=120) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer "
            + API_KEY.encode()
            + b"\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        buf = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                line = event.split(b"data: ", 1)[-1].strip()
                if line == b"[DONE]" or not line.startswith(b"{"):
                    continue
                obj = json.loads(line)
                if obj.get("usage"):
                    usage = obj["usage"]
                for ch in obj.get("choices") or []:
                    if ch.get("text"):
                        chunks += 1
                        if first is None:
                            first = time.monotonic() - start
                # One read can hold many events (a busy client reads late): count only
                # up to the point where the client goes away.
                if stop_after is not None and chunks >= stop_after:
                    return first, chunks, usage
    return first, chunks, usage


def test_tokenizer_loads_in_the_load_generator_and_counts_as_the_server(tmp_path):
    """aiperf loads the tokenizer with transformers' AutoTokenizer: for model_type qwen3_5
    that is Qwen3_5Tokenizer (a byte-level BPE). Its counts equal the server's."""
    if not (BENCH_VENV / "bin" / "python").exists():
        pytest.skip(NO_VENV)
    model = model_dir(tmp_path)
    code = r"""
import glob, json, os, random, sys
sys.path.insert(0, sys.argv[2])
from transformers import AutoTokenizer
from vllm.engine.bpe import Encoder
import aiperf
tok = AutoTokenizer.from_pretrained(sys.argv[1])
enc = Encoder(json.load(open(os.path.join(sys.argv[1], "tokenizer.json"))))
corpus = open(glob.glob(os.path.dirname(aiperf.__file__) + "/**/shakespeare.txt", recursive=True)[0]).read()
texts = ["hello, how are you?", " the model answers with tokens from a fixed list",
         "Don't 123 foo_bar \n\n x!? (a)-b/c", "Unicode: café naïve Tōkyō 東京",
         "<|im_start|>user\nSay hello<|im_end|>\n<|im_start|>assistant\n"]
rnd = random.Random(7)
for _ in range(30):
    a = rnd.randrange(len(corpus) - 5000)
    texts.append(corpus[a:a + rnd.randrange(1, 5000)])
print(json.dumps({"class": type(tok).__name__,
                  "pairs": [[len(tok.encode(t, add_special_tokens=False)), enc.count(t)] for t in texts],
                  "one_token_each": len(tok.encode(" the model answers", add_special_tokens=False))}))
"""
    proc = subprocess.run(
        [
            str(BENCH_VENV / "bin" / "python"),
            "-c",
            code,
            str(model),
            str(BENCH_VENV.parents[1] / "kunlun_fleet/sim/artifacts/vllm_src"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["class"] == "Qwen3_5Tokenizer"
    assert [a for a, b in out["pairs"]] == [b for a, b in out["pairs"]]
    assert out["one_token_each"] == 3  # the stand-in's words are single tokens: chunks = tokens


def test_requests_beyond_max_num_seqs_wait_and_start_later(server):
    """max-num-seqs 4, 12 requests at once: 4 run, the rest wait (no error); the first token
    of a request that waited comes after those of the requests that ran at once."""
    seen = {"waiting": 0.0, "running": 0.0, "both": []}
    done = threading.Event()

    def watch():
        while not done.is_set():
            m = metrics(server)
            seen["waiting"] = max(seen["waiting"], m["vllm:num_requests_waiting"])
            seen["running"] = max(seen["running"], m["vllm:num_requests_running"])
            seen["both"].append((m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = []
            for i in range(12):
                futures.append(pool.submit(stream, server, "queue me please %d" % i, 40))
                time.sleep(0.01)  # arrival order = submission order
            results = [f.result() for f in futures]
    finally:
        done.set()
        watcher.join()
    assert [r[1] for r in results] == [40] * 12 and all(r[2]["completion_tokens"] == 40 for r in results)
    # Never more than max-num-seqs running; in one and the same read of the server's gauges,
    # four running while others waited (an order of events, not a time).
    assert seen["running"] == 4 and seen["waiting"] >= 1
    assert any(running == 4 and waiting >= 1 for running, waiting in seen["both"]), seen["both"][:20]
    # and the queue drained: nothing waits once every request has its answer
    assert metrics(server)["vllm:num_requests_waiting"] == 0


def test_long_prompts_cost_prefill_time(server):
    """The first token of a long prompt comes no sooner than its prefill at the stand-in's
    prefill rate allows (a lower bound: a slower machine only adds to it)."""
    _, _, u_short = stream(server, "the model answers", 4)
    long_prompt = " ".join(["the model answers"] * (32768 // 3))
    long, _, u_long = stream(server, long_prompt, 4)
    assert u_short["prompt_tokens"] == 3 and u_long["prompt_tokens"] == 3 * (32768 // 3)
    assert long >= u_long["prompt_tokens"] / PREFILL_TOK_S, (long, u_long["prompt_tokens"])


def test_counters_count_every_token_generated(server):
    before = metrics(server)
    results = [stream(server, "count me %d" % i, 25) for i in range(3)]
    mid = metrics(server)
    assert (
        mid["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
        == sum(r[2]["completion_tokens"] for r in results)
        == 75
    )
    assert mid["vllm:request_success_total:length"] - before["vllm:request_success_total:length"] == 3
    assert mid["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == sum(
        r[2]["prompt_tokens"] for r in results
    )
    # a client that goes away after 5 tokens: vLLM v1 counts the tokens generated (per
    # engine step), not a success
    _, chunks, _ = stream(server, "abort me", 10000, stop_after=5)
    deadline = time.monotonic() + 30
    while metrics(server)["vllm:num_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    after = metrics(server)
    generated = after["vllm:generation_tokens_total"] - mid["vllm:generation_tokens_total"]
    assert chunks == 5 and 5 <= generated < 10000
    assert after["vllm:request_success_total:length"] == mid["vllm:request_success_total:length"]


def events(srv, path, body):
    """Every JSON event of a streamed request, in order (the [DONE] line left out)."""
    req = urllib.request.Request(
        srv.base + path,
        data=json.dumps(dict(body, model=SERVED, stream=True)).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    return [json.loads(e[len("data: ") :]) for e in raw.split("\n\n") if e.startswith("data: {")]


def test_streamed_usage_as_vllm_0_15_1_reports_it(server):
    """vllm 0.15.1: StreamOptions defaults include_usage true and continuous_usage_stats
    false (entrypoints/openai/engine/protocol.py); should_include_usage
    (entrypoints/utils.py); completions chunks dumped whole (usage null), the usage chunk
    with exclude_none (completion/serving.py); chat chunks with the fields set only
    (chat_completion/serving.py)."""
    body = {"prompt": "the model answers", "max_tokens": 4, "ignore_eos": True}  # 3 prompt tokens
    for opts, with_usage in (
        ({"include_usage": True}, True),
        ({}, True),
        ({"include_usage": False}, False),
        (None, False),
    ):
        evs = events(server, "/v1/completions", dict(body, **({} if opts is None else {"stream_options": opts})))
        content = [e for e in evs if e["choices"]]
        assert len(content) == 4 and all(e["usage"] is None for e in content), opts
        assert set(content[0]["choices"][0]) == {
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "prompt_token_ids",
            "token_ids",
        }
        closing = [e for e in evs if not e["choices"]]
        if with_usage:
            assert closing == [
                {
                    "id": content[0]["id"],
                    "object": "text_completion",
                    "created": content[0]["created"],
                    "model": SERVED,
                    "choices": [],
                    "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4},
                }
            ], opts
        else:
            assert closing == [], opts
    # continuous usage: every chunk carries the prompt and the tokens streamed so far
    evs = events(server, "/v1/completions", dict(body, stream_options={"continuous_usage_stats": True}))
    assert [e["usage"]["completion_tokens"] for e in evs] == [1, 2, 3, 4, 4]
    assert evs[0]["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 4,
        "completion_tokens": 1,
        "prompt_tokens_details": None,
    }
    assert "prompt_tokens_details" not in evs[-1]["usage"]
    # chat: no usage key unless continuous; the role chunk counts 0 completion tokens
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    evs = events(server, "/v1/chat/completions", dict(chat, stream_options={"include_usage": True}))
    assert all("usage" not in e for e in evs[:-1]) and evs[-1]["usage"]["completion_tokens"] == 2
    evs = events(server, "/v1/chat/completions", dict(chat, stream_options={"continuous_usage_stats": True}))
    assert [e["usage"]["completion_tokens"] for e in evs] == [0, 1, 2, 2]
