"""Weights to many hosts: the plan (module_utils/model_transfer.py), the read-only share
(roles/model/files/model_share.py) and the resumable, verified fetch, against real local
shares on 127.0.0.x (no sim host)."""

import hashlib
import importlib.util
import json
import os
import threading
import time
from pathlib import Path

import pytest

from ansible.module_utils.model_transfer import ORIGIN, FetchFailed, Fetcher, plan

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("model_share", ROOT / "roles/model/files/model_share.py")
model_share = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model_share)

DIR = "Qwen3.8-27B-W8A8-INT8-Dynamic"


def hosts(*missing):
    return [dict(name="h%d" % i, address="10.0.0.%d" % i, missing=m) for i, m in enumerate(missing, 1)]


# ------------------------------------------------------------------------------ plan
def test_plan_one_copy_two_per_source_round_robin():
    p = plan(hosts(0, 7, 7, 7, 7, 7, 7, 7), per_source=2)
    w1, w2 = p["waves"]
    assert w1["sources"] == ["h1"] and w1["pullers"] == ["h2", "h3"]
    assert w2["sources"] == ["h1", "h2", "h3"] and w2["pullers"] == ["h4", "h5", "h6", "h7", "h8"]
    # round-robin: h4->h1, h5->h2, h6->h3, h7->h1, h8->h2; never more than 2 a source
    assert [p["assignments"]["h%d" % i]["source"] for i in range(4, 9)] == ["h1", "h2", "h3", "h1", "h2"]
    assert max(w2["per_source"].values()) == 2
    assert p["assignments"]["h5"]["fallbacks"] == [
        dict(name="h3", address="10.0.0.3"),
        dict(name="h1", address="10.0.0.1"),
    ]
    assert p["origin_hosts"] == [] and p["peer_waves"] == [1, 2]


def test_plan_no_copy_first_host_from_origin():
    p = plan(hosts(7, 7, 7), per_source=2)
    assert p["origin_hosts"] == ["h1"]
    assert p["assignments"]["h1"] == dict(wave=0, source=ORIGIN, source_address=None, fallbacks=[])
    assert p["waves"][1]["pullers"] == ["h2", "h3"] and p["sources"] == ["h1"]


def test_plan_bound_one_and_peers_off_and_nothing_to_do():
    p = plan(hosts(0, 3, 3, 3), per_source=1)
    assert [w["pullers"] for w in p["waves"]] == [["h2"], ["h3", "h4"]]
    assert p["sources"] == ["h1", "h2"]  # h2 serves in wave 2: its share is started, so it is stopped too
    assert all(v <= 1 for w in p["waves"] for v in w["per_source"].values())
    off = plan(hosts(0, 3, 3), peers=False)
    assert off["origin_hosts"] == ["h2", "h3"] and off["peer_waves"] == []
    none = plan(hosts(0, 0, 0))
    assert none["assignments"] == {} and none["waves"] == [] and none["sources"] == []
    with pytest.raises(ValueError):
        plan(hosts(0, 1), per_source=0)


# ------------------------------------------------------------------- share and fetch
class Running:
    def __init__(self, root, manifest, max_transfers=2, rate=0, address="127.0.0.1", allow=()):
        self.stats_file = str(root.parent / ("stats-%s.json" % address))
        self.share = model_share.Share(
            str(root), model_share.listed_files(str(manifest)), list(allow), max_transfers, rate, self.stats_file, DIR
        )
        self.server = model_share.ThreadingHTTPServer((address, 0), model_share.make_handler(self.share))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://%s:%d/%s" % (address, self.server.server_address[1], DIR)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def stats(self, settle=2.0):
        # a transfer's count is written just after its last byte: let in-flight ones settle
        deadline = time.time() + settle
        while True:
            stats = json.loads(Path(self.stats_file).read_text())
            if stats["active"] == 0 or time.time() > deadline:
                return stats
            time.sleep(0.05)


class Process:
    """The share as the host runs it: its own process, killed with SIGKILL to play a dead host."""

    def __init__(self, root, manifest, rate=0):
        import socket
        import subprocess
        import sys

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "roles/model/files/model_share.py"),
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--root",
                str(root),
                "--manifest",
                str(manifest),
                "--prefix",
                DIR,
                "--rate",
                str(rate),
            ],
            stderr=subprocess.DEVNULL,
        )
        self.url = "http://127.0.0.1:%d/%s" % (self.port, DIR)
        deadline = time.time() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "the share did not start"
                time.sleep(0.05)

    def kill(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture()
def source(tmp_path):
    """A source model directory: three files, one of 3 MiB, and its manifest."""
    src = tmp_path / "src" / DIR
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "x"}')
    (src / "model-00001-of-00002.safetensors").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    (src / "model-00002-of-00002.safetensors").write_bytes(os.urandom(200000))
    (src / ".hidden").write_text("not listed")
    sums = dict((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in src.iterdir() if p.name != ".hidden")
    manifest = tmp_path / "src" / (DIR + ".sha256")
    manifest.write_text("".join("%s  %s\n" % (v, k) for k, v in sorted(sums.items())))
    return src, manifest, sums


def dest_dirs(tmp_path, name="dst"):
    dst = tmp_path / name / DIR
    dst.mkdir(parents=True)
    return dst, tmp_path / name / (".%s.partial" % DIR)


def test_fetch_all_files_verified_and_renamed(tmp_path, source):
    src, manifest, sums = source
    share = Running(src, manifest)
    try:
        dst, partial = dest_dirs(tmp_path)
        f = Fetcher(str(dst), str(partial), [dict(name="peer", url=share.url)], mode=0o644)
        f.fetch(sums)
        for rel, want in sums.items():
            assert hashlib.sha256((dst / rel).read_bytes()).hexdigest() == want
            assert oct((dst / rel).stat().st_mode & 0o777) == "0o644"
        assert sorted(p.name for p in dst.iterdir()) == sorted(sums)
        assert not any(p.is_file() for p in partial.rglob("*"))  # nothing left half-written
        assert share.stats()["completed"] == 3 and share.stats()["bytes"] == sum((src / r).stat().st_size for r in sums)
    finally:
        share.stop()


def test_share_serves_only_listed_files_to_allowed_clients(tmp_path, source):
    src, manifest, _ = source
    from http.client import HTTPConnection

    share = Running(src, manifest, allow=["127.0.0.1"])
    other = Running(src, manifest, address="127.0.0.2", allow=["10.9.9.9"])
    try:

        def get(url, path):
            host, port = url.split("/")[2].split(":")
            c = HTTPConnection(host, int(port), timeout=5)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            return r.status

        assert get(share.url, "/%s/config.json" % DIR) == 200
        assert get(share.url, "/%s/.hidden" % DIR) == 404
        assert get(share.url, "/%s/../%s.sha256" % (DIR, DIR)) == 404
        assert get(share.url, "/config.json") == 404
        assert get(other.url, "/%s/config.json" % DIR) == 403  # the client is not a fleet address
    finally:
        share.stop()
        other.stop()


def test_interrupted_fetch_resumes_from_its_partial_file(tmp_path, source):
    """A source dies mid-file: the partial file is kept; the next run continues it with a
    Range request from where it ends (the second source sends only the rest)."""
    src, manifest, sums = source
    big = "model-00001-of-00002.safetensors"
    size = (src / big).stat().st_size
    slow = Process(src, manifest, rate=2 * 1024 * 1024)  # ~1.5 s for the big file
    dst, partial = dest_dirs(tmp_path)
    f = Fetcher(str(dst), str(partial), [dict(name="slow", url=slow.url)], timeout=2)
    killer = threading.Timer(0.6, slow.kill)
    killer.start()
    with pytest.raises(FetchFailed) as failed:
        f.fetch({big: sums[big]})
    killer.join()
    kept = (partial / big).stat().st_size
    assert 0 < kept < size
    assert "slow (%s)" % slow.url in str(failed.value) and "is kept" in str(failed.value)
    assert not (dst / big).exists()  # nothing half-written in the model directory
    fresh = Running(src, manifest)
    try:
        again = Fetcher(str(dst), str(partial), [dict(name="fresh", url=fresh.url)])
        again.fetch({big: sums[big]})
        assert hashlib.sha256((dst / big).read_bytes()).hexdigest() == sums[big]
        assert again.files[0]["resumed_from"] == kept
        assert fresh.stats()["bytes"] == size - kept  # only the rest crossed the network
    finally:
        fresh.stop()


def test_dead_source_falls_back_to_the_next(tmp_path, source):
    src, manifest, sums = source
    dead = Running(src, manifest)
    dead.stop()
    alive = Running(src, manifest, address="127.0.0.3")
    try:
        dst, partial = dest_dirs(tmp_path)
        f = Fetcher(
            str(dst), str(partial), [dict(name="dead", url=dead.url), dict(name="alive", url=alive.url)], timeout=3
        )
        f.fetch(sums)
        assert [x["source"] for x in f.files] == ["alive"] * 3  # sticky after the first failure
        assert f.failures[0]["source"] == "dead" and "Refused" in f.failures[0]["error"]
        assert sorted(p.name for p in dst.iterdir()) == sorted(sums)
    finally:
        alive.stop()


def test_every_source_dead_fails_naming_them(tmp_path, source):
    src, manifest, sums = source
    a, b = Running(src, manifest), Running(src, manifest, address="127.0.0.4")
    a.stop()
    b.stop()
    dst, partial = dest_dirs(tmp_path)
    f = Fetcher(str(dst), str(partial), [dict(name="kf-a", url=a.url), dict(name="kf-b", url=b.url)], timeout=2)
    with pytest.raises(FetchFailed) as failed:
        f.fetch(sums)
    msg = str(failed.value)
    assert "kf-a (%s)" % a.url in msg and "kf-b (%s)" % b.url in msg
    assert list(dst.iterdir()) == []


def test_wrong_bytes_are_discarded_never_renamed(tmp_path, source):
    """A source whose file differs from the manifest: the file is discarded, fetched again
    from the next source, and only the verified one is renamed into place."""
    src, manifest, sums = source
    bad_dir = tmp_path / "bad" / DIR
    bad_dir.mkdir(parents=True)
    for rel in sums:
        (bad_dir / rel).write_bytes((src / rel).read_bytes())
    (bad_dir / "config.json").write_text('{"model_type": "evil"}')
    bad, good = Running(bad_dir, manifest), Running(src, manifest, address="127.0.0.5")
    try:
        dst, partial = dest_dirs(tmp_path)
        f = Fetcher(str(dst), str(partial), [dict(name="bad", url=bad.url), dict(name="good", url=good.url)])
        f.fetch({"config.json": sums["config.json"]})
        assert hashlib.sha256((dst / "config.json").read_bytes()).hexdigest() == sums["config.json"]
        assert "discarded" in f.failures[0]["error"] and f.files[0]["source"] == "good"
        only_bad = Fetcher(str(dst / "x"), str(partial), [dict(name="bad", url=bad.url)])
        with pytest.raises(FetchFailed):
            only_bad.fetch({"config.json": sums["config.json"]})
        assert not (dst / "x" / "config.json").exists()
    finally:
        bad.stop()
        good.stop()


def test_bound_per_source_respected_with_more_pullers(tmp_path, source):
    """Five hosts pull from one source bounded at 2: the share never serves more than 2 at
    once, the others are told to wait (503) and all end with the verified files."""
    src, manifest, sums = source
    share = Running(src, manifest, max_transfers=2, rate=4 * 1024 * 1024)
    errors = []

    def pull(i):
        dst, partial = dest_dirs(tmp_path, "dst%d" % i)
        try:
            f = Fetcher(str(dst), str(partial), [dict(name="src", url=share.url)], sleep=lambda s: time.sleep(0.05))
            f.fetch(sums)
            for rel, want in sums.items():
                assert hashlib.sha256((dst / rel).read_bytes()).hexdigest() == want
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(5)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stats = share.stats()
        assert errors == []
        assert stats["peak"] == 2 and stats["refused_busy"] > 0
        assert stats["completed"] == 15
    finally:
        share.stop()


def test_range_past_the_end_means_the_partial_is_whole(tmp_path, source):
    """A run killed after the last byte but before the rename: the next run asks for the
    rest, the share answers 416, and the partial file is verified and renamed."""
    src, manifest, sums = source
    share = Running(src, manifest)
    try:
        dst, partial = dest_dirs(tmp_path)
        partial.mkdir(parents=True)
        (partial / "config.json").write_bytes((src / "config.json").read_bytes())
        f = Fetcher(str(dst), str(partial), [dict(name="s", url=share.url)])
        f.fetch({"config.json": sums["config.json"]})
        assert (dst / "config.json").read_bytes() == (src / "config.json").read_bytes()
        assert share.stats()["bytes"] == 0
    finally:
        share.stop()
