"""Monitoring on the served 3-host sim fleet (suite "monitoring-sim", lane "fleet", after
the e2e left the fleet served, monitored and behind its gateway): Prometheus on kf-node-1
(the monitoring group) scrapes every target, every dashboard query returns data, every
alert expression is one Prometheus evaluates, and three faults raise their alerts once
their `for:` window has passed (never before): a serving unit stopped
(KunlunServingHostDown), a device in error (KunlunXpuDeviceError, through the accelerator
exporter's textfile) and an engine that stalls under a running container (the stand-in's
fault below the line: /health still 200, nothing generated): the engine watchdog on the
gateway quarantines it (KunlunWorkerQuarantined, through the gateway exporter), all shown
by `kunlun-fleet status` (the alerts, the stopped service and the quarantine in their
hosts' rows). The fleet is put back as it was (the unit started and serving, the fault
removed, the stalled host restarted and re-admitted by the watchdog).

Prometheus listens on kf-node-1's loopback only: the tests reach it the way an operator
does, through an SSH tunnel (`ssh -L`, docs/monitoring.md "Reaching Prometheus"), and check
that its port refuses the controller and that node-exporter answers on each host's fleet
address only."""

import json
import os
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import monitoring
from kunlun_fleet.sim.config import host_address
from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, host_curl, ssh, tunnel

pytestmark = [pytest.mark.sim, pytest.mark.slow]

# Prometheus on kf-node-1, through the tunnel the `prometheus` fixture opens.
PROMETHEUS = None
FAULTS = "/etc/kunlun-kit/faults"
# The two alerts' `for:` windows as the sim inventory sets them (shortened there; the
# default windows and the evaluation at which each alert fires are proved by promtool's
# unit tests of the rules, tests/unit/test_monitoring_rules.py). Here only the order of
# events: an alert fires once its condition has held for its window, never before.
SIM_VARS = yaml.safe_load((Path(REPO) / "inventories/sim/group_vars/all/sim.yml").read_text())
FOR_S = {
    "KunlunServingHostDown": SIM_VARS["monitoring_alert_serving_down_for"],
    "KunlunXpuDeviceError": SIM_VARS["monitoring_alert_xpu_error_for"],
}
FOR_S = {name: int(text[:-1]) * {"s": 1, "m": 60}[text[-1]] for name, text in FOR_S.items()}
# How long to wait for them at most (a timeout, not a figure: scrapes, evaluations and the
# exporter run every 15 s; a busy machine stretches each).
WAIT_S = max(FOR_S.values()) + 240


def api(path, **params):
    url = PROMETHEUS + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=15) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]


def firing(name):
    return [a for a in api("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]


@pytest.fixture(scope="module")
def prometheus(sim_fleet):
    """Prometheus on kf-node-1 (its loopback) through an SSH tunnel from the controller."""
    global PROMETHEUS
    with tunnel(1, 9090) as port:
        PROMETHEUS = "http://127.0.0.1:%d" % port
        yield PROMETHEUS
    PROMETHEUS = None


@pytest.fixture(scope="module")
def monitored(prometheus):
    """The fleet as the e2e left it: monitored by site.yml's monitoring stage. A re-run of
    the stage is not made here: that a converged fleet's re-run changes nothing is the e2e's
    second run of site.yml (tests/e2e/test_site.py, every stage, the monitoring one too).
    What this suite needs is Prometheus answering through the tunnel."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return api("/api/v1/status/buildinfo")["version"]
        except OSError as exc:
            assert time.monotonic() < deadline, "Prometheus on kf-node-1 does not answer through the tunnel: %s" % exc
            time.sleep(2)


def test_every_target_is_up(monitored):
    deadline = time.monotonic() + 60
    while True:
        targets = api("/api/v1/targets")["activeTargets"]
        down = [
            (t["labels"]["job"], t["labels"].get("host"), t["health"], t.get("lastError"))
            for t in targets
            if t["health"] != "up"
        ]
        if not down or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert not down, down
    jobs = {}
    for t in targets:
        jobs.setdefault(t["labels"]["job"], set()).add(t["labels"]["host"])
    hosts = {"kf-node-1", "kf-node-2", "kf-node-3"}
    assert jobs == {"vllm": hosts, "node": hosts, "router": {"kf-node-1"}, "prometheus": {"kf-node-1"}}, jobs
    # Nothing but the tunnel reaches Prometheus: its port is on loopback, the controller's
    # connection to the host's address fails.
    with pytest.raises(OSError):
        socket.create_connection((host_address(1), 9090), timeout=5).close()
    # node-exporter answers on each host's fleet address, the one Prometheus scrapes, only.
    for index in (1, 2, 3):
        listening = ssh(index, "ss -Hltn 'sport = :9100'").stdout.split()
        assert [a for a in listening if a.endswith(":9100")] == ["%s:9100" % host_address(index)], listening


def test_every_dashboard_query_returns_data_and_every_alert_evaluates(monitored):
    empty = []
    for where, expr in monitoring.queries(executable=True):
        result = api("/api/v1/query", query=expr)["result"]
        # An alert's expression is empty on a healthy fleet; a panel's must show something.
        if not where.startswith("alert ") and not result:
            empty.append("%s: %s" % (where, expr))
    assert not empty, "queries with no data on the served fleet:\n" + "\n".join(empty)
    # the accelerator exporter's per-device series, for each serving host's 8 devices
    devices = api("/api/v1/query", query="count by (host) (kunlun_xpu_up == 1)")["result"]
    assert {r["metric"]["host"]: r["value"][1] for r in devices} == {
        "kf-node-1": "8",
        "kf-node-2": "8",
        "kf-node-3": "8",
    }, devices


def not_after(host, path):
    """A certificate file's expiry on a host, as openssl reads it there (epoch seconds)."""
    end = ssh(host, "openssl x509 -noout -enddate -in %s" % path).stdout.strip()
    return ssl.cert_time_to_seconds(end.split("=", 1)[1])


def test_the_fleet_certificates_expiry_reaches_prometheus(monitored):
    """kunlun-cert-exporter on every host: Prometheus holds the fleet registry's certificate
    expiry (the builder, kf-node-1) and each serving host's TLS certificate's (the fleet CA's,
    docs/gateway.md "Workers over TLS"), each equal to what openssl reads on its host; a
    certificate file a host does not have is exported by none."""
    expected = {("kf-node-1", "registry"): not_after(1, "/etc/kunlun-registry/registry.crt")}
    for i in (1, 2, 3):
        expected[("kf-node-%d" % i, "serving")] = not_after(i, "/etc/kunlun-serve/tls/server.crt")
    deadline = time.monotonic() + 60
    while True:
        result = api("/api/v1/query", query="kunlun_cert_not_after_timestamp_seconds")["result"]
        if len(result) >= len(expected) or time.monotonic() > deadline:
            break
        time.sleep(3)
    found = {(r["metric"]["host"], r["metric"]["cert"]): float(r["value"][1]) for r in result}
    assert found == expected, found


def router_workers():
    """The gateway's router's list, read on the gateway host (its admin API is loopback only)."""
    return json.loads(ssh(1, "curl -sf http://127.0.0.1:8081/list_workers").stdout)["urls"]


def watchdog_state():
    out = ssh(1, "cat /var/lib/kunlun-watchdog/state.json", check=False).stdout
    return json.loads(out) if out.strip() else {}


def test_stopped_server_device_error_and_stalled_engine_raise_their_alerts(monitored):
    assert not firing("KunlunServingHostDown") and not firing("KunlunXpuDeviceError")
    assert not firing("KunlunWorkerQuarantined")
    assert len(router_workers()) == 3
    ssh(2, "cp %s %s.before-test && echo xpu_error_device=3 >> %s" % (FAULTS, FAULTS, FAULTS))
    # The engine core hangs in kf-node-2's serving container (the stand-in's fault file,
    # inside the container: kunlun_fleet/sim/artifacts/README.md, "Engine faults").
    ssh(2, "docker exec kunlun-serve sh -c 'echo stall > /tmp/kunlun-sim-engine-fault'")
    ssh(3, "systemctl stop kunlun-serve.service")
    started = time.monotonic()
    seen = {}
    try:

        def wait(name, host):
            while time.monotonic() - started < WAIT_S:
                alerts = [a for a in firing(name) if a["labels"].get("host") == host]
                if alerts:
                    seen[name] = (time.monotonic() - started, alerts[0])
                    return
                time.sleep(2)

        def wait_quarantine():
            while time.monotonic() - started < WAIT_S:
                alerts = [a for a in firing("KunlunWorkerQuarantined") if a["labels"].get("worker_host") == "kf-node-2"]
                if alerts:
                    seen["KunlunWorkerQuarantined"] = (time.monotonic() - started, alerts[0])
                    return
                time.sleep(2)

        waits = [
            threading.Thread(target=wait, args=("KunlunServingHostDown", "kf-node-3")),
            threading.Thread(target=wait, args=("KunlunXpuDeviceError", "kf-node-2")),
            threading.Thread(target=wait_quarantine),
        ]
        for t in waits:
            t.start()
        for t in waits:
            t.join()
        # `kunlun-fleet status` shows them, with the stopped host unhealthy (exit 2)
        proc = subprocess.run(
            [os.path.join(VENV_BIN, "kunlun-fleet"), "status", "-i", INVENTORY],
            cwd=REPO,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        shown = proc.stdout
        quarantine = watchdog_state().get("workers", {})
        listed = router_workers()
    finally:
        ssh(2, "mv %s.before-test %s" % (FAULTS, FAULTS))
        ssh(3, "systemctl start kunlun-serve.service")
        # A restart clears the stall (a new container); the watchdog re-admits the host once
        # it passes readiness and the single-stream figure.
        ssh(2, "systemctl restart kunlun-serve.service")
    print("alerts fired after: %s" % {k: round(v[0]) for k, v in seen.items()})
    assert set(seen) == {"KunlunServingHostDown", "KunlunXpuDeviceError", "KunlunWorkerQuarantined"}, (
        seen,
        quarantine,
    )
    node2 = {url: w for url, w in quarantine.items() if w["host"] == "kf-node-2"}
    assert [w["state"] for w in node2.values()] == ["quarantined"], quarantine
    assert [w["kind"] for w in node2.values()] == ["stuck"], quarantine
    assert not set(node2) & set(listed), listed
    assert seen["KunlunWorkerQuarantined"][1]["labels"]["kind"] == "stuck"
    for name, (after, alert) in seen.items():
        if name not in FOR_S:
            continue
        # not before its `for:` window (the condition began after `started`)
        assert after >= FOR_S[name], (name, after, FOR_S[name])
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], alert
    assert seen["KunlunXpuDeviceError"][1]["labels"]["device"] == "3"
    assert proc.returncode == 2, shown + proc.stderr[-3000:]
    assert "alerts firing: " in shown and "(Prometheus on kf-node-1)" in shown, shown
    assert "  KunlunServingHostDown [critical] kf-node-3: " in shown, shown
    assert "  KunlunXpuDeviceError [critical] kf-node-2 device 3: " in shown, shown
    # The same run's rows: the stopped service named in kf-node-3's, the two others healthy
    # (a row's accelerators are the driver stage's facts; the live device error is the
    # alert's). The one test of a stopped service through `kunlun-fleet status` on the sim
    # fleet; the row's fields are unit-tested in tests/unit/test_status.py.
    line = {row.split(" ", 1)[0]: row for row in shown.splitlines() if row.startswith("kf-node-")}
    assert re.search(r"UNHEALTHY: .*kunlun-serve\.service is (inactive|failed)", line["kf-node-3"]), line
    assert re.search(r"UNHEALTHY: .*quarantined by the engine watchdog on kf-node-1 \(stuck\)", line["kf-node-2"]), line
    assert "UNHEALTHY" not in line["kf-node-1"], line
    # the host serves again (the next suites need the fleet served)
    deadline = time.monotonic() + 300
    while ssh(3, host_curl("/health") + " -sf -o /dev/null", check=False).returncode != 0:
        assert time.monotonic() < deadline, "kf-node-3 did not serve again after its unit was started"
        time.sleep(2)
    # kf-node-2 back in the gateway by the watchdog's own re-admission (restart, readiness,
    # figure), as an operator's restart brings a quarantined host back.
    while len(router_workers()) != 3:
        assert time.monotonic() < deadline, "kf-node-2 not re-admitted after its restart: %s" % watchdog_state()
        time.sleep(2)
    node2 = [w for w in watchdog_state()["workers"].values() if w["host"] == "kf-node-2"][0]
    assert node2["state"] == "serving" and len(node2["readmissions"]) == 1, node2
