"""The product's engine-facing code against the real vLLM 0.15.1 and the stand-in, run as
Ansible runs it (ansible-playbook on localhost, the project's library and roles):
readiness (serving_ready), the drain's in-flight read (the serve role's own tasks from
roles/serve/tasks/drain.yml), host_status's requests running and waiting, the acceptance
role's streamed line, a bench point (bench_point with the bench venv's aiperf, gated
valid), and Prometheus scraping the real server with the project's alert rules."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

import contract
import engine

pytestmark = pytest.mark.slow
ROOT = engine.ROOT
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import benchkit  # noqa: E402
from promtool_helper import promtool  # noqa: E402


from kunlun_fleet import monitoring  # noqa: E402


def run_play(tmp: Path, plays, extra_path=None, timeout=600):
    """ansible-playbook on localhost with the project's ansible.cfg (library, roles); the
    json callback's document, and the output (for failures)."""
    book = tmp / "play.json"
    book.write_text(json.dumps(plays))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json",
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
        # Mitogen starts the local interpreter within the connection timeout (10 s by
        # default); beside a decoding engine on a busy 2-core machine it once took longer.
        ANSIBLE_TIMEOUT="60",
    )
    if extra_path:
        env["PATH"] = "%s:%s" % (extra_path, env["PATH"])
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=%s" % (ROOT / ".venv/bin/python"),
            str(book),
        ],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            "no json from ansible-playbook (rc %s):\n%s\n%s"
            % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
        ) from None
    return doc, proc


def results(doc):
    """{task name: localhost's result} over every play."""
    return {t["task"]["name"]: t["hosts"].get("localhost", {}) for play in doc["plays"] for t in play["tasks"]}


def drain_tasks():
    """The serve role's own drain read, verbatim: the wait on vllm:num_requests_running and
    _waiting, and what it finds still in flight (roles/serve/tasks/drain.yml)."""
    tasks = yaml.safe_load((engine.SERVE_ROLE / "tasks" / "drain.yml").read_text())
    names = ["Drain | Let in-flight requests finish", "Drain | What is still in flight"]
    found = [t for t in tasks if t.get("name") in names]
    assert [t["name"] for t in found] == names, "drain.yml no longer has the drain's tasks"
    return found


def systemctl_stub(tmp: Path) -> Path:
    """host_status reads the requests only when the serving unit is active: systemctl
    answers that as on a serving host (there is no systemd unit here, the server is a
    process of this test)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "systemctl"
    stub.write_text(
        '#!/bin/sh\n[ "$1" = show ] || exit 1\nprintf \'LoadState=loaded\\nActiveState=active\\n'
        "SubState=running\\nActiveEnterTimestamp=Wed 2026-12-02 10:00:00 UTC\\n"
        "ActiveEnterTimestampMonotonic=1000000\\n'\n"
    )
    stub.chmod(0o755)
    return bin_dir


def engine_plays(srv, tmp: Path, readiness):
    unit = tmp / "kunlun-serve.service"
    unit.write_text(srv.rendered.unit)
    port = srv.port
    status = {
        "name": "host_status",
        "host_status": {
            "unit_file": str(unit),
            "ca_file": engine.CA_FILE,
            "config_dir": str(tmp / "kunlun-serve"),
            "facts_file": str(tmp / "xpu.fact"),
            "mount_point": str(tmp),
            "image": "kunlun-serving:current",
            "command_timeout": 5,
        },
    }
    play = {
        "name": "engine-facing",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {
            "kunlun_stack_serving_effective": {"port": port},
            # The serve role's own names for the host's server and the CA file that verifies it.
            "serve_local_url": srv.base,
            "kunlun_stack_worker_ca_host": engine.CA_FILE,
            "serve_running": True,
            "serve_drain": True,
            "serve_drain_timeout": 2,
        },
        "tasks": [status] + drain_tasks(),
    }
    plays = [play]
    if readiness:
        play["tasks"].append(
            {
                "name": "serving_ready",
                "serving_ready": {
                    "url": srv.base,
                    "ca_file": engine.CA_FILE,
                    "served_model_name": srv.rendered.served_name,
                    "api_key": srv.api_key,
                    "timeout": 60,
                    "interval": 1,
                },
            }
        )
        plays.append(
            {
                "name": "acceptance",
                "hosts": "localhost",
                "gather_facts": False,
                "roles": [{"role": "acceptance"}],
                "vars": {
                    "acceptance_host_url": srv.base,
                    "acceptance_host_ca_file": engine.CA_FILE,
                    "acceptance_api_key": srv.api_key,
                    "acceptance_served_model_name": srv.rendered.served_name,
                    "acceptance_gateway_url": "",
                    "acceptance_fail_on_miss": False,
                    "acceptance_report_dir": str(tmp / "report"),
                },
            }
        )
    return plays


def test_readiness_drain_status_and_acceptance(which, servers, clients, tmp_path):
    srv, client = servers[which], clients[which]
    bin_dir = systemctl_stub(tmp_path)
    contract.wait_idle(client)
    # A request in flight: the drain and host_status must see it in vllm's own gauges.
    held = contract.InFlight(client)
    try:
        deadline = time.monotonic() + 60
        while contract.total(client.metrics(), "vllm:num_requests_running") != 1:
            assert time.monotonic() < deadline, "the held request never ran"
            time.sleep(0.2)
        (tmp_path / "busy").mkdir()
        busy_doc, busy_proc = run_play(
            tmp_path / "busy", engine_plays(srv, tmp_path / "busy", readiness=False), bin_dir
        )
    finally:
        held.close()
    contract.wait_idle(client)
    (tmp_path / "idle").mkdir()
    idle_doc, idle_proc = run_play(tmp_path / "idle", engine_plays(srv, tmp_path / "idle", readiness=True), bin_dir)
    out = busy_proc.stdout[-2000:] + idle_proc.stdout[-4000:] + idle_proc.stderr[-2000:]
    assert srv.api_key not in busy_proc.stdout + idle_proc.stdout + idle_proc.stderr, "the API key was printed"
    assert busy_proc.returncode == 0 == idle_proc.returncode, busy_proc.stdout[-3000:] + out
    busy, idle = results(busy_doc), results(idle_doc)

    # The drain: 1 in flight while the request ran (it would stop the rollout), 0 after.
    assert busy["Drain | What is still in flight"]["ansible_facts"]["serve_in_flight"] == 1, busy
    assert idle["Drain | What is still in flight"]["ansible_facts"]["serve_in_flight"] == 0, out
    assert idle["Drain | Let in-flight requests finish"].get("attempts", 1) == 1, out

    # host_status: the unit's model and port, and the requests the engine reports.
    want = {"model": srv.rendered.served_name, "port": srv.port, "error": ""}
    serving = busy["host_status"]["serving"]
    assert {k: serving[k] for k in want} == want, serving
    assert (serving["requests_running"], serving["requests_waiting"]) == (1, 0), serving
    serving = idle["host_status"]["serving"]
    assert (serving["requests_running"], serving["requests_waiting"], serving["error"]) == (0, 0, ""), serving

    # Readiness: the model listed, a real completion with text; the count is the usage's.
    ready = idle["serving_ready"]
    assert ready.get("failed") is not True and ready["ready"] is True, out
    assert ready["models"] == [srv.rendered.served_name] and ready["completion_text"], ready
    assert 1 <= ready["completion_tokens"] <= 32 and ready["ttft_s"] > 0, ready

    # Acceptance: its one line per host, over all 128 tokens (usage, not chunks: a real
    # engine sends no chunk for a token that ends inside a UTF-8 character).
    lines = (tmp_path / "idle" / "report" / "acceptance.txt").read_text().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"(PASS|FAIL) localhost: single stream \d+\.\d tok/s \(target 30\), first token \d+\.\d\d s, 128 tokens",
        lines[0],
    ), lines
    figures = json.loads((tmp_path / "idle" / "report" / "acceptance.json").read_text())["hosts"]["localhost"]
    assert figures["ready"] is True and figures["completion_tokens"] == 128 and figures["tokens_per_s"] > 0, figures


def test_a_bench_point_against_the_real_engine_is_valid(servers, clients, tmp_path):
    """bench_point (aiperf from the bench venv) against the real server: the responses'
    usage and vllm's counters agree, so the point is valid (issue #29's finding 2: the
    client's re-tokenized count was 25-60 % over the server's)."""
    if not benchkit.AIPERF.exists():
        pytest.skip(benchkit.NO_VENV)
    srv = servers["real"]
    contract.wait_idle(clients["real"])
    requests, osl = 8, 16
    doc, proc = run_play(
        tmp_path,
        [
            {
                "name": "bench point",
                "hosts": "localhost",
                "gather_facts": False,
                "tasks": [
                    {
                        "name": "point",
                        "bench_point": {
                            "aiperf": str(benchkit.AIPERF),
                            "url": srv.base,
                            "model": srv.rendered.served_name,
                            "tokenizer": str(srv.rendered.model_dir),
                            "api_key": srv.api_key,
                            "concurrency": 2,
                            "requests": requests,
                            "isl": 64,
                            "osl": osl,
                            "timeout": 120,
                            "workers": 1,
                            "metrics": [{"host": "real", "url": srv.base + "/metrics"}],
                            "ca_file": engine.CA_FILE,
                            "artifact_dir": str(tmp_path / "point"),
                            "label": "real-c2",
                        },
                    }
                ],
            }
        ],
        timeout=900,
    )
    r = results(doc)["point"]
    out = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert srv.api_key not in proc.stdout + proc.stderr
    assert r.get("failed") is not True and r["aiperf_rc"] == 0, out
    c = r["client"]
    assert (c["requests"], c["completed"], c["failed"]) == (requests, requests, 0), c
    assert r["server_output_tokens"] == requests * osl == c["usage_output_tokens"], r
    assert r["valid"] is True, "the point is marked invalid: %s (client %s, usage %s, servers %s)" % (
        r.get("validity"),
        c.get("output_tokens"),
        c.get("usage_output_tokens"),
        r.get("server_output_tokens"),
    )


# ------------------------------------------------------------------ Prometheus
def prometheus_config(tmp: Path, srv, prom_port):
    """prometheus.yml and the rules as the monitoring role renders them, for an inventory of
    one serving host (the real server) and this machine as the monitoring host; scrapes and
    evaluations every second, and TTFT p99 over a threshold no request stays under (1 ms),
    at once: the one alert a test can make fire against a real engine in seconds."""
    inventory = monitoring.default_inventory(
        hosts=["localhost"], gateways=[], monitoring=["localhost"], addresses={"localhost": engine.ADDRESS}
    )
    variables = monitoring.role_variables(
        dict(
            inventory,
            kunlun_stack_serving_overrides={"port": srv.port},
            # The monitoring host's copy of the CA that issued the servers' certificate.
            kunlun_stack_fleet_ca_host_path=engine.CA_FILE,
            monitoring_rules_dir=str(tmp / "rules"),
            monitoring_port=prom_port,
            monitoring_listen_host=engine.ADDRESS,
            monitoring_scrape_interval="1s",
            monitoring_scrape_timeout="1s",
            monitoring_evaluation_interval="1s",
        )
    )
    config = monitoring.render(monitoring.CONFIG_TEMPLATE, variables)
    rules = monitoring.render_rules({"monitoring_alert_ttft_p99_seconds": 0.001, "monitoring_alert_ttft_for": "0s"})
    (tmp / "rules").mkdir()
    (tmp / "rules" / "kunlun-fleet.yml").write_text(rules)
    (tmp / "prometheus.yml").write_text(config)
    return tmp / "prometheus.yml", tmp / "rules" / "kunlun-fleet.yml"


def prom_query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with engine.OPENER.open(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_prometheus_scrapes_the_real_engine_with_the_project_rules(servers, clients, tmp_path):
    prometheus = engine.prometheus_binary()
    if not prometheus:
        pytest.skip(
            "needs Prometheus's server binary: `make system-deps` (scripts/install-system-deps.sh "
            "takes it out of Debian's prometheus package)"
        )
    srv = servers["real"]
    port = benchkit.free_port()
    config, rules = prometheus_config(tmp_path, srv, port)
    for kind, path in (("config", config), ("rules", rules)):
        proc = subprocess.run([promtool(), "check", kind, str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen(
        [
            prometheus,
            "--config.file",
            str(config),
            "--storage.tsdb.path",
            str(tmp_path / "data"),
            "--web.listen-address",
            "%s:%d" % (engine.ADDRESS, port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(tmp_path),
    )
    base = "http://%s:%d" % (engine.ADDRESS, port)
    try:

        def wait(expr, what, budget=90):
            deadline = time.monotonic() + budget
            while time.monotonic() < deadline:
                assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                try:
                    got = prom_query(base, expr)["data"]["result"]
                    if got:
                        return got
                except OSError:
                    pass
                time.sleep(0.5)
            raise AssertionError(
                "%s within %s s: no result for %s\n%s"
                % (what, budget, expr, (tmp_path / "prometheus.log").read_text()[-2000:])
            )

        wait('up{job="vllm", host="localhost"} == 1', "the real engine scraped")
        client = clients["real"]
        for _ in range(3):
            assert (
                client.post(
                    "/v1/completions", {"model": client.served, "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
                ).status
                == 200
            )
        firing = wait('ALERTS{alertname="KunlunTtftP99High", alertstate="firing"}', "KunlunTtftP99High firing")
        assert firing[0]["metric"]["host"] == "localhost" and firing[0]["metric"]["severity"] == "warning", firing
        # Every alert and dashboard query runs on the real engine's series; those over vllm's
        # series find them.
        for where, expr in monitoring.queries(executable=True):
            doc = prom_query(base, expr)
            assert doc["status"] == "success", (where, expr, doc)
        for name in contract.read_metric_names():
            assert prom_query(base, 'count(%s{job="vllm"})' % name)["data"]["result"], name
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
