#!/usr/bin/python3
"""Client-side probes of the gateway for the molecule verify (standard library only).

    probe.py stream BASE KEY MAX_TOKENS        streamed chat completion: its events and the reads
                                               that brought them
    probe.py complete BASE KEY MAX_TOKENS      one completion (not streamed): status, tokens, finish
    probe.py many BASE KEY N                   N short completions with distinct prompts
    probe.py status BASE PATH [KEY]            HTTP status of GET PATH (with KEY if given)
    probe.py served WORKER_BASE                the worker's own counts of finished and running requests

The API key comes as the KEY argument's name of an environment variable (never argv)."""
import json
import os
import random
import sys
import urllib.error
import urllib.request


def key_from(name):
    return os.environ[name]


def request(base, path, key=None, body=None, timeout=600):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers=headers, method="POST" if data else "GET")
    return urllib.request.urlopen(req, timeout=timeout)


def model(base, key):
    with request(base, "/v1/models", key) as resp:
        return json.load(resp)["data"][0]["id"]


def stream(base, key, max_tokens):
    body = {"model": model(base, key), "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "stream %d" % random.randrange(1 << 30)}]}
    events, reads, done = 0, 0, False
    with request(base, "/v1/chat/completions", key, body) as resp:
        # read1: whatever has arrived, as soon as it has arrived (no read-ahead buffering).
        # A proxy that buffers the stream hands it over in a few large reads; an unbuffered
        # one in about one read per token, whatever the machine's load.
        buf = b""
        while True:
            piece = resp.read1(65536)
            if not piece:
                break
            before = events
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data: "):
                    events += 1
                    done = done or event.strip() == b"data: [DONE]"
            reads += events > before
    return {"chunks": events, "reads": reads, "done": done}


def complete(base, key, max_tokens):
    body = {"model": model(base, key), "max_tokens": max_tokens, "ignore_eos": True,
            "prompt": "long %d" % random.randrange(1 << 30)}
    try:
        with request(base, "/v1/completions", key, body, timeout=3600) as resp:
            out = json.load(resp)
            return {"status": resp.status, "completion_tokens": out["usage"]["completion_tokens"],
                    "finish_reason": out["choices"][0].get("finish_reason")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "completion_tokens": 0, "finish_reason": None}


def many(base, key, n):
    statuses = []
    name = model(base, key)
    for i in range(n):
        body = {"model": name, "max_tokens": 2, "prompt": "%d %s" % (i, random.randrange(1 << 40))}
        try:
            with request(base, "/v1/completions", key, body, timeout=120) as resp:
                statuses.append(resp.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
        except OSError as exc:
            statuses.append(str(exc))
    return {"ok": statuses.count(200), "failed": len(statuses) - statuses.count(200), "statuses": statuses}


def status(base, path, key=None):
    try:
        with request(base, path, key) as resp:
            return {"status": resp.status}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code}


def served(base):
    with request(base, "/metrics") as resp:
        text = resp.read().decode()
    def metric(name):
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)))

    return {"served": metric("vllm:request_success_total"), "running": metric("vllm:num_requests_running")}


def main(argv):
    cmd, base = argv[1], argv[2].rstrip("/")
    if cmd == "stream":
        result = stream(base, key_from(argv[3]), int(argv[4]))
    elif cmd == "complete":
        result = complete(base, key_from(argv[3]), int(argv[4]))
    elif cmd == "many":
        result = many(base, key_from(argv[3]), int(argv[4]))
    elif cmd == "status":
        result = status(base, argv[3], key_from(argv[4]) if len(argv) > 4 else None)
    else:
        result = served(base)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
