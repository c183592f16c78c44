"""The monitoring role's alert rules (roles/monitoring/templates/kunlun-fleet.rules.yml.j2),
rendered with the role's defaults as the template task renders them, checked by
`promtool check rules` and exercised by `promtool test rules` with
tests/unit/fixtures/monitoring/kunlun-fleet.rules.test.yml: each alert fires once its
`for` has passed, not one evaluation before, and healthy series stay silent."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import monitoring
from promtool_helper import promtool

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "monitoring" / "kunlun-fleet.rules.test.yml"

ALERTS = {
    # the fleet's alerts
    "KunlunServingHostDown",
    "KunlunHostOutOfGateway",
    "KunlunXpuDeviceError",
    "KunlunXpuDeviceMissing",
    "KunlunXpuExporterDown",
    "KunlunKvCacheNearlyFull",
    "KunlunRequestsWaitingGrowing",
    "KunlunTtftP99High",
    "KunlunThroughputLow",
    "KunlunDataVolumeNearlyFull",
    "KunlunDataVolumeNotMounted",
    "KunlunCertificateExpiresSoon",
    "KunlunCertificateUnreadable",
    # the engine watchdog's verdicts (kunlun-watchdog on the gateway hosts)
    "KunlunWorkerQuarantined",
    "KunlunWorkerQuarantineHeld",
    # what those rely on answering
    "KunlunGatewayDown",
    "KunlunNodeExporterDown",
    "KunlunWatchdogNotRunning",
}


def run_promtool(*args, cwd=None):
    proc = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def rendered():
    return monitoring.render_rules()


@pytest.fixture(scope="module")
def rules(rendered):
    return monitoring.alert_rules(rendered)


def test_promtool_checks_the_rendered_rules(rendered, tmp_path):
    path = tmp_path / "kunlun-fleet.yml"
    path.write_text(rendered)
    rc, out = run_promtool("check", "rules", str(path))
    assert rc == 0, out
    assert "SUCCESS: %d rules found" % len(ALERTS) in out


def test_promtool_refuses_a_broken_rule(rendered, tmp_path):
    """The check above can fail: a broken expression is refused."""
    path = tmp_path / "kunlun-fleet.yml"
    path.write_text(rendered.replace('expr: up{job="vllm"} == 0', 'expr: up{job="vllm" == 0', 1))
    rc, out = run_promtool("check", "rules", str(path))
    assert rc != 0, out


def test_the_alerts(rules):
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert set(rule["annotations"]) >= {"summary", "description"}, name
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        # What, which host, what to check.
        assert "$labels.host" in summary, name
        assert len(description) > 200 and re.search(r"[Cc]heck", description), name
        assert "[[" not in summary + description + rule["expr"], "%s: a role variable left unrendered" % name


def test_the_expressions_say_what_the_issue_asks(rules):
    expr = {rule["alert"]: " ".join(rule["expr"].split()) for rule in rules}
    durations = {rule["alert"]: rule.get("for") for rule in rules}
    assert expr["KunlunServingHostDown"] == 'up{job="vllm"} == 0' and durations["KunlunServingHostDown"] == "1m"
    assert expr["KunlunXpuDeviceError"] == "kunlun_xpu_up == 0"
    assert expr["KunlunXpuDeviceMissing"] == "kunlun_xpu_devices < 8"
    assert "kunlun_xpu_smi_up == 0" in expr["KunlunXpuExporterDown"]
    assert "> 300" in expr["KunlunXpuExporterDown"]
    assert expr["KunlunKvCacheNearlyFull"].endswith('vllm:kv_cache_usage_perc{job="vllm"}) > 0.95')
    assert durations["KunlunKvCacheNearlyFull"] == "10m"
    assert "deriv(vllm:num_requests_waiting" in expr["KunlunRequestsWaitingGrowing"]
    assert durations["KunlunRequestsWaitingGrowing"] == "5m"
    assert expr["KunlunTtftP99High"] == (
        "histogram_quantile(0.99, sum by (le, host) "
        '(rate(vllm:time_to_first_token_seconds_bucket{job="vllm"}[5m]))) > 10'
    )
    assert 'rate(vllm:generation_tokens_total{job="vllm"}[5m])) < 30' in expr["KunlunThroughputLow"]
    assert "vllm:num_requests_running" in expr["KunlunThroughputLow"]
    assert 'mountpoint="/home"' in expr["KunlunDataVolumeNearlyFull"] and "< 0.1" in expr["KunlunDataVolumeNearlyFull"]
    assert durations["KunlunDataVolumeNearlyFull"] == "10m"
    # A serving host up whose data volume is not mounted (a data disk failed at boot: nofail).
    assert expr["KunlunDataVolumeNotMounted"] == (
        'up{job="node", xpu_server="true"} == 1 unless on (host) '
        'node_filesystem_size_bytes{job="node", mountpoint="/home"}'
    )
    assert durations["KunlunDataVolumeNotMounted"] == "5m"
    # 14 days ahead (the issue's margin), for an hour.
    assert expr["KunlunCertificateExpiresSoon"] == "kunlun_cert_not_after_timestamp_seconds - time() < 14 * 86400"
    assert durations["KunlunCertificateExpiresSoon"] == "1h"
    assert expr["KunlunCertificateUnreadable"] == "kunlun_cert_read_ok == 0"
    # The watchdog's verdicts fire at once (it reached them over rounds of its own); a
    # watchdog whose last round is older than 5 minutes, or whose state is unreadable, after 2m.
    assert expr["KunlunWorkerQuarantined"] == "kunlun_watchdog_worker_quarantined == 1"
    assert expr["KunlunWorkerQuarantineHeld"] == "kunlun_watchdog_worker_hold == 1"
    assert durations["KunlunWorkerQuarantined"] is None and durations["KunlunWorkerQuarantineHeld"] is None
    assert expr["KunlunWatchdogNotRunning"] == (
        "(time() - kunlun_watchdog_last_round_timestamp_seconds) > 300 or kunlun_watchdog_state_readable == 0"
    )
    assert durations["KunlunWatchdogNotRunning"] == "2m"
    # A quarantined worker is out on purpose: not KunlunHostOutOfGateway's (whose fix, adding
    # it back by hand, would route to the stuck engine).
    assert (
        "unless on (worker) (max by (worker) (kunlun_watchdog_worker_quarantined) == 1)"
        in (expr["KunlunHostOutOfGateway"])
    )


def test_the_watchdog_alerts_say_what_to_do(rules):
    by_name = {rule["alert"]: rule for rule in rules}
    for name in ("KunlunWorkerQuarantined", "KunlunWorkerQuarantineHeld"):
        text = by_name[name]["annotations"]["description"]
        for words in (
            "kunlun-fleet status",
            "kunlun-fleet support-bundle -i INV --limit {{ $labels.worker_host }}",
            "playbooks/serve.yml --limit {{ $labels.worker_host }}",
            "kunlun-fleet watchdog -i INV release {{ $labels.worker_host }}",
            "/var/lib/kunlun-watchdog/release/{{ $labels.worker_host }} on every gateway",
        ):
            assert words in text, (name, words)
    assert "{{ $labels.kind }}" in by_name["KunlunWorkerQuarantined"]["annotations"]["summary"]


def test_thresholds_are_the_role_variables():
    rules = {
        r["alert"]: r
        for r in monitoring.alert_rules(
            monitoring.render_rules(
                {
                    "monitoring_alert_kv_cache_ratio": 0.8,
                    "monitoring_alert_kv_cache_for": "3m",
                    "kunlun_stack_device_count": 4,
                    "kunlun_stack_targets": {"single_stream_tok_s": 55, "fleet_output_tok_s": 1},
                    "monitoring_alert_ttft_p99_seconds": 4,
                    "monitoring_alert_data_mountpoint": "/data",
                    "monitoring_alert_waiting_requests": 7,
                    "monitoring_alert_exporter_stale_seconds": 120,
                    "monitoring_alert_watchdog_stale_seconds": 90,
                    "monitoring_alert_watchdog_down_for": "30s",
                    "gateway_watchdog_state_dir": "/srv/watchdog",
                }
            )
        )
    }
    assert rules["KunlunKvCacheNearlyFull"]["expr"].strip().endswith("> 0.8")
    assert rules["KunlunKvCacheNearlyFull"]["for"] == "3m"
    # Defaults that follow the validated combination's data (kunlun_stack).
    assert rules["KunlunXpuDeviceMissing"]["expr"].strip() == "kunlun_xpu_devices < 4"
    assert "< 55" in rules["KunlunThroughputLow"]["expr"]
    assert rules["KunlunTtftP99High"]["expr"].strip().endswith("> 4")
    assert 'mountpoint="/data"' in rules["KunlunDataVolumeNearlyFull"]["expr"]
    assert 'mountpoint="/data"' in rules["KunlunDataVolumeNotMounted"]["expr"]
    assert "systemctl status /data" in rules["KunlunDataVolumeNotMounted"]["annotations"]["description"]
    assert "> 7)" in rules["KunlunRequestsWaitingGrowing"]["expr"]
    assert "> 120" in rules["KunlunXpuExporterDown"]["expr"] and "> 120" in rules["KunlunGatewayDown"]["expr"]
    assert "> 90" in rules["KunlunWatchdogNotRunning"]["expr"] and rules["KunlunWatchdogNotRunning"]["for"] == "30s"
    # The state and release files where the gateway role's watchdog keeps them.
    assert "/srv/watchdog/release/" in rules["KunlunWorkerQuarantined"]["annotations"]["description"]
    assert "(/srv/watchdog/state.json)" in rules["KunlunWatchdogNotRunning"]["annotations"]["description"]


def _unit_test_dir(tmp_path, rendered, only=None):
    """The rendered rules without annotations (promtool compares them exactly; they do not
    decide when an alert fires) beside a copy of the test file, or of its cases that test
    the alert ``only`` (promtool 2.42 has no --run; the whole file is about 9 CPU-s)."""
    data = yaml.safe_load(rendered)
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "kunlun-fleet.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    if only is None:
        shutil.copy(FIXTURE, tmp_path / FIXTURE.name)
    else:
        tests = yaml.safe_load(FIXTURE.read_text())
        tests["tests"] = [
            case for case in tests["tests"] if any(ev["alertname"] == only for ev in case["alert_rule_test"])
        ]
        assert tests["tests"], only
        (tmp_path / FIXTURE.name).write_text(yaml.safe_dump(tests, sort_keys=False))
    return tmp_path


def test_promtool_unit_tests_of_every_alert(rendered, tmp_path):
    rc, out = run_promtool("test", "rules", FIXTURE.name, cwd=_unit_test_dir(tmp_path, rendered))
    assert rc == 0, out
    assert "SUCCESS" in out


def test_promtool_unit_tests_catch_a_changed_for(rendered, tmp_path):
    """The unit tests can fail: an alert that waits longer than its `for` is caught (by
    the test file's cases of that alert, the first rule's; the whole file passes above)."""
    changed = rendered.replace("for: [[", "").replace("        for: 1m\n", "        for: 2m\n", 1)
    assert changed != rendered
    first = yaml.safe_load(rendered)["groups"][0]["rules"][0]
    assert first["alert"] == "KunlunServingHostDown" and first["for"] == "1m", first
    cwd = _unit_test_dir(tmp_path, changed, only="KunlunServingHostDown")
    rc, out = run_promtool("test", "rules", FIXTURE.name, cwd=cwd)
    assert rc != 0 and "KunlunServingHostDown" in out, out


def _duration(text):
    """A Prometheus duration such as 30m or 145h1m, in seconds."""
    parts = re.findall(r"(\d+)([smhd])", text)
    assert parts and "".join(v + u for v, u in parts) == text, text
    return sum(int(value) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit] for value, unit in parts)


def test_every_alert_is_tested_firing_and_one_evaluation_before(rules):
    """Every alert has a case where it fires, and every alert (label set) that fires is
    also expected silent one evaluation earlier: it fires once its `for` has passed, not
    before. Every alert is expected silent on the healthy fleet."""
    tests = yaml.safe_load(FIXTURE.read_text())
    assert tests["rule_files"] == ["kunlun-fleet.yml"]
    step = _duration(tests["evaluation_interval"])
    silent, firing = set(), set()
    for case in tests["tests"]:
        expected = {}  # (alert, time) -> set of label sets
        for ev in case["alert_rule_test"]:
            expected[(ev["alertname"], _duration(ev["eval_time"]))] = {
                tuple(sorted(a["exp_labels"].items())) for a in ev["exp_alerts"]
            }
            if case["name"] == "healthy fleet":
                assert not ev["exp_alerts"], "the healthy fleet fires %s" % ev["alertname"]
                silent.add(ev["alertname"])
        first = {}
        for (alert, when), label_sets in sorted(expected.items(), key=lambda kv: kv[0][1]):
            for labels in label_sets:
                first.setdefault((alert, labels), when)
        for (alert, labels), when in first.items():
            firing.add(alert)
            assert (alert, when - step) in expected and labels not in expected[(alert, when - step)], (
                "%s %s fires at %ds in %r: expect it silent at the evaluation before too"
                % (alert, dict(labels), when, case["name"])
            )
    assert firing == ALERTS, "alerts never tested firing: %s" % sorted(ALERTS - firing)
    assert silent == ALERTS, "alerts not tested silent on a healthy fleet: %s" % sorted(ALERTS - silent)
