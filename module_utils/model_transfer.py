# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weights to many hosts: who fetches from whom (plan), and the resumable, verified fetch.

plan() runs on the controller (model_peer_plan); fetch() on a host that lacks files
(model_fetch), from the read-only shares of hosts that already hold a verified copy
(roles/model/files/model_share.py). Standard library only.

A file is streamed into <partial_dir>/<path>, hashed as it arrives, continued with an HTTP
Range request after an interruption (the partial file is kept, also between runs), and
renamed into the model directory only once its sha256 is the manifest's: nothing
half-written is ever in the model directory, served, or counted as complete.
"""

from __future__ import absolute_import, division, print_function

import errno
import hashlib
import os
import socket
import time

try:
    from http.client import HTTPConnection, HTTPException
except ImportError:  # pragma: no cover - Python 2 hosts are not supported by the project
    HTTPConnection = HTTPException = None

__metaclass__ = type

ORIGIN = "origin"
CHUNK = 1024 * 1024


# ------------------------------------------------------------------------------ the plan
def plan(hosts, per_source=2, origin_hosts=1, peers=True):
    """Assign every host that lacks files a source, in waves.

    hosts: [{"name", "address", "missing": int}] in inventory order ("missing" is how many
    files it lacks; 0 means it holds a verified copy). Wave 0: hosts that take the files
    from the origin (the controller's bundle or the mirror) - only when no host holds a
    copy (then the first origin_hosts of them), or every host when peers is false. Wave
    w >= 1: every host complete before w is a source; the next len(sources) * per_source
    hosts are assigned to them round-robin (at most per_source pullers a source), each
    with the wave's other sources as fallbacks, in round-robin order after its own."""
    if per_source < 1:
        raise ValueError("per_source must be at least 1, not %r" % (per_source,))
    if origin_hosts < 1:
        raise ValueError("origin_hosts must be at least 1, not %r" % (origin_hosts,))
    address = dict((h["name"], h.get("address") or h["name"]) for h in hosts)
    complete = [h["name"] for h in hosts if not h.get("missing")]
    pullers = [h["name"] for h in hosts if h.get("missing")]
    assignments, waves = {}, []
    if pullers and (not peers or not complete):
        first = pullers if not peers else pullers[:origin_hosts]
        for name in first:
            assignments[name] = dict(wave=0, source=ORIGIN, source_address=None, fallbacks=[])
        waves.append(dict(wave=0, sources=[ORIGIN], pullers=list(first)))
        complete.extend(first)
        pullers = pullers[len(first) :]
    wave = 0
    while pullers:
        wave += 1
        sources = list(complete)
        taken = pullers[: len(sources) * per_source]
        for index, name in enumerate(taken):
            own = index % len(sources)
            rotated = sources[own:] + sources[:own]
            assignments[name] = dict(
                wave=wave,
                source=rotated[0],
                source_address=address[rotated[0]],
                fallbacks=[dict(name=s, address=address[s]) for s in rotated[1:]],
            )
        waves.append(
            dict(
                wave=wave,
                sources=sources,
                pullers=list(taken),
                per_source=dict((s, sum(1 for n in taken if assignments[n]["source"] == s)) for s in sources),
            )
        )
        complete.extend(taken)
        pullers = pullers[len(taken) :]
    # every host that serves in some wave (as a puller's first source or as a fallback)
    sources_used = sorted(set(s for w in waves for s in w["sources"] if s != ORIGIN))
    return dict(
        assignments=assignments,
        waves=waves,
        wave_count=len(waves),
        last_wave=waves[-1]["wave"] if waves else -1,
        peer_waves=[w["wave"] for w in waves if w["wave"] > 0],
        origin_hosts=[n for n, a in sorted(assignments.items()) if a["source"] == ORIGIN],
        sources=sources_used,
        hosts_to_fetch=len(assignments),
    )


# -------------------------------------------------------------------------- the fetch
class SourceError(Exception):
    """A source could not give a file (dead, refused, wrong answer); the next one is tried."""


class Busy(Exception):
    """The source is at its bound of concurrent transfers (HTTP 503)."""

    def __init__(self, retry_after):
        Exception.__init__(self, "busy")
        self.retry_after = retry_after


class FetchFailed(Exception):
    pass


def _hash_prefix(path):
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
            size += len(block)
    return digest, size


def _split(url):
    if not url.startswith("http://"):
        raise ValueError("only http:// sources are supported, not %r" % url)
    rest = url[len("http://") :]
    hostport, _sep, base = rest.partition("/")
    host, _sep, port = hostport.rpartition(":")
    if not host:
        host, port = port, "80"
    return host.strip("[]"), int(port), "/" + base.strip("/")


class Fetcher(object):
    """Fetch files from a list of sources [{"name", "url"}] into dest, resumable and verified."""

    def __init__(
        self,
        dest,
        partial_dir,
        sources,
        timeout=30,
        busy_wait=600,
        mode=None,
        uid=-1,
        gid=-1,
        sleep=time.sleep,
        clock=time.time,
    ):
        self.dest, self.partial_dir = dest, partial_dir
        self.sources = list(sources)
        self.timeout, self.busy_wait = timeout, busy_wait
        self.mode, self.uid, self.gid = mode, uid, gid
        self.sleep, self.clock = sleep, clock
        self.current = 0  # sticky: after a failure the next source serves the following files too
        self.failures = []  # (source name, file, error)
        self.files = []  # per file: path, source, bytes, resumed_from
        self.bytes_by_source = {}
        self.busy_waits = 0

    # one HTTP GET of a file from a source, from `offset` on, appended to the partial file
    def _get(self, source, rel, partial, digest, offset):
        host, port, base = _split(source["url"])
        path = base.rstrip("/") + "/" + "/".join(_quote(p) for p in rel.split("/"))
        conn = HTTPConnection(host, port, timeout=self.timeout)
        got = 0
        try:
            headers = {"Range": "bytes=%d-" % offset} if offset else {}
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            if resp.status == 503:
                raise Busy(int(resp.getheader("Retry-After") or 1))
            if resp.status == 416 and offset:
                return "complete", 0  # the partial file already holds every byte
            if resp.status == 200 and offset:
                offset = 0  # the source ignored the range: start again
                digest = hashlib.sha256()
                mode = "wb"
            elif resp.status == 206 and offset:
                start = (resp.getheader("Content-Range") or "").replace("bytes ", "").split("-")[0]
                if start != str(offset):
                    raise SourceError("answered range %r for a request from byte %d" % (start, offset))
                mode = "ab"
            elif resp.status == 200:
                mode = "wb"
            else:
                raise SourceError("HTTP %d %s" % (resp.status, resp.reason))
            length = resp.getheader("Content-Length")
            length = int(length) if length is not None else None
            # read1: what has arrived (up to CHUNK), so a connection lost mid-file leaves every
            # received byte in the partial file
            read = getattr(resp, "read1", resp.read)
            with open(partial, mode) as out:
                while True:
                    block = read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    got += len(block)
                out.flush()
                os.fsync(out.fileno())
            if length is not None and got != length:
                raise SourceError("connection closed after %d of %d bytes (partial file kept)" % (got, length))
            return digest, got
        except (socket.error, socket.timeout, HTTPException, OSError) as exc:
            if isinstance(exc, OSError) and getattr(exc, "filename", None):
                raise  # a local file error, not the source's
            raise SourceError("%s%s" % (type(exc).__name__, (": %s" % exc) if str(exc) else "")) from exc
        finally:
            self.bytes_by_source[source["name"]] = self.bytes_by_source.get(source["name"], 0) + got
            conn.close()

    def fetch_one(self, rel, want):
        partial = os.path.join(self.partial_dir, rel)
        final = os.path.join(self.dest, rel)
        for parent in (os.path.dirname(partial), os.path.dirname(final)):
            if not os.path.isdir(parent):
                os.makedirs(parent)
        resumed_from = os.path.getsize(partial) if os.path.isfile(partial) else 0
        restarts = 0
        tried = set()
        busy_since = None
        while True:
            if len(tried) >= len(self.sources):
                raise FetchFailed(self._message(rel, partial))
            source = self.sources[self.current % len(self.sources)]
            if os.path.isfile(partial):
                digest, offset = _hash_prefix(partial)
            else:
                digest, offset = hashlib.sha256(), 0
            try:
                answer = self._get(source, rel, partial, digest, offset)
            except Busy as busy:
                busy_since = busy_since or self.clock()
                if self.clock() - busy_since >= self.busy_wait:
                    self._fail(source, rel, "at its bound of concurrent transfers for %ds" % self.busy_wait)
                    tried.add(self.current % len(self.sources))
                    self.current += 1
                    busy_since = None
                    continue
                self.busy_waits += 1
                self.sleep(max(1, min(busy.retry_after, 10)))
                continue
            except SourceError as exc:
                self._fail(source, rel, str(exc))
                tried.add(self.current % len(self.sources))
                self.current += 1
                busy_since = None
                continue
            busy_since = None
            if answer[0] == "complete":
                digest, _size = _hash_prefix(partial)
            else:
                digest = answer[0]
            found = digest.hexdigest()
            if found != want:
                os.unlink(partial)  # never kept, never renamed: start again from another source
                self._fail(source, rel, "sha256 %s, the manifest says %s (discarded)" % (found, want))
                restarts += 1
                if restarts > len(self.sources):
                    raise FetchFailed(self._message(rel, partial))
                tried.add(self.current % len(self.sources))
                self.current += 1
                continue
            if self.mode is not None:
                os.chmod(partial, self.mode)
            if self.uid != -1 or self.gid != -1:
                os.chown(partial, self.uid, self.gid)
            os.rename(partial, final)
            _fsync_dir(os.path.dirname(final))
            self.files.append(
                dict(path=rel, source=source["name"], bytes=os.path.getsize(final), resumed_from=resumed_from)
            )
            return

    def fetch(self, files):
        """files: {relative path: sha256}; fetched in sorted order."""
        for rel in sorted(files):
            self.fetch_one(rel, files[rel])
        return self.files

    def _fail(self, source, rel, error):
        self.failures.append(dict(source=source["name"], url=source["url"], file=rel, error=error))

    def _message(self, rel, partial):
        tried = ["%s (%s): %s" % (f["source"], f["url"], f["error"]) for f in self.failures if f["file"] == rel]
        kept = os.path.getsize(partial) if os.path.isfile(partial) else 0
        return "could not fetch %s from any source: %s. %s" % (
            rel,
            "; ".join(tried) or "no source given",
            ("The partial file %s (%d bytes) is kept; the next run continues it." % (partial, kept))
            if kept
            else "Nothing was written to the model directory.",
        )


def _quote(part):
    try:
        from urllib.parse import quote
    except ImportError:  # pragma: no cover
        from urllib import quote
    return quote(part, safe="")


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)
