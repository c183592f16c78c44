#!/usr/bin/python3
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's verified model, served read-only to the fleet while the model stage distributes it.

Started by the model role (model_share module) as a transient systemd unit on a host whose
copy model_verify found complete, stopped at the end of the distribution. Standard library
only (the host's python3). What it serves and to whom is closed:
  - GET and HEAD only, of exactly the files the sha256 manifest lists, under the model
    directory (any other path, a dot path or one leaving the directory: 404);
  - only to the fleet's addresses (--allow; any other client: 403);
  - at most --max-transfers at the same time (one more: 503 with Retry-After), the bound
    the fetching hosts wait on;
  - Range requests (bytes=N- and bytes=N-M), so an interrupted fetch continues where its
    partial file ends;
  - files opened read-only; the process writes only its statistics file.
"""

import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
CHUNK = 1024 * 1024


def listed_files(manifest_path):
    files = set()
    with open(manifest_path) as handle:
        for line in handle:
            match = _LINE.match(line.rstrip("\n"))
            if match:
                rel = match.group(2)
                parts = rel.split("/")
                if not rel.startswith("/") and ".." not in parts and not any(p.startswith(".") for p in parts):
                    files.add(rel)
    return files


class Share(object):
    def __init__(self, root, files, allow, max_transfers, rate=0, stats_file=None, prefix="", argv=None):
        self.root, self.files, self.allow = os.path.realpath(root), files, set(allow)
        self.max_transfers, self.rate, self.stats_file = max_transfers, rate, stats_file
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.lock = threading.Lock()
        self.active = 0
        self.stats = dict(
            started=time.time(),
            active=0,
            peak=0,
            transfers=0,
            completed=0,
            bytes=0,
            refused_busy=0,
            refused_client=0,
            not_found=0,
            by_client={},
            max_transfers=max_transfers,
            argv=list(argv or []),
        )
        self.write_stats()

    def acquire(self):
        with self.lock:
            if self.active >= self.max_transfers:
                self.stats["refused_busy"] += 1
                return False
            self.active += 1
            self.stats["active"] = self.active
            self.stats["transfers"] += 1
            self.stats["peak"] = max(self.stats["peak"], self.active)
        self.write_stats()
        return True

    def release(self, client, sent, complete):
        with self.lock:
            self.active -= 1
            self.stats["active"] = self.active
            self.stats["bytes"] += sent
            self.stats["completed"] += 1 if complete else 0
            self.stats["by_client"][client] = self.stats["by_client"].get(client, 0) + sent
        self.write_stats()

    def count(self, key):
        with self.lock:
            self.stats[key] += 1
        self.write_stats()

    def write_stats(self):
        if not self.stats_file:
            return
        with self.lock:
            text = json.dumps(self.stats, sort_keys=True)
        tmp = "%s.%d.tmp" % (self.stats_file, threading.get_ident())
        with open(tmp, "w") as handle:
            handle.write(text)
        os.replace(tmp, self.stats_file)

    def resolve(self, url_path):
        path = unquote(url_path.split("?", 1)[0])
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                return None
            path = path[len(self.prefix) :]
        rel = path.lstrip("/")
        if rel not in self.files:
            return None
        full = os.path.realpath(os.path.join(self.root, rel))
        if not full.startswith(self.root + os.sep) or not os.path.isfile(full):
            return None
        return full


def make_handler(share):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kunlun-model-share/1"

        def log_message(self, fmt, *args):  # one line a request, to the journal
            sys.stderr.write("%s %s\n" % (self.client_address[0], fmt % args))

        def _plain(self, code, text, extra=None):
            body = (text + "\n").encode()
            self.send_response(code)
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            client = self.client_address[0]
            if share.allow and client not in share.allow:
                share.count("refused_client")
                return self._plain(403, "not a fleet address: %s" % client)
            full = share.resolve(self.path)
            if full is None:
                share.count("not_found")
                return self._plain(404, "not a file of the model")
            if not share.acquire():
                return self._plain(
                    503, "at the bound of %d concurrent transfers" % share.max_transfers, {"Retry-After": "1"}
                )
            sent, complete = 0, False
            try:
                size = os.path.getsize(full)
                start, end = 0, size - 1
                wanted = self.headers.get("Range")
                if wanted:
                    match = _RANGE.match(wanted.strip())
                    if not match:
                        return self._plain(416, "only bytes=N- and bytes=N-M", {"Content-Range": "bytes */%d" % size})
                    start = int(match.group(1))
                    end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
                    if start >= size or end < start:
                        return self._plain(416, "range past the end", {"Content-Range": "bytes */%d" % size})
                self.send_response(206 if wanted else 200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Accept-Ranges", "bytes")
                if wanted:
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command == "HEAD":
                    complete = True
                    return None
                left = end - start + 1
                began = time.time()
                with open(full, "rb") as handle:
                    handle.seek(start)
                    while left > 0:
                        block = handle.read(min(CHUNK if not share.rate else max(1, share.rate // 10), left))
                        if not block:
                            break
                        self.wfile.write(block)
                        sent += len(block)
                        left -= len(block)
                        if share.rate:
                            ahead = sent / float(share.rate) - (time.time() - began)
                            if ahead > 0:
                                time.sleep(ahead)
                complete = left == 0
                return None
            except (BrokenPipeError, ConnectionResetError):
                return None
            finally:
                share.release(client, sent, complete)

    return Handler


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True, help="the host's fleet address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True, help="the model directory")
    parser.add_argument("--manifest", required=True, help="the sha256 manifest: only its files are served")
    parser.add_argument("--prefix", default="", help="URL path under which the files are served")
    parser.add_argument("--allow", default="", help="comma-separated client addresses (empty: any)")
    parser.add_argument("--max-transfers", type=int, default=2)
    parser.add_argument("--rate", type=int, default=0, help="bytes per second per transfer (0: unlimited)")
    parser.add_argument("--stats-file", default=None)
    args = parser.parse_args(argv)
    share = Share(
        args.root,
        listed_files(args.manifest),
        [a for a in args.allow.split(",") if a],
        args.max_transfers,
        args.rate,
        args.stats_file,
        args.prefix,
        sys.argv[1:] if argv is None else argv,
    )
    server = ThreadingHTTPServer((args.bind, args.port), make_handler(share))
    server.daemon_threads = True
    sys.stderr.write(
        "serving %d files of %s on %s:%d to %s, at most %d transfers at a time\n"
        % (len(share.files), share.root, args.bind, args.port, args.allow or "any address", args.max_transfers)
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
