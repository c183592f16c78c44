"""The Grafana dashboard the monitoring role ships (roles/monitoring/files/kunlun-fleet-dashboard.json)
and every query of the role: the dashboard's panels and the alert rules. Every metric a query
reads is one the fleet exports (kunlun_fleet.monitoring.known_metric_names: the exporters, the
simulated vllm's /metrics, vllm-router, node-exporter, Prometheus), and every query parses
(promtool check rules on them as recording rules; promtool 2.42 has no query parser of its own)."""

import json
import subprocess

import pytest
import yaml

from kunlun_fleet import monitoring
from promtool_helper import promtool


@pytest.fixture(scope="module")
def board():
    return json.loads(monitoring.DASHBOARD.read_text())


@pytest.fixture(scope="module")
def panels(board):
    return monitoring.dashboard_panels(board)


def exprs_of(panel):
    return [" ".join(t["expr"].split()) for t in panel.get("targets", [])]


def test_dashboard_is_a_grafana_dashboard(board):
    assert 36 <= board["schemaVersion"] <= 41
    assert board["uid"] == "kunlun-fleet" and board["title"]
    assert board.get("id") is None, "an exported dashboard carries no database id"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert variables["host"]["type"] == "query"


def test_panels_ids_grid_and_datasource(panels):
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids: %s" % ids
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert set(grid) >= {"x", "y", "w", "h"} and all(isinstance(grid[k], int) for k in "xywh"), panel["title"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        mine = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not (mine & cells), "%s overlaps another panel" % panel["title"]
        cells |= mine
        if panel.get("type") == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}" and target["expr"].strip(), panel["title"]


def _panel_with(panels, *needles):
    found = [p for p in panels if all(any(n in e for e in exprs_of(p)) for n in needles)]
    assert found, "no panel queries %s" % (needles,)
    return found[0]


def test_the_panels_the_issue_asks_for(panels):
    fleet = _panel_with(panels, "rate(vllm:generation_tokens_total")
    assert any(e.startswith("sum(rate(vllm:generation_tokens_total") for e in exprs_of(fleet)), "fleet output tok/s"
    per_host = [
        p for p in panels if any(e.startswith("sum by (host) (rate(vllm:generation_tokens_total") for e in exprs_of(p))
    ]
    assert per_host, "per-host output tok/s"
    ttft = _panel_with(panels, "vllm:time_to_first_token_seconds_bucket")
    assert [e.split(",")[0] for e in exprs_of(ttft)] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.9",
        "histogram_quantile(0.99",
    ]
    tpot = _panel_with(panels, "vllm:request_time_per_output_token_seconds_bucket")
    assert [e.split(",")[0] for e in exprs_of(tpot)] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    _panel_with(panels, "vllm:num_requests_running", "vllm:num_requests_waiting")
    kv = _panel_with(panels, "vllm:kv_cache_usage_perc")
    assert kv["fieldConfig"]["defaults"]["unit"] == "percentunit", "a 0..1 ratio"
    memory = _panel_with(panels, "kunlun_xpu_memory_used_bytes", "kunlun_xpu_memory_total_bytes")
    assert memory["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert _panel_with(panels, "kunlun_xpu_temperature_celsius")["fieldConfig"]["defaults"]["unit"] == "celsius"
    assert (
        _panel_with(panels, "kunlun_xpu_power_usage_watts", "kunlun_xpu_power_cap_watts")["fieldConfig"]["defaults"][
            "unit"
        ]
        == "watt"
    )


def test_every_query_reads_only_metrics_the_fleet_exports():
    known = monitoring.known_metric_names()
    every = set().union(*known.values())
    unknown = {}
    for where, expr in monitoring.queries():
        names = monitoring.metric_names(expr)
        assert names, "%s reads no metric: %s" % (where, expr)
        if names - every:
            unknown[where] = sorted(names - every)
    assert not unknown, "queries read metrics nothing exports: %s" % unknown


def test_known_metric_names_come_from_their_sources():
    known = monitoring.known_metric_names()
    # vLLM counters get _total from prometheus_client; histograms _bucket/_sum/_count.
    assert {
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
    } <= known["vllm"]
    assert "vllm:generation_tokens" not in known["vllm"]
    assert {
        "kunlun_xpu_up",
        "kunlun_xpu_devices",
        "kunlun_xpu_smi_up",
        "kunlun_xpu_exporter_last_run_timestamp_seconds",
        "kunlun_gateway_worker_healthy",
        "kunlun_gateway_router_up",
    } <= known["exporters"]


@pytest.mark.parametrize(
    "expr, names",
    [
        (
            'sum by (host) (rate(vllm:generation_tokens_total{job="vllm",host=~"$host"}[$__rate_interval]))',
            {"vllm:generation_tokens_total"},
        ),
        ('histogram_quantile(0.99, sum by (le, host) (rate(x_bucket{le!="+Inf"}[5m]))) > 10', {"x_bucket"}),
        ('(up{job="node"} == 1 and on (host) up{job="router"}) unless on (host) a_b', {"up", "a_b"}),
        ("time() - last_run_seconds > 300 or foo offset 5m", {"last_run_seconds", "foo"}),
        ('label_values(up{job="vllm"}, host)', {"up"}),
        ("count by (worker) (m == 1) >= scalar(count(n == 1))", {"m", "n"}),
    ],
)
def test_metric_names_of_an_expression(expr, names):
    assert monitoring.metric_names(expr) == names


def _as_recording_rules(found):
    rules = [{"record": "kunlun_fleet:query_%d" % i, "expr": expr} for i, (_, expr) in enumerate(found)]
    return {"groups": [{"name": "queries", "rules": rules}]}


def test_every_query_parses(tmp_path):
    found = monitoring.queries(executable=True)
    assert all("$" not in expr for _, expr in found), "Grafana variables left in an executable query"
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(_as_recording_rules(found)))
    proc = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, "%s\n%s" % (
        proc.stdout + proc.stderr,
        "\n".join("%d %s: %s" % (i, w, e) for i, (w, e) in enumerate(found)),
    )
    # The check can fail: a query with a syntax error is refused.
    path.write_text(yaml.safe_dump(_as_recording_rules([("broken", "sum(rate(x[5m])")])))
    proc = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0


def test_queries_lists_every_alert_and_panel_target(panels):
    found = monitoring.queries()
    alerts = [w for w, _ in found if w.startswith("alert ")]
    targets = [w for w, _ in found if w.startswith("panel ")]
    assert len(alerts) == len(monitoring.alert_rules())
    assert len(targets) == sum(len(p.get("targets", [])) for p in panels)
    assert any(w == "variable host" for w, _ in found)
