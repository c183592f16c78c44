#!/usr/bin/env python3
"""Compare fleet endpoints under the same load: prints figures, asserts nothing.

    KEY=... scripts/bench_gateway.py --target router=http://127.0.0.1:8080 \\
        --target direct=http://127.0.0.1:18001 --target haproxy=http://127.0.0.1:18090 \\
        [--requests 200] [--concurrency 32] [--max-tokens 64] [--stream] [--key-env KEY] \\
        [--shared-prefix WORDS] [--ca-file /etc/kunlun-fleet/ca.crt]

Standard library only, so it runs on a gateway host with the host's python3 (where the
workers may listen on 127.0.0.1 only). For each target, in turn and with the same
workload: completions with distinct prompts (after a system prompt of WORDS words common to
every request with --shared-prefix: where a prefix cache pays, and where cache_aware
routing keeps requests together), `--concurrency` at a time, then requests/s,
output tok/s, p50/p99 latency (and time to first token with --stream), failures.
The API key is read from the environment variable named by --key-env (never argv). An
https target (a worker, which serves TLS with a certificate of the fleet CA) is verified
with --ca-file besides the system's store."""
import argparse
import concurrent.futures
import json
import os
import random
import ssl
import statistics
import time
import urllib.error
import urllib.request


TLS = ssl.create_default_context()  # --ca-file is loaded into it


def post(base, key, body, timeout):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    return urllib.request.urlopen(req, timeout=timeout, context=TLS)


def model_of(base, key):
    req = urllib.request.Request(base + "/v1/models", headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=30, context=TLS) as resp:
        return json.load(resp)["data"][0]["id"]


SHARED = []  # the common system prompt's words (--shared-prefix)


def one(base, key, model, max_tokens, stream, i):
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "prompt": " ".join(SHARED + ["bench %d %d the fleet answers" % (i, random.randrange(1 << 40))])}
    start = time.monotonic()
    ttft, tokens = None, 0
    try:
        with post(base, key, body, 600) as resp:
            if stream:
                buf = b""
                while True:
                    piece = resp.read1(65536)
                    if not piece:
                        break
                    buf += piece
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        if event.startswith(b"data: {"):
                            if ttft is None:
                                ttft = time.monotonic() - start
                            tokens += 1
            else:
                tokens = json.load(resp)["usage"]["completion_tokens"]
        return True, time.monotonic() - start, ttft, tokens
    except (urllib.error.URLError, OSError, ValueError):
        return False, time.monotonic() - start, ttft, 0


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100.0 * (len(values) - 1))))]


def run(name, base, key, args):
    model = model_of(base, key)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda i: one(base, key, model, args.max_tokens, args.stream, i),
                                range(args.requests)))
    wall = time.monotonic() - start
    ok = [r for r in results if r[0]]
    lat = [r[1] for r in ok]
    ttfts = [r[2] for r in ok if r[2] is not None]
    tokens = sum(r[3] for r in ok)
    row = {"target": name, "requests": len(results), "failures": len(results) - len(ok),
           "req_s": len(ok) / wall, "out_tok_s": tokens / wall,
           "p50_s": statistics.median(lat) if lat else float("nan"), "p99_s": percentile(lat, 99),
           "ttft_p50_s": statistics.median(ttfts) if ttfts else float("nan"), "wall_s": wall}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole comparison")
    ap.add_argument("--key-env", default="KEY")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="WORDS",
                    help="a system prompt of WORDS words common to every request")
    ap.add_argument("--ca-file", default="", help="a CA certificate that verifies https targets (the fleet CA's)")
    args = ap.parse_args()
    if args.ca_file:
        TLS.load_verify_locations(cafile=args.ca_file)
    SHARED[:] = ["policy%d" % (n % 97) for n in range(args.shared_prefix)]
    key = os.environ.get(args.key_env, "")
    targets = [t.split("=", 1) for t in args.target]
    print("workload: %d requests, concurrency %d, %d output tokens each, %s, %s" % (
        args.requests, args.concurrency, args.max_tokens, "streamed" if args.stream else "not streamed",
        "a shared prefix of %d words" % args.shared_prefix if args.shared_prefix else "distinct prompts"))
    print("%-10s %5s %8s %8s %11s %8s %8s %9s %7s" % (
        "target", "round", "failures", "req/s", "out tok/s", "p50 s", "p99 s", "ttft p50", "wall s"))
    for rnd in range(1, args.rounds + 1):
        for name, base in targets:
            r = run(name, base.rstrip("/"), key, args)
            print("%-10s %5d %8d %8.2f %11.1f %8.3f %8.3f %9.3f %7.1f" % (
                name, rnd, r["failures"], r["req_s"], r["out_tok_s"], r["p50_s"], r["p99_s"],
                r["ttft_p50_s"], r["wall_s"]), flush=True)


if __name__ == "__main__":
    main()
