"""roles/monitoring read as data and rendered, without touching a host: its variables and
argument specs, prometheus.yml rendered for an inventory (Ansible's own templating, as the
template task renders it) and checked by `promtool check config`, the /etc/default files,
the exporters' systemd units (`systemd-analyze verify`), and the tasks' checks, handlers and
entry points."""

import re
import shutil
import subprocess

from pathlib import Path

import pytest
import yaml

from kunlun_fleet import monitoring
from promtool_helper import promtool

ROOT = monitoring.ROOT
ROLE = monitoring.ROLE


def load(*parts):
    return yaml.safe_load((ROLE.joinpath(*parts)).read_text())


DEFAULTS = load("defaults", "main.yml")
SPECS = load("meta", "argument_specs.yml")["argument_specs"]

# Three serving hosts (one reached by name, its serving address given apart), a gateway
# and a monitoring host of their own.
INVENTORY = {
    "groups": {
        "all": ["p800-a01", "p800-a02", "p800-a03", "gw-01", "mon-01"],
        "xpu_servers": ["p800-a01", "p800-a02", "p800-a03"],
        "image_builders": ["p800-a01"],
        "gateways": ["gw-01"],
        "monitoring": ["mon-01"],
        "ungrouped": [],
    },
    "hostvars": {
        "p800-a01": {"ansible_host": "10.20.1.11"},
        "p800-a02": {"ansible_host": "10.20.1.12"},
        "p800-a03": {"ansible_host": "bmc-a03.example", "kunlun_stack_serving_address": "10.20.1.13"},
        "gw-01": {"ansible_host": "10.20.0.5"},
        "mon-01": {"ansible_host": "10.20.0.6"},
    },
    "inventory_hostname": "mon-01",
}


def render_config(**extra):
    return monitoring.render(monitoring.CONFIG_TEMPLATE, monitoring.role_variables(dict(INVENTORY, **extra)))


def check_config(tmp_path, text):
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    proc = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def jobs(text):
    config = yaml.safe_load(text)
    out = {}
    for job in config["scrape_configs"]:
        out[job["job_name"]] = [(t, sc.get("labels", {})) for sc in job["static_configs"] for t in sc["targets"]]
    return config, out


# ------------------------------------------------------------------ variables


def test_every_variable_is_documented_in_an_entry_point_and_prefixed():
    options = set()
    for entry in ("main", "exporters"):
        assert (ROLE / "tasks" / ("%s.yml" % entry)).is_file(), entry
        options |= set(SPECS[entry]["options"])
    assert set(SPECS) == {"main", "exporters"}
    assert set(DEFAULTS) == options, "defaults and argument_specs differ: %s" % sorted(set(DEFAULTS) ^ options)
    assert all(name.startswith("monitoring_") for name in DEFAULTS)
    text = (ROLE / "defaults" / "main.yml").read_text()
    for name in DEFAULTS:
        # Every variable has its comment (the line before it, or the block it closes).
        before = text[: text.index("\n%s:" % name)].rstrip().splitlines()[-1]
        assert before.startswith("#") or before.split(":")[0].startswith("monitoring_"), name


def test_every_monitoring_variable_used_is_defined():
    defined = set(DEFAULTS)
    texts = [p.read_text() for p in sorted(ROLE.glob("tasks/*.yml")) + sorted(ROLE.glob("handlers/*.yml"))]
    for text in texts:
        defined |= set(re.findall(r"(?m)^\s*register:\s*(monitoring_\w+)", text))
        defined |= set(re.findall(r"(?m)^\s*loop_var:\s*(monitoring_\w+)", text))
        defined |= set(re.findall(r"(?m)^\s{4,}(monitoring_\w+):", text))  # set_fact and vars keys
    texts += [p.read_text() for p in sorted(ROLE.glob("templates/*.j2"))]
    used = set()
    for text in texts:
        # (monitoring_alert_* in a comment names a family, not a variable)
        used |= set(re.findall(r"\b(monitoring_\w*[a-z0-9])\b(?!\*)", text))
    # Template-local names ({% set %}, macros) are defined where they are used.
    for path in ROLE.glob("templates/*.j2"):
        defined |= set(re.findall(r"\{%-?\s*(?:set|macro)\s+(monitoring_\w+)", path.read_text()))
    assert used - defined == set(), "used but never defined: %s" % sorted(used - defined)


def test_defaults_follow_the_other_roles():
    variables = monitoring.role_variables(INVENTORY)
    rendered = monitoring.render(ROLE / "templates" / "prometheus.yml.j2", variables)
    assert ':8000"' in rendered, "vllm's port is kunlun_stack_serving_effective.port"
    # the router's metrics through the endpoint's public port (the proxy's /metrics)
    assert ':8080"' in rendered and ":29000" not in rendered, "the router's metrics are gateway_port's /metrics"
    # The distribution's paths come from vars/<OS>.yml (tests/unit/test_os_vars.py).
    assert DEFAULTS["monitoring_textfile_dir"] == "{{ __monitoring_textfile_dir | default(omit) }}"
    assert load("vars", "Debian.yml")["__monitoring_textfile_dir"] == "/var/lib/prometheus/node-exporter"
    assert DEFAULTS["monitoring_xpu_interval"] == 15 and DEFAULTS["monitoring_port"] == 9090
    assert DEFAULTS["monitoring_retention"] == "15d" and DEFAULTS["monitoring_scrape_interval"] == "15s"


# ------------------------------------------------------------------ prometheus.yml


def test_config_scrapes_every_host_at_its_serving_address(tmp_path):
    text = render_config()
    rc, out = check_config(tmp_path, text)
    assert rc == 0, out + text
    config, found = jobs(text)
    assert config["global"]["scrape_interval"] == "15s"
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert found["vllm"] == [
        ("10.20.1.11:8000", {"host": "p800-a01", "worker": "https://10.20.1.11:8000"}),
        ("10.20.1.12:8000", {"host": "p800-a02", "worker": "https://10.20.1.12:8000"}),
        ("10.20.1.13:8000", {"host": "p800-a03", "worker": "https://10.20.1.13:8000"}),
    ]
    # The workers serve TLS with the fleet CA's certificates: verified with its copy on the host.
    vllm = [j for j in config["scrape_configs"] if j["job_name"] == "vllm"][0]
    assert vllm["scheme"] == "https" and vllm["tls_config"] == {"ca_file": "/etc/kunlun-fleet/ca.crt"}, vllm
    assert found["router"] == [("10.20.0.5:8080", {"host": "gw-01"})]
    assert [j for j in config["scrape_configs"] if j["job_name"] == "router"][0]["scheme"] == "http"
    assert found["node"] == [
        ("10.20.1.11:9100", {"host": "p800-a01", "xpu_server": "true"}),
        ("10.20.1.12:9100", {"host": "p800-a02", "xpu_server": "true"}),
        ("10.20.1.13:9100", {"host": "p800-a03", "xpu_server": "true"}),
        ("10.20.0.5:9100", {"host": "gw-01", "xpu_server": "false"}),
        ("10.20.0.6:9100", {"host": "mon-01", "xpu_server": "false"}),
    ]
    assert found["prometheus"] == [("127.0.0.1:9090", {"host": "mon-01"})]
    assert "alerting" not in config


def test_config_scrapes_plain_http_workers_without_tls(tmp_path):
    """kunlun_stack_serving_tls false: the workers serve plain HTTP, scraped as such."""
    text = render_config(kunlun_stack_serving_tls=False)
    rc, out = check_config(tmp_path, text)
    assert rc == 0, out + text
    config, found = jobs(text)
    vllm = [j for j in config["scrape_configs"] if j["job_name"] == "vllm"][0]
    assert vllm["scheme"] == "http" and "tls_config" not in vllm, vllm
    assert found["vllm"][0] == ("10.20.1.11:8000", {"host": "p800-a01", "worker": "http://10.20.1.11:8000"})


def test_config_worker_label_is_the_gateways_worker_url():
    """KunlunHostOutOfGateway matches the vllm targets' worker label with the URLs the
    routers list: both are kunlun_stack_worker_urls."""
    variables = monitoring.role_variables(INVENTORY)
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=monitoring._trust(variables))
    worker_urls = templar.template(trust_as_template("{{ kunlun_stack_worker_urls }}"))
    _, found = jobs(render_config())
    assert {labels["host"]: labels["worker"] for _, labels in found["vllm"]} == {
        h: worker_urls[h] for h in INVENTORY["groups"]["xpu_servers"]
    }


def test_config_follows_ports_alertmanagers_and_a_gateway_that_serves(tmp_path):
    inventory = dict(
        INVENTORY,
        groups=dict(INVENTORY["groups"], gateways=["p800-a01"], monitoring=["p800-a01"]),
        inventory_hostname="p800-a01",
    )
    text = monitoring.render(
        monitoring.CONFIG_TEMPLATE,
        monitoring.role_variables(
            dict(
                inventory,
                kunlun_stack_serving_overrides={"port": 9000},
                gateway_port=8443,
                gateway_tls_cert="-----BEGIN CERTIFICATE-----",
                monitoring_alertmanagers=["10.20.0.7:9093"],
                monitoring_listen_host="::1",
                monitoring_scrape_interval="30s",
            )
        ),
    )
    rc, out = check_config(tmp_path, text)
    assert rc == 0, out + text
    config, found = jobs(text)
    assert [t for t, _ in found["vllm"]] == ["10.20.1.11:9000", "10.20.1.12:9000", "10.20.1.13:9000"]
    assert found["router"] == [("10.20.1.11:8443", {"host": "p800-a01"})]
    # the endpoint has a certificate: its /metrics over https
    assert [j for j in config["scrape_configs"] if j["job_name"] == "router"][0]["scheme"] == "https"
    assert [t for t, _ in found["node"]] == ["10.20.1.11:9100", "10.20.1.12:9100", "10.20.1.13:9100"]
    assert found["prometheus"] == [("[::1]:9090", {"host": "p800-a01"})]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.20.0.7:9093"]


def test_promtool_check_config_can_fail(tmp_path):
    """The check can fail: a scrape timeout above the interval is refused."""
    rc, out = check_config(tmp_path, render_config(monitoring_scrape_timeout="30s"))
    assert rc != 0 and "scrape timeout" in out.lower(), out


def test_config_without_gateways_is_valid(tmp_path):
    text = render_config(groups=dict(INVENTORY["groups"], gateways=[]))
    rc, out = check_config(tmp_path, text)
    assert rc == 0, out + text
    assert jobs(text)[1]["router"] == []


# ------------------------------------------------------------------ /etc/default, units


def render_role_template(name, **extra):
    return monitoring.render(ROLE / "templates" / name, monitoring.role_variables(dict(INVENTORY, **extra)))


def args_of(text):
    (line,) = [line for line in text.splitlines() if line.startswith("ARGS=")]
    assert line.startswith('ARGS="') and line.endswith('"')
    return line[6:-1].split()


def test_prometheus_arguments():
    assert args_of(render_role_template("prometheus.default.j2")) == [
        "--config.file=/etc/prometheus/prometheus.yml",
        "--web.listen-address=127.0.0.1:9090",
        "--storage.tsdb.retention.time=15d",
    ]
    assert args_of(
        render_role_template(
            "prometheus.default.j2",
            monitoring_listen_host="::1",
            monitoring_port=9091,
            monitoring_retention="30d",
            monitoring_extra_args=["--storage.tsdb.retention.size=200GB"],
        )
    ) == [
        "--config.file=/etc/prometheus/prometheus.yml",
        "--web.listen-address=[::1]:9091",
        "--storage.tsdb.retention.time=30d",
        "--storage.tsdb.retention.size=200GB",
    ]


def test_node_exporter_arguments_name_the_textfile_directory_and_the_fleet_address():
    # The host's fleet address (kunlun_stack_serving_addresses: mon-01's ansible_host), the one
    # Prometheus scrapes, never every address.
    assert args_of(render_role_template("node-exporter.default.j2")) == [
        "--collector.textfile.directory=/var/lib/prometheus/node-exporter",
        "--web.listen-address=10.20.0.6:9100",
    ]
    # A serving host reached by name listens on its serving address.
    assert "--web.listen-address=10.20.1.13:9100" in args_of(
        render_role_template("node-exporter.default.j2", inventory_hostname="p800-a03")
    )


def test_node_exporter_address_set_in_the_inventory_is_the_one_scraped(tmp_path):
    inventory = dict(INVENTORY)
    inventory["hostvars"] = dict(
        INVENTORY["hostvars"],
        **{"gw-01": {"ansible_host": "10.20.0.5", "monitoring_node_exporter_listen_host": "fd00::5"}},
    )
    text = monitoring.render(monitoring.CONFIG_TEMPLATE, monitoring.role_variables(inventory))
    rc, out = check_config(tmp_path, text)
    assert rc == 0, out + text
    assert [t for t, labels in jobs(text)[1]["node"] if labels["host"] == "gw-01"] == ["[fd00::5]:9100"]


def _assert_task(entry, name):
    (task,) = [t for t in tasks(entry) if t["name"] == name]
    return task["ansible.builtin.assert"]["that"]


def _holds(that, **variables):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(
        loader=DataLoader(), variables=monitoring._trust(monitoring.role_variables(dict(INVENTORY, **variables)))
    )
    return templar.template(trust_as_template("{{ %s }}" % that))


@pytest.mark.parametrize(
    "address, allowed",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("127.0.1.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.20.0.6", False),
        ("127.0.0.1.example", False),
    ],
)
def test_prometheus_listens_on_loopback_only(address, allowed):
    """Prometheus's UI and API have no authentication: the role refuses any address but
    loopback, before any change (the way in is an SSH tunnel, docs/monitoring.md)."""
    that = _assert_task("main.yml", "Monitoring | Prometheus listens on loopback only")
    assert _holds(that, monitoring_listen_host=address) is allowed
    names = [t["name"] for t in tasks("main.yml")]
    assert names.index("Monitoring | Prometheus listens on loopback only") < names.index(
        "Monitoring | Prometheus (the distribution's package)"
    )


@pytest.mark.parametrize(
    "address, allowed",
    [(None, True), ("10.20.9.9", True), ("fd00::5", True), ("", False), ("0.0.0.0", False), ("::", False)],
)
def test_node_exporter_never_listens_on_every_address(address, allowed):
    that = _assert_task("exporters.yml", "Exporters | node-exporter listens on one address")
    extra = {} if address is None else {"monitoring_node_exporter_listen_host": address}
    assert _holds(that, **extra) is allowed


def units(unit):
    variables = monitoring.role_variables(dict(INVENTORY, monitoring_unit=unit))
    return (
        monitoring.render(ROLE / "templates" / "exporter.service.j2", variables),
        monitoring.render(ROLE / "templates" / "exporter.timer.j2", variables),
    )


UNIT = {
    "name": "kunlun-xpu-exporter",
    "description": "kunlun-fleet accelerator metrics",
    "output": "kunlun_xpu.prom",
    "interval": 15,
    "timeout": 35,
    "args": [
        "--xpu-smi",
        "/usr/local/bin/xpu-smi",
        "--output-dir",
        "/var/lib/prometheus/node-exporter",
        "--timeout",
        "10",
    ],
}


def test_exporter_units(tmp_path):
    service, timer = units(UNIT)
    assert "Type=oneshot" in service
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/kunlun-fleet/monitoring/kunlun-xpu-exporter "
        "--xpu-smi /usr/local/bin/xpu-smi "
        "--output-dir /var/lib/prometheus/node-exporter --timeout 10\n"
    ) in service
    assert "OnUnitActiveSec=15s" in timer and "OnActiveSec=1s" in timer and "WantedBy=timers.target" in timer
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.fail("systemd-analyze is missing: install Debian's systemd package")
    (tmp_path / "kunlun-xpu-exporter.service").write_text(service)
    (tmp_path / "kunlun-xpu-exporter.timer").write_text(timer)
    proc = subprocess.run(
        [analyze, "verify", "kunlun-xpu-exporter.timer", "kunlun-xpu-exporter.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if "kunlun-xpu-exporter" in line]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr
    # The check can fail: a misspelt key is reported.
    (tmp_path / "kunlun-xpu-exporter.timer").write_text(timer.replace("OnUnitActiveSec", "OnUnitActivSec"))
    proc = subprocess.run(
        [analyze, "verify", "kunlun-xpu-exporter.timer"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert "OnUnitActivSec" in proc.stdout + proc.stderr


# ------------------------------------------------------------------ tasks, handlers, playbook


def tasks(name):
    def walk(items):
        for item in items or []:
            for key in ("block", "rescue", "always"):
                yield from walk(item.get(key))
            yield item

    return list(walk(load("tasks", name)))


def test_config_and_rules_are_checked_by_promtool_and_reload_prometheus():
    by_dest = {t["ansible.builtin.template"]["dest"]: t for t in tasks("main.yml") if "ansible.builtin.template" in t}
    rules = by_dest["{{ monitoring_rules_dir }}/kunlun-fleet.yml"]
    assert rules["ansible.builtin.template"]["validate"] == "promtool check rules %s"
    assert rules["ansible.builtin.template"]["variable_start_string"] == "[["
    assert rules["ansible.builtin.template"]["variable_end_string"] == "]]"
    assert rules["notify"] == "Monitoring | Reload Prometheus"
    config = by_dest["{{ monitoring_config_file }}"]
    assert config["ansible.builtin.template"]["validate"] == "promtool check config %s"
    assert config["notify"] == "Monitoring | Reload Prometheus"
    assert by_dest["{{ __monitoring_args_file }}"]["notify"] == "Monitoring | Restart Prometheus"
    names = [t["name"] for t in tasks("main.yml")]
    # The rules exist before the configuration that loads them is checked.
    assert names.index(rules["name"]) < names.index(config["name"])
    handlers = {h["name"]: h for h in load("handlers", "main.yml")}
    assert handlers["Monitoring | Reload Prometheus"]["ansible.builtin.systemd_service"]["state"] == "reloaded"
    assert handlers["Monitoring | Restart Prometheus"]["ansible.builtin.systemd_service"]["state"] == "restarted"
    # No SIGHUP right after a restart (it kills a Prometheus still starting); check mode's
    # announcements follow the same rule, so they count what a real run does.
    restart = handlers["Monitoring | Restart Prometheus"]["register"]
    assert "%s is not defined" % restart in handlers["Monitoring | Reload Prometheus"]["when"]
    announced = handlers["Monitoring | Restart Prometheus (check mode)"]["register"]
    assert "%s is not defined" % announced in handlers["Monitoring | Reload Prometheus (check mode)"]["when"]
    listened = {h.get("listen", h["name"]) for h in handlers.values()}
    notified = {t["notify"] for name in ("main.yml", "exporters.yml") for t in tasks(name) if "notify" in t}
    assert notified <= listened


def test_every_task_name_and_module_follows_the_project():
    for name in ("main.yml", "exporters.yml"):
        for task in tasks(name):
            assert re.match(r"^(Monitoring|Exporters) \| \S", task["name"]), task["name"]
            modules = [k for k in task if "." in k]
            assert len(modules) == 1 and modules[0].startswith("ansible.builtin."), task["name"]


def test_the_exporters_install_the_products_parser():
    (units_fact,) = [t for t in tasks("exporters.yml") if "ansible.builtin.set_fact" in t]
    xpu = [u for u in units_fact["ansible.builtin.set_fact"]["monitoring_units"] if u["name"] == "kunlun-xpu-exporter"][
        0
    ]
    parser = [f for f in xpu["files"] if f.get("dest") == "xpu_smi.py"][0]
    assert parser["src"] == "{{ lookup('module_util_file', 'xpu_smi.py') }}"
    for unit in units_fact["ansible.builtin.set_fact"]["monitoring_units"]:
        for f in unit["files"]:
            if "lookup(" not in f["src"]:
                assert (ROLE / "files" / f["src"]).is_file(), f["src"]
        assert unit["metric"] in monitoring.exporter_metric_names()
        assert unit["retire"][0].endswith("/" + unit["output"]), "the stale .prom file goes first"
    script = (ROLE / "files" / "kunlun-xpu-exporter").read_text()
    assert "import xpu_smi" in script and "_ROW1_RE" not in script


def test_playbook_runs_the_exporters_everywhere_scraped_and_prometheus_on_monitoring():
    plays = yaml.safe_load((ROOT / "playbooks" / "monitoring.yml").read_text())
    assert plays[0]["hosts"] == "localhost"
    assert set(plays[1]["hosts"].split(":")) == {"xpu_servers", "gateways", "monitoring"}
    include = plays[1]["tasks"][0]["ansible.builtin.include_role"]
    assert include == {"name": "monitoring", "tasks_from": "exporters"}
    assert plays[2]["hosts"] == "monitoring" and plays[2]["roles"] == [{"role": "monitoring"}]
    assert all(p.get("become") is True for p in plays[1:])


def test_what_runs_on_each_host():
    """The exporters' task data, templated as Ansible does for a serving host, a gateway host
    and a monitoring-only host: what is copied, what a host that left a group removes, and
    what the final wait looks for."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    items = tasks("exporters.yml")
    (fact,) = [t["ansible.builtin.set_fact"] for t in items if "ansible.builtin.set_fact" in t]
    (copy,) = [t for t in items if "ansible.builtin.copy" in t]
    (retire,) = [t for t in items if t["name"].startswith("Exporters | Their metrics file")]
    (wait,) = [t for t in items if t["name"] == "Exporters | node-exporter serves the exporters' metrics"]
    found = {}
    for host in ("p800-a02", "gw-01", "mon-01"):
        variables = monitoring.role_variables(dict(INVENTORY, inventory_hostname=host, role_path=str(ROLE)))
        units = Templar(loader=DataLoader(), variables=monitoring._trust(variables)).template(monitoring._trust(fact))
        variables.update(units)
        templar = Templar(loader=DataLoader(), variables=monitoring._trust(variables))
        copied = [(Path(i[1]["src"]).name, i[1].get("dest")) for i in templar.template(trust_as_template(copy["loop"]))]
        removed = templar.template(trust_as_template(retire["loop"]))
        variables["monitoring_node_metrics"] = {
            "status": 200,
            "content": "kunlun_xpu_exporter_last_run_timestamp_seconds 1\n"
            "kunlun_cert_exporter_last_run_timestamp_seconds 1",
        }
        ready = Templar(loader=DataLoader(), variables=monitoring._trust(variables)).template(
            trust_as_template("{{ %s }}" % wait["until"])
        )
        found[host] = (copied, removed, ready)
        if host == "gw-01":
            (gateway_unit,) = [u for u in units["monitoring_units"] if u["name"] == "kunlun-gateway-exporter"]
        assert all(Path(p).is_absolute() for p in removed)
    assert found["p800-a02"][0] == [
        ("kunlun-xpu-exporter", None),
        ("xpu_smi.py", "xpu_smi.py"),
        ("kunlun-cert-exporter", None),
        ("kunlun_textfile.py", None),
    ]
    assert found["p800-a02"][1][0] == "/var/lib/prometheus/node-exporter/kunlun_gateway.prom"
    assert found["p800-a02"][2] is True
    assert found["gw-01"][0] == [
        ("kunlun-gateway-exporter", None),
        ("kunlun-cert-exporter", None),
        ("kunlun_textfile.py", None),
    ]
    assert found["gw-01"][1][0] == "/var/lib/prometheus/node-exporter/kunlun_xpu.prom"
    assert found["gw-01"][2] is False, "the gateway exporter's own metric is awaited there"
    # The gateway exporter also reads the engine watchdog's state file (monitoring_watchdog_state).
    # The certificate exporter runs everywhere (it exports only the files a host has).
    assert found["mon-01"][0] == [("kunlun-cert-exporter", None), ("kunlun_textfile.py", None)]
    assert len(found["mon-01"][1]) == 9 and found["mon-01"][2] is True
    assert gateway_unit["args"][-1] == "--watchdog-state=/var/lib/kunlun-watchdog/state.json"


@pytest.mark.parametrize(
    "inventory, expected",
    [
        ({"gateway_watchdog_state_dir": "/srv/dog"}, "--watchdog-state=/srv/dog/state.json"),
        # The watchdog turned off on the gateways: its state left behind is not read.
        ({"gateway_watchdog_enabled": False}, "--watchdog-state="),
        ({"monitoring_watchdog_enabled": False}, "--watchdog-state="),
    ],
)
def test_the_gateway_exporter_follows_the_gateway_roles_watchdog(inventory, expected):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    (fact,) = [t["ansible.builtin.set_fact"] for t in tasks("exporters.yml") if "ansible.builtin.set_fact" in t]
    variables = monitoring.role_variables(dict(INVENTORY, inventory_hostname="gw-01", **inventory))
    units = Templar(loader=DataLoader(), variables=monitoring._trust(variables)).template(monitoring._trust(fact))
    (gateway_unit,) = [u for u in units["monitoring_units"] if u["name"] == "kunlun-gateway-exporter"]
    assert gateway_unit["args"][-1] == expected
