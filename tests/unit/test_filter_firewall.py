"""plugins/filter/firewall.py and plugins/lookup/route_source.py: the host firewall's
allow-lists, its address lists and the controller's own address towards a host. The rules
they make are rendered in tests/unit/test_firewall_rules.py and loaded for real by
molecule/firewall and the port audit (tests/security)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fw = load("filter_firewall", "plugins/filter/firewall.py")
route_source = load("lookup_route_source", "plugins/lookup/route_source.py")

GROUPS = {
    "xpu_servers": ["a01", "a02", "a03"],
    "image_builders": ["a01"],
    "gateways": ["gw"],
    "monitoring": ["gw"],
}
ADDRESSES = {"a01": "10.20.1.11", "a02": "10.20.1.12", "a03": "10.20.1.13", "gw": "10.20.0.5"}
SETTINGS = {
    "ssh_port": 22,
    "serving_port": 8000,
    "model_share_port": 8478,
    "node_exporter_port": 9100,
    "registry_port": 5000,
    "gateway_port": 8080,
    "admin_sources": ["10.20.0.2/32"],
    "gateway_clients": ["0.0.0.0/0", "::/0"],
}


def allow(host, **settings):
    return {e["name"]: e for e in fw.firewall_allow_list(host, GROUPS, ADDRESSES, dict(SETTINGS, **settings))}


def test_networks_are_collapsed_by_family_and_problems_named():
    found = fw.firewall_networks(["10.0.0.0/8", "10.1.2.3", "10.1.0.0/16", "fd00::1", "fd00::/64", "10.1.2.3/24"])
    assert found == {"v4": ["10.0.0.0/8"], "v6": ["fd00::/64"], "any": False, "problems": []}
    assert fw.firewall_networks(["0.0.0.0/0", "::/0"])["any"] is True
    assert fw.firewall_networks(["0.0.0.0/0"])["any"] is False
    bad = fw.firewall_networks(["10.0.0.0/33", "", "no-such-host.invalid"])
    assert bad["v4"] == [] and len(bad["problems"]) == 3, bad
    assert "10.0.0.0/33" in bad["problems"][0] and "does not resolve" in bad["problems"][2]
    # one string is one entry; a map names each problem by its key
    assert fw.firewall_networks("10.9.9.9")["v4"] == ["10.9.9.9/32"]
    named = fw.firewall_networks({"a01": "10.20.1.11", "gw": "gw-01.invalid"})
    assert named["v4"] == ["10.20.1.11/32"] and named["problems"][0].startswith("gw: "), named


def test_a_name_resolves_on_the_controller():
    assert fw.firewall_networks(["localhost"])["v4"] == ["127.0.0.1/32"]


def test_inside_the_networks():
    assert fw.firewall_in_networks("10.20.0.2", ["10.20.0.0/24"])
    assert fw.firewall_in_networks("::ffff:10.20.0.2", ["10.20.0.2"])
    assert not fw.firewall_in_networks("10.20.1.2", ["10.20.0.0/24"])
    assert not fw.firewall_in_networks("fd00::2", ["10.20.0.0/24"])
    assert not fw.firewall_in_networks("not-an-address", ["0.0.0.0/0"])
    assert not fw.firewall_in_networks("10.20.0.2", [])


def test_a_serving_host_admits_vllm_from_the_gateways_and_monitoring_only():
    entries = allow("a02")
    assert list(entries) == ["ssh", "serving", "model_share", "node_exporter"]
    assert entries["ssh"]["v4"] == ["10.20.0.2/32"] and entries["ssh"]["port"] == 22
    assert entries["serving"]["v4"] == ["10.20.0.5/32"] and not entries["serving"]["any"]
    assert entries["serving"]["who"] == ["gateways", "monitoring"]
    assert entries["model_share"]["v4"] == ["10.20.0.5/32", "10.20.1.11/32", "10.20.1.12/31"]
    assert entries["node_exporter"]["v4"] == ["10.20.0.5/32"]
    # never the controller on vLLM's port: it is admitted only while it measures (admit.yml)
    assert "10.20.0.2/32" not in entries["serving"]["v4"]


def test_the_builder_adds_its_registry_the_gateway_its_public_port():
    assert "registry" in allow("a01") and allow("a01")["registry"]["port"] == 5000
    gw = allow("gw")
    assert list(gw) == ["ssh", "node_exporter", "gateway"]
    assert gw["gateway"]["any"] is True and gw["gateway"]["port"] == 8080


def test_restricted_gateway_clients_keep_the_controller_and_monitoring():
    gw = allow("gw", gateway_clients=["192.168.7.0/24"])["gateway"]
    assert gw["any"] is False
    assert gw["v4"] == ["10.20.0.2/32", "10.20.0.5/32", "192.168.7.0/24"]


def test_a_port_of_zero_leaves_its_entry_out_and_a_bad_source_fails():
    assert "registry" not in allow("a01", registry_port=0)
    with pytest.raises(ValueError, match="ssh's sources"):
        fw.firewall_allow_list("a01", GROUPS, ADDRESSES, dict(SETTINGS, admin_sources=["10.0.0.0/40"]))
    with pytest.raises(ValueError, match="no serving address for gw"):
        fw.firewall_allow_list("a01", GROUPS, {k: v for k, v in ADDRESSES.items() if k != "gw"}, SETTINGS)


def test_what_stays_open_is_said_once_per_port():
    lines = fw.firewall_open_ports({h: fw.firewall_allow_list(h, GROUPS, ADDRESSES, SETTINGS) for h in ADDRESSES})
    serving = [line for line in lines if line.startswith("port 8000 ")]
    assert serving == [
        "port 8000 (serving) on a01, a02, a03: open to every address; the firewall would admit "
        "gateways and monitoring (10.20.0.5/32)"
    ]
    assert any(line.startswith("port 8080 (gateway) on gw:") and line.endswith("admit every address") for line in lines)
    assert len(lines) == len({line.split(" (")[0] for line in lines})


def test_the_controllers_own_address_towards_a_host():
    assert route_source.source_for("127.0.0.1") == "127.0.0.1"
    assert route_source.LookupModule().run(["127.0.0.1", "localhost"]) in (
        ["127.0.0.1", "127.0.0.1"],
        ["127.0.0.1", "::1"],
    )
    with pytest.raises(Exception, match="does not resolve"):
        route_source.source_for("no-such-host.invalid")
