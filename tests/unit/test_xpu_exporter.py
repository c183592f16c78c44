"""The monitoring role's textfile exporters (roles/monitoring/files), run as the role
installs them: kunlun-xpu-exporter next to kunlun_textfile.py and a copy of the product's
module_utils/xpu_smi.py, against the hardware kit's xpu-smi stand-in
(kunlun_fleet/sim/kit/xre/xpu-smi, its state and faults below $XRE_PREFIX:
kunlun_fleet/sim/kit/XPU.md); kunlun-gateway-exporter against a stand-in router answering
GET /workers and the engine watchdog's state files. Each output is read by a strict parser
of the exposition format and by `promtool check metrics`."""

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "monitoring" / "files"
KIT_SMI = ROOT / "kunlun_fleet" / "sim" / "kit" / "xre" / "xpu-smi"
PROMTOOL_FIX = "promtool is missing: run `make system-deps` (scripts/install-system-deps.sh, as root) to install it"
MIB = 1024 * 1024


def promtool():
    path = shutil.which("promtool", path="/usr/local/bin:" + os.environ.get("PATH", ""))
    if not path:
        pytest.fail(PROMTOOL_FIX)
    return path


def kit_module():
    loader = importlib.machinery.SourceFileLoader("kit_xpu_smi", str(KIT_SMI))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ in the kit's xre/ (the payload of the XRE installer the sim builds).
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


KIT = kit_module()

# ------------------------------------------------------------------ the exposition format

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
_VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|[+-]Inf)"
_SAMPLE_RE = re.compile(r"^(%s)(?:\{(%s(?:,%s)*)\})? (%s)$" % (_NAME, _LABEL, _LABEL, _VALUE))
_HELP_RE = re.compile(r"^# HELP (%s) (.+)$" % _NAME)
_TYPE_RE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % _NAME)


def parse_exposition(text):
    """{name: {'help', 'type', 'samples': [(labels, value)]}}, strictly: every line is a
    HELP, TYPE or sample line; HELP then TYPE once per family, before its samples; a
    family's samples together; no duplicate series; the text ends with a newline."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    families, current, seen = {}, None, set()
    for number, line in enumerate(text[:-1].split("\n"), 1):
        m = _HELP_RE.match(line)
        if m:
            assert m.group(1) not in families, "line %d: family %s twice" % (number, m.group(1))
            current = families[m.group(1)] = {"help": m.group(2), "type": None, "samples": []}
            continue
        m = _TYPE_RE.match(line)
        if m:
            assert current is families.get(m.group(1)) and current["type"] is None and not current["samples"], (
                "line %d: TYPE of %s not right after its HELP" % (number, m.group(1))
            )
            current["type"] = m.group(2)
            continue
        m = _SAMPLE_RE.match(line)
        assert m, "line %d is not exposition format: %r" % (number, line)
        name = m.group(1)
        assert current is families.get(name) and current["type"], "line %d: sample of %s outside its family" % (
            number,
            name,
        )
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen, "line %d: duplicate series %s" % (number, key)
        seen.add(key)
        current["samples"].append((labels, float(m.group(3))))
    return families


def promtool_check(text):
    proc = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, "promtool check metrics: %s%s" % (proc.stdout, proc.stderr)


def by_device(families, name):
    return {labels["device"]: (labels, value) for labels, value in families[name]["samples"]}


# ------------------------------------------------------------------ the accelerator exporter


@pytest.fixture
def installed(tmp_path):
    """The exporter laid out as the role installs it (monitoring_exporter_dir)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(FILES / "kunlun-xpu-exporter", lib / "kunlun-xpu-exporter")
    shutil.copy(FILES / "kunlun-gateway-exporter", lib / "kunlun-gateway-exporter")
    shutil.copy(FILES / "kunlun_textfile.py", lib / "kunlun_textfile.py")
    shutil.copy(ROOT / "module_utils" / "xpu_smi.py", lib / "xpu_smi.py")
    return lib


@pytest.fixture
def kit(tmp_path):
    """A kit state under $XRE_PREFIX: the XRE installed, kunlun loaded; faults as asked."""
    prefix = tmp_path / "prefix"
    (prefix / "run/kunlun-kit/modules/kunlun").mkdir(parents=True)
    (prefix / "run/kunlun-kit/modules/kunlun/version").write_text("5.0.21.26\n")
    (prefix / "usr/local/xpu").mkdir(parents=True)
    (prefix / "usr/local/xpu/version").write_text("5.0.21.26\n")
    (prefix / "etc/kunlun-kit").mkdir(parents=True)
    (prefix / "etc/kunlun-kit/faults").write_text("")
    return prefix


def run_exporter(installed, out_dir, prefix=None, faults="", smi=KIT_SMI, proc_dir=None, timeout=10):
    if prefix is not None:
        (prefix / "etc/kunlun-kit/faults").write_text(faults)
    out_dir.mkdir(exist_ok=True)
    env = dict(os.environ, XRE_PREFIX=str(prefix or "/nonexistent"))
    argv = [
        sys.executable,
        str(installed / "kunlun-xpu-exporter"),
        "--xpu-smi",
        str(smi),
        "--output-dir",
        str(out_dir),
        "--timeout",
        str(timeout),
    ]
    if proc_dir is not None:
        argv += ["--proc-dir", str(proc_dir)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    text = (out_dir / "kunlun_xpu.prom").read_text()
    return proc, text, parse_exposition(text)


def test_eight_healthy_devices_every_value(installed, kit, tmp_path):
    proc, text, fam = run_exporter(installed, tmp_path / "out", kit)
    assert proc.returncode == 0, proc.stderr
    promtool_check(text)
    assert fam["kunlun_xpu_smi_up"]["samples"] == [({}, 1.0)]
    assert fam["kunlun_xpu_devices"]["samples"] == [({}, 8.0)]
    assert fam["kunlun_xpu_driver_info"]["samples"] == [
        ({"driver_version": "5.0.21.26", "runtime_version": "5.0.21"}, 1.0)
    ]
    up = by_device(fam, "kunlun_xpu_up")
    assert sorted(up, key=int) == [str(i) for i in range(8)]
    for i in range(8):
        labels, value = up[str(i)]
        assert value == 1
        assert labels == {
            "device": str(i),
            "bus_id": "00000000:%s:00.0" % KIT.BUS_IDS[i],
            "part_number": "B00100300110112",
            "card_variant": "VC",
        }
        assert by_device(fam, "kunlun_xpu_memory_total_bytes")[str(i)][1] == 98304 * MIB
        assert by_device(fam, "kunlun_xpu_memory_used_bytes")[str(i)][1] == 0
        assert by_device(fam, "kunlun_xpu_temperature_celsius")[str(i)][1] == 36 + i % 4
        assert by_device(fam, "kunlun_xpu_power_usage_watts")[str(i)][1] == 84 + i % 3
        assert by_device(fam, "kunlun_xpu_power_cap_watts")[str(i)][1] == 400
        assert by_device(fam, "kunlun_xpu_utilization_ratio")[str(i)][1] == 0
        assert by_device(fam, "kunlun_xpu_error_fields")[str(i)][1] == 0
        info = by_device(fam, "kunlun_xpu_info")[str(i)][0]
        assert info["name"] == "P800 OAM" and info["firmware_version"] == "1.0.2.14.1.54"
        assert re.match(r"^02K[0-9A-F]{6}%04d$" % (10 + i), info["serial"]) and info["uuid"].startswith("XPU-")
    # Units and scales say which in HELP: the ratio is 0..1, not percent.
    assert "ratio from 0 to 1" in fam["kunlun_xpu_utilization_ratio"]["help"]
    for name, family in fam.items():
        assert family["type"] == "gauge" and family["help"], name


def test_a_device_in_error_is_down_and_reports_no_made_up_values(installed, kit, tmp_path):
    proc, text, fam = run_exporter(installed, tmp_path / "out", kit, faults="xpu_error_device=3\n")
    assert proc.returncode == 0, proc.stderr
    promtool_check(text)
    up = by_device(fam, "kunlun_xpu_up")
    assert up["3"][1] == 0
    assert all(up[str(i)][1] == 1 for i in range(8) if i != 3)
    assert by_device(fam, "kunlun_xpu_error_fields")["3"][1] > 0
    assert fam["kunlun_xpu_devices"]["samples"] == [({}, 8.0)]
    # ERR! / Unknown Error are unknown: no sample, never a 0 that looks like a reading.
    for name in (
        "kunlun_xpu_temperature_celsius",
        "kunlun_xpu_memory_used_bytes",
        "kunlun_xpu_power_usage_watts",
        "kunlun_xpu_utilization_ratio",
    ):
        assert "3" not in by_device(fam, name), name
        assert len(by_device(fam, name)) == 7, name


def test_proc_state_other_than_running_is_an_error(installed, kit, tmp_path):
    proc_dir = tmp_path / "proc"
    for i in range(8):
        (proc_dir / "xpu" / ("dev%d" % i)).mkdir(parents=True)
        (proc_dir / "xpu" / ("dev%d" % i) / "state").write_text("HANG\n" if i == 5 else "RUNNING\n")
    proc, text, fam = run_exporter(installed, tmp_path / "out", kit, proc_dir=proc_dir)
    up = by_device(fam, "kunlun_xpu_up")
    assert up["5"][1] == 0 and sum(v for _, v in up.values()) == 7


def test_seven_of_eight_devices(installed, kit, tmp_path):
    proc, text, fam = run_exporter(installed, tmp_path / "out", kit, faults="xpu_devices=7\n")
    assert proc.returncode == 0, proc.stderr
    promtool_check(text)
    assert fam["kunlun_xpu_devices"]["samples"] == [({}, 7.0)]
    assert sorted(by_device(fam, "kunlun_xpu_up"), key=int) == [str(i) for i in range(7)]


def test_card_variant_and_power_cap_per_device(installed, kit, tmp_path):
    proc, text, fam = run_exporter(
        installed, tmp_path / "out", kit, faults="xpu_card_variant=mixed\nxpu_power_cap=2:120,5:N/A\n"
    )
    up = by_device(fam, "kunlun_xpu_up")
    assert [up[str(i)][0]["card_variant"] for i in range(8)] == ["VC"] * 4 + ["VD"] * 4
    assert up["7"][0]["part_number"] == "B00100300110312"
    caps = by_device(fam, "kunlun_xpu_power_cap_watts")
    assert caps["2"][1] == 120 and caps["0"][1] == 400
    assert "5" not in caps, "an unreadable cap (N/A) is unknown, not a figure"


def test_xpu_smi_missing_writes_only_smi_up_0_over_a_good_file(installed, kit, tmp_path):
    out = tmp_path / "out"
    run_exporter(installed, out, kit)
    assert "kunlun_xpu_up{" in (out / "kunlun_xpu.prom").read_text()
    proc, text, fam = run_exporter(installed, out, kit, smi=tmp_path / "no-such-xpu-smi")
    assert proc.returncode == 0
    assert "xpu-smi not found" in proc.stderr
    promtool_check(text)
    assert set(fam) == {"kunlun_xpu_smi_up", "kunlun_xpu_exporter_last_run_timestamp_seconds"}
    assert fam["kunlun_xpu_smi_up"]["samples"] == [({}, 0.0)]
    assert "device=" not in text


def test_xpu_smi_failing_driver_not_loaded(installed, kit, tmp_path):
    shutil.rmtree(kit / "run/kunlun-kit/modules/kunlun")
    proc, text, fam = run_exporter(installed, tmp_path / "out", kit)
    assert proc.returncode == 0
    assert "exited 9" in proc.stderr and "No XPU device found" in proc.stderr
    assert set(fam) == {"kunlun_xpu_smi_up", "kunlun_xpu_exporter_last_run_timestamp_seconds"}
    assert fam["kunlun_xpu_smi_up"]["samples"] == [({}, 0.0)]


def test_xpu_smi_hanging_is_cut_at_the_timeout(installed, tmp_path):
    hang = tmp_path / "bin" / "xpu-smi"
    hang.parent.mkdir()
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    proc, text, fam = run_exporter(installed, tmp_path / "out", smi=hang, timeout=1)
    assert "timed out" in proc.stderr
    assert fam["kunlun_xpu_smi_up"]["samples"] == [({}, 0.0)]
    assert "kunlun_xpu_devices" not in fam


def test_the_timestamp_is_the_time_of_the_run(installed, kit, tmp_path):
    import time

    before = time.time()
    _, _, fam = run_exporter(installed, tmp_path / "out", kit)
    ((_, stamp),) = fam["kunlun_xpu_exporter_last_run_timestamp_seconds"]["samples"]
    assert before - 1 <= stamp <= time.time() + 1


# ------------------------------------------------------------------ atomic writes


@pytest.fixture
def textfile(installed, monkeypatch):
    monkeypatch.syspath_prepend(str(installed))
    sys.modules.pop("kunlun_textfile", None)
    import kunlun_textfile

    yield kunlun_textfile
    sys.modules.pop("kunlun_textfile", None)


def test_write_is_a_rename_of_a_synced_file_in_the_same_directory(textfile, tmp_path, monkeypatch):
    (tmp_path / "textfile").mkdir()
    target = tmp_path / "textfile" / "kunlun_xpu.prom"
    target.write_text("old 1\n")
    seen = {}
    real_replace, real_fsync = os.replace, os.fsync
    synced = []

    def fsync(fd):
        synced.append(os.readlink("/proc/self/fd/%d" % fd))
        return real_fsync(fd)

    def replace(src, dst):
        seen.update(
            src=Path(src),
            dst=Path(dst),
            target_then=target.read_text(),
            tmp=Path(src).read_text(),
            synced_before=list(synced),
        )
        return real_replace(src, dst)

    monkeypatch.setattr(textfile.os, "fsync", fsync)
    monkeypatch.setattr(textfile.os, "replace", replace)
    textfile.write_atomic(str(target), "new 2\n")
    assert seen["dst"] == target
    assert seen["src"].parent == target.parent, "the temporary file must be on the target's filesystem"
    assert not seen["src"].name.endswith(".prom"), "node-exporter would read the temporary file"
    assert seen["target_then"] == "old 1\n", "the target was touched before the rename"
    assert seen["tmp"] == "new 2\n" and str(seen["src"]) in seen["synced_before"], "not synced before the rename"
    assert target.read_text() == "new 2\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in target.parent.iterdir()) == ["kunlun_xpu.prom"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(textfile, tmp_path, monkeypatch):
    (tmp_path / "textfile").mkdir()
    target = tmp_path / "textfile" / "kunlun_xpu.prom"
    target.write_text("old 1\n")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(textfile.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        textfile.write_atomic(str(target), "new 2\n")
    assert target.read_text() == "old 1\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["kunlun_xpu.prom"]


def test_the_exporter_reports_a_directory_it_cannot_write(installed, kit, tmp_path):
    env = dict(os.environ, XRE_PREFIX=str(kit))
    proc = subprocess.run(
        [
            sys.executable,
            str(installed / "kunlun-xpu-exporter"),
            "--xpu-smi",
            str(KIT_SMI),
            "--output-dir",
            str(tmp_path / "missing"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "cannot write" in proc.stderr and "Fix:" in proc.stderr


def test_label_values_are_escaped(textfile):
    exp = textfile.Exposition([("m", "gauge", 'a "help"\\ with\nnewline')])
    exp.add("m", 1.5, {"a": 'x"y\\z\nw', "empty": "", "none": None})
    text = exp.render()
    assert text == '# HELP m a "help"\\\\ with\\nnewline\n# TYPE m gauge\nm{a="x\\"y\\\\z\\nw"} 1.5\n'
    parse_exposition(text)
    promtool_check(text)


# ------------------------------------------------------------------ the gateway exporter


class _Router(BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != "/workers":
            self.send_error(404)
            return
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def router():
    """A stand-in vllm-router answering GET /workers as 0.1.17 does ({"workers": [{url,
    is_healthy, ...}]}, what the gateway role's molecule scenario reads)."""
    handler = type("Router", (_Router,), {})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, "http://127.0.0.1:%d" % server.server_port
    server.shutdown()
    server.server_close()


def run_gateway_exporter(installed, out_dir, url, watchdog_state=None):
    """watchdog_state: the watchdog's state file (default one that does not exist, never
    this machine's /var/lib/kunlun-watchdog/state.json)."""
    out_dir.mkdir(exist_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            str(installed / "kunlun-gateway-exporter"),
            "--url",
            url,
            "--output-dir",
            str(out_dir),
            "--timeout",
            "2",
            "--watchdog-state",
            str(watchdog_state or out_dir.parent / "no-watchdog" / "state.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = (out_dir / "kunlun_gateway.prom").read_text()
    return proc, text, parse_exposition(text)


def test_gateway_exporter_lists_each_worker_and_its_health(installed, router, tmp_path):
    handler, url = router
    handler.body = json.dumps(
        {
            "workers": [
                {"url": "http://10.20.1.12:8000", "is_healthy": False, "load": 0},
                {"url": "http://10.20.1.11:8000", "is_healthy": True, "load": 3},
            ],
            "total": 2,
        }
    ).encode()
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", url)
    assert proc.returncode == 0, proc.stderr
    promtool_check(text)
    assert fam["kunlun_gateway_router_up"]["samples"] == [({}, 1.0)]
    assert fam["kunlun_gateway_workers"]["samples"] == [({}, 2.0)]
    assert fam["kunlun_gateway_worker_healthy"]["samples"] == [
        ({"worker": "http://10.20.1.11:8000"}, 1.0),
        ({"worker": "http://10.20.1.12:8000"}, 0.0),
    ]


@pytest.mark.parametrize("body, status", [(b"not json", 200), (b'{"urls": []}', 200), (b"{}", 500)])
def test_gateway_exporter_router_answering_wrong_is_down(installed, router, tmp_path, body, status):
    handler, url = router
    handler.body, handler.status = body, status
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", url)
    assert proc.returncode == 0
    assert set(fam) == {"kunlun_gateway_router_up", "kunlun_gateway_exporter_last_run_timestamp_seconds"}
    assert fam["kunlun_gateway_router_up"]["samples"] == [({}, 0.0)]


def test_gateway_exporter_router_not_listening(installed, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", "http://127.0.0.1:%d" % port)
    assert fam["kunlun_gateway_router_up"]["samples"] == [({}, 0.0)]
    assert "worker=" not in text
    promtool_check(text)


# ------------------------------------------------------------------ the watchdog's state (gateway exporter)
WATCHDOG_STATE = {
    "version": 1,
    "updated": 1764866400.5,
    "interval_s": 10,
    "workers": {
        "http://10.91.0.12:8000": {
            "host": "kf-node-2",
            "state": "quarantined",
            "kind": "stuck",
            "reason": "stuck: 2 rounds with requests running (3) and vllm:generation_tokens_total not moving",
            "since": 1764866380.1,
            "evidence": "/var/lib/kunlun-watchdog/evidence/kf-node-2-20261204T170000Z.tar.gz",
            "hold": True,
            "readmissions": [1764860000.0, 1764863000.0],
            "decode_tok_s": None,
            "fleet_decode_tok_s": 31.5,
        },
        "http://10.91.0.11:8000": {
            "host": "kf-node-1",
            "state": "serving",
            "kind": "",
            "reason": "",
            "since": 1764866000.0,
            "evidence": "",
            "hold": False,
            "readmissions": [],
            "decode_tok_s": 30.9,
            "fleet_decode_tok_s": 31.5,
        },
        "http://10.91.0.13:8000": {
            "host": "kf-node-3",
            "state": "suspect",
            "kind": "slow",
            "reason": "slow: 12.1 tok/s against the fleet's 31.5",
            "since": 1764866390.0,
            "evidence": "",
            "hold": False,
            "readmissions": [],
            "decode_tok_s": 12.1,
            "fleet_decode_tok_s": 31.5,
        },
    },
}
WATCHDOG_SERIES = {
    "kunlun_watchdog_state_readable",
    "kunlun_watchdog_last_round_timestamp_seconds",
    "kunlun_watchdog_worker_quarantined",
    "kunlun_watchdog_worker_hold",
    "kunlun_watchdog_worker_decode_tokens_per_second",
}


def test_gateway_exporter_exports_the_watchdogs_verdicts(installed, router, tmp_path):
    handler, url = router
    handler.body = json.dumps({"workers": [{"url": "http://10.91.0.11:8000", "is_healthy": True}]}).encode()
    state = tmp_path / "state.json"
    state.write_text(json.dumps(WATCHDOG_STATE))
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", url, state)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    promtool_check(text)
    assert fam["kunlun_gateway_worker_healthy"]["samples"] == [({"worker": "http://10.91.0.11:8000"}, 1.0)]
    assert fam["kunlun_watchdog_state_readable"]["samples"] == [({}, 1.0)]
    assert fam["kunlun_watchdog_last_round_timestamp_seconds"]["samples"] == [({}, 1764866400.5)]
    one, two, three = ({"worker": "http://10.91.0.1%d:8000" % i, "worker_host": "kf-node-%d" % i} for i in (1, 2, 3))
    # Every worker of the file; kind only where the watchdog gives one (an empty label is none).
    assert fam["kunlun_watchdog_worker_quarantined"]["samples"] == [
        (one, 0.0),
        (dict(two, kind="stuck"), 1.0),
        (dict(three, kind="slow"), 0.0),
    ]
    assert fam["kunlun_watchdog_worker_hold"]["samples"] == [(one, 0.0), (two, 1.0), (three, 0.0)]
    # No rate measured (null): no series, never a made-up 0.
    assert fam["kunlun_watchdog_worker_decode_tokens_per_second"]["samples"] == [(one, 30.9), (three, 12.1)]
    assert all(fam[name]["type"] == "gauge" for name in WATCHDOG_SERIES)


def test_gateway_exporter_without_a_watchdog_exports_none_of_it(installed, router, tmp_path):
    handler, url = router
    handler.body = json.dumps({"workers": []}).encode()
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", url, tmp_path / "absent" / "state.json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert not WATCHDOG_SERIES & set(fam) and "kunlun_watchdog" not in text


def test_gateway_exporter_given_no_watchdog_state_reads_none(installed, router, tmp_path):
    """--watchdog-state= (the watchdog turned off on this gateway): its state left behind
    is not read."""
    handler, url = router
    handler.body = json.dumps({"workers": []}).encode()
    (tmp_path / "state.json").write_text(json.dumps(WATCHDOG_STATE))
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(installed / "kunlun-gateway-exporter"), "--url", url, "--output-dir", str(out)]
        + ["--watchdog-state="],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    fam = parse_exposition((out / "kunlun_gateway.prom").read_text())
    assert "kunlun_gateway_router_up" in fam and not WATCHDOG_SERIES & set(fam)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        json.dumps(dict(WATCHDOG_STATE, version=2)).encode(),
        json.dumps(dict(WATCHDOG_STATE, updated="yesterday")).encode(),
        json.dumps(dict(WATCHDOG_STATE, workers=[])).encode(),
        json.dumps(dict(WATCHDOG_STATE, workers={"http://10.91.0.11:8000": {"host": "kf-node-1"}})).encode(),
        None,  # a directory where the file should be: cannot be read
    ],
)
def test_gateway_exporter_with_a_garbled_watchdog_state_says_it_unreadable(installed, router, tmp_path, content):
    handler, url = router
    handler.body = json.dumps({"workers": []}).encode()
    state = tmp_path / "state.json"
    if content is None:
        state.mkdir()
    else:
        state.write_bytes(content)
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", url, state)
    assert proc.returncode == 0
    promtool_check(text)
    assert fam["kunlun_watchdog_state_readable"]["samples"] == [({}, 0.0)]
    assert WATCHDOG_SERIES & set(fam) == {"kunlun_watchdog_state_readable"}
    assert "writing kunlun_watchdog_state_readable 0" in proc.stderr and str(state) in proc.stderr


def test_gateway_exporter_exports_the_watchdog_while_the_router_is_down(installed, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = tmp_path / "state.json"
    state.write_text(json.dumps(WATCHDOG_STATE))
    proc, text, fam = run_gateway_exporter(installed, tmp_path / "out", "http://127.0.0.1:%d" % port, state)
    assert fam["kunlun_gateway_router_up"]["samples"] == [({}, 0.0)] and "kunlun_gateway_workers" not in fam
    assert fam["kunlun_watchdog_state_readable"]["samples"] == [({}, 1.0)]
    assert len(fam["kunlun_watchdog_worker_quarantined"]["samples"]) == 3


def test_the_driver_label_is_the_xre_release_on_a_build_printing_515_58(installed, kit, tmp_path):
    """xpu-smi builds printing 'Driver Version: 515.58  XPU-RT Version: N/A' carry no XRE
    release in their header: the label takes it from /proc/kunlun/version
    (xpu_smi.driver_release), as the driver stage does."""
    proc_dir = tmp_path / "proc"
    (proc_dir / "kunlun").mkdir(parents=True)
    (proc_dir / "kunlun" / "version").write_text("KUNLUN driver version: 5.0.21.26\n")
    proc, text, fam = run_exporter(installed, tmp_path / "out", kit, faults="xpu_smi_build=515.58\n", proc_dir=proc_dir)
    assert proc.returncode == 0, proc.stderr
    assert fam["kunlun_xpu_driver_info"]["samples"] == [({"driver_version": "5.0.21.26"}, 1.0)]
