"""The monitoring role (roles/monitoring) read as data: its templates rendered with its
defaults, every alert and dashboard query, and the metric names those queries may use.

For the unit tests (tests/unit/test_monitoring_*.py) and for a test against a live
Prometheus: ``queries(executable=True)`` gives every alert and dashboard query with the
dashboard's Grafana variables filled in, ready for Prometheus's /api/v1/query.

The known metric names are kept here, in one place, each from its source:
- the accelerator and gateway exporters: their METRICS tables (roles/monitoring/files);
- vllm: what the simulated vllm (kunlun_fleet/sim/artifacts/vllm_src/vllm/engine/metrics.py,
  vLLM v1's names as vllm 0.15 exports them) renders, histogram and counter suffixes included;
- vllm-router 0.1.17 and node-exporter 1.5: the lists below (not generated here);
- Prometheus itself: ``up`` and the scrape series every target gets.
"""

import importlib.machinery
import importlib.util
import json
import re
from pathlib import Path

import yaml
from .bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parent.parent
ROLE = ROOT / "roles" / "monitoring"
RULES_TEMPLATE = ROLE / "templates" / "kunlun-fleet.rules.yml.j2"
CONFIG_TEMPLATE = ROLE / "templates" / "prometheus.yml.j2"
DASHBOARD = ROLE / "files" / "kunlun-fleet-dashboard.json"
XPU_EXPORTER = ROLE / "files" / "kunlun-xpu-exporter"
GATEWAY_EXPORTER = ROLE / "files" / "kunlun-gateway-exporter"
CERT_EXPORTER = ROLE / "files" / "kunlun-cert-exporter"
VLLM_METRICS_SRC = ROOT / "kunlun_fleet" / "sim" / "artifacts" / "vllm_src" / "vllm" / "engine" / "metrics.py"

# vllm-router 0.1.17 (its src/metrics.rs, the vLLM project's router): the series the
# dashboard or the rules may use. The gateway role relies on vllm_router_running_requests
# (drain) and its molecule scenario on vllm_router_processed_requests_total (counted only
# when the policy chose among two or more healthy workers: not a per-worker request total).
ROUTER_METRICS = frozenset(
    {
        "vllm_router_requests_total",
        "vllm_router_request_errors_total",
        "vllm_router_retries_total",
        "vllm_router_processed_requests_total",
        "vllm_router_running_requests",
        "vllm_router_active_workers",
        "vllm_router_worker_health",
        "vllm_router_cb_state",
        "vllm_router_request_duration_seconds_bucket",
        "vllm_router_request_duration_seconds_sum",
        "vllm_router_request_duration_seconds_count",
    }
)

# node-exporter 1.5 (Debian 12's prometheus-node-exporter): the series used here.
NODE_METRICS = frozenset(
    {
        "node_filesystem_avail_bytes",
        "node_filesystem_size_bytes",
        "node_filesystem_free_bytes",
        "node_cpu_seconds_total",
        "node_memory_MemAvailable_bytes",
        "node_memory_MemTotal_bytes",
        "node_load1",
        "node_textfile_mtime_seconds",
        "node_textfile_scrape_error",
    }
)

# Prometheus's own series for every target.
PROMETHEUS_METRICS = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_series_added",
    }
)

# PromQL words that look like names: functions, aggregations, keywords.
_PROMQL_WORDS = frozenset(
    """
    abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
    day_of_year days_in_month delta deriv exp floor histogram_count histogram_sum
    histogram_fraction histogram_quantile holt_winters hour idelta increase irate label_join
    label_replace ln log2 log10 minute month predict_linear rate resets round scalar sgn sort
    sort_desc sqrt time timestamp vector year avg_over_time min_over_time max_over_time
    sum_over_time count_over_time quantile_over_time stddev_over_time stdvar_over_time
    last_over_time present_over_time acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh
    deg rad pi
    sum min max avg group stddev stdvar count count_values bottomk topk quantile
    by without on ignoring group_left group_right bool and or unless offset
    inf nan Inf NaN
""".split()
)


def _load_script(path):
    """An exporter script (no .py suffix) as a module; it finds its imports next to itself."""
    loader = importlib.machinery.SourceFileLoader("kf_" + path.name.replace("-", "_"), str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    import sys

    added = []
    for extra in (str(path.parent), str(ROOT / "module_utils")):
        if extra not in sys.path:
            sys.path.insert(0, extra)
            added.append(extra)
    # No __pycache__ in the role's files/ (what the role copies to hosts).
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
        for extra in added:
            sys.path.remove(extra)
    return module


def xpu_exporter():
    return _load_script(XPU_EXPORTER)


def gateway_exporter():
    return _load_script(GATEWAY_EXPORTER)


def cert_exporter():
    return _load_script(CERT_EXPORTER)


def exporter_metric_names():
    exporters = (xpu_exporter(), gateway_exporter(), cert_exporter())
    return frozenset(name for mod in exporters for name, _, _ in mod.METRICS)


def vllm_metric_names():
    """Every series name the simulated vllm's /metrics renders (buckets, _sum, _count,
    _total and _created included)."""
    import sys

    spec = importlib.util.spec_from_file_location("kf_vllm_metrics", str(VLLM_METRICS_SRC))
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ in the stand-in's sources (the sim fleet builds packages from them).
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    text = module.Metrics("model").render()
    return frozenset(re.findall(r"(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text))


def known_metric_names():
    """{source: names}: every metric name a query of the role may use."""
    return {
        "exporters": exporter_metric_names(),
        "vllm": vllm_metric_names(),
        "router": ROUTER_METRICS,
        "node": NODE_METRICS,
        "prometheus": PROMETHEUS_METRICS,
    }


def metric_names(expr):
    """The metric names a PromQL expression (or a Grafana query) reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "1m", text)  # Grafana variables
    text = re.sub(r"\{[^{}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)", text):
        word = match.group(1)
        following = text[match.end() :].lstrip()
        if word in _PROMQL_WORDS or following.startswith("("):
            continue
        if re.match(r"^\d", word):
            continue
        names.add(word)
    # label_values(metric, label) in Grafana variable queries: the label is not a metric.
    for match in re.finditer(r"label_values\(\s*([a-zA-Z_:][\w:]*)?[^,)]*,\s*(\w+)\s*\)", expr):
        names.discard(match.group(2))
    return names


# ----------------------------------------------------------------- rendering


def _trust(value):
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trust(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trust(v) for v in value]
    return value


def role_variables(extra=None, os_vars="Debian"):
    """The variables a play of the role sees by default: kunlun_stack's and the role's
    defaults, Ansible's ansible_managed, ``extra`` (an inventory's variables), then
    kunlun_stack's role variables (the effective configuration, which outranks an inventory)
    and the role's vars/<os_vars>.yml (the distribution's package names and paths, which the
    role's first task loads; Debian, the tested platform, unless told)."""
    variables = {"ansible_managed": "Ansible managed", "playbook_dir": str(ROOT)}
    variables.update(stack_pins())
    variables.update(yaml.safe_load((ROLE / "defaults/main.yml").read_text()))
    variables.update(extra or {})
    variables.update(yaml.safe_load((ROOT / "roles/kunlun_stack/vars/main.yml").read_text()))
    variables.update(yaml.safe_load((ROLE / "vars" / ("%s.yml" % os_vars)).read_text()))
    return variables


def render(template, variables, rules_delimiters=False):
    """A role template rendered as the template module renders it (Ansible's filters,
    nested variables templated, trim_blocks); the rules template with its [[ ]] delimiters."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=_trust(variables))
    overrides = {"trim_blocks": True}
    if rules_delimiters:
        overrides.update(variable_start_string="[[", variable_end_string="]]")
    return templar.template(trust_as_template(Path(template).read_text()), overrides=overrides)


def default_inventory(hosts=("kf-node-1", "kf-node-2", "kf-node-3"), gateways=None, monitoring=None, addresses=None):
    """Variables of a small inventory for rendering prometheus.yml: the hosts serve,
    the first is the gateway and the monitoring host unless given."""
    hosts = list(hosts)
    gateways = list(gateways if gateways is not None else hosts[:1])
    monitoring = list(monitoring if monitoring is not None else hosts[:1])
    everyone = list(dict.fromkeys(hosts + gateways + monitoring))
    addresses = dict(addresses or {})
    hostvars = {h: ({"ansible_host": addresses[h]} if h in addresses else {}) for h in everyone}
    return {
        "groups": {
            "all": everyone,
            "xpu_servers": hosts,
            "gateways": gateways,
            "monitoring": monitoring,
            "ungrouped": [],
        },
        "hostvars": hostvars,
        "inventory_hostname": monitoring[0],
    }


def render_rules(extra=None):
    return render(RULES_TEMPLATE, role_variables(extra), rules_delimiters=True)


def render_config(extra=None):
    return render(CONFIG_TEMPLATE, role_variables(dict(default_inventory(), **(extra or {}))))


def alert_rules(text=None):
    """Every alerting rule of the rendered rules file (defaults unless ``text``)."""
    data = yaml.safe_load(text if text is not None else render_rules())
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard():
    return json.loads(DASHBOARD.read_text())


def dashboard_panels(board=None):
    """Every panel, rows' nested panels included."""
    board = board or dashboard()
    panels = []
    for panel in board.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


# Grafana's variables, as a live Prometheus gets them: every host, a usual rate window.
GRAFANA_SUBSTITUTES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "host": ".*",
    "device": ".*",
}


def grafana_to_promql(expr):
    """A dashboard query with its Grafana variables replaced by values Prometheus accepts."""

    def value(match):
        name = match.group(1) or match.group(2)
        return GRAFANA_SUBSTITUTES.get(name.split(":")[0], ".*")

    return re.sub(r"\$\{([^}]+)\}|\$(\w+)", value, expr)


def queries(executable=False):
    """[(where, expr)]: every alert expression and every dashboard query (panel targets
    and variable queries). ``executable``: Grafana's variables filled in, and Grafana's
    label_values() variable queries left out (they are not PromQL)."""
    found = [("alert %s" % rule["alert"], rule["expr"].strip()) for rule in alert_rules()]
    board = dashboard()
    for panel in dashboard_panels(board):
        for target in panel.get("targets", []):
            if target.get("expr"):
                found.append(("panel %s (%s)" % (panel.get("title"), target.get("refId")), target["expr"]))
    for var in board.get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if var.get("type") == "query" and query:
            found.append(("variable %s" % var["name"], query))
    if executable:
        found = [(where, grafana_to_promql(expr)) for where, expr in found if not expr.startswith("label_values(")]
    return found
