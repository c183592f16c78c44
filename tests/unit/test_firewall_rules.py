"""The host firewall's rules as the role renders them (Ansible's templar: the role's defaults
and vars, kunlun_stack's effective configuration, the allow-list filter), the gateway's guard
of the router's ports, and docs/security.md's table against the allow-list the rules are
made of. nft itself reads them in molecule/firewall (and the guard in molecule/gateway)."""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import monitoring
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/firewall"
GATEWAY = ROOT / "roles/gateway"

# A production-shaped fleet: three serving hosts (the first builds the image), a gateway host
# that is also the monitoring host.
GROUPS = {
    "all": ["a01", "a02", "a03", "gw"],
    "xpu_servers": ["a01", "a02", "a03"],
    "image_builders": ["a01"],
    "gateways": ["gw"],
    "monitoring": ["gw"],
    "ungrouped": [],
}
ADDRESSES = {"a01": "10.20.1.11", "a02": "10.20.1.12", "a03": "10.20.1.13", "gw": "10.20.0.5"}


def variables(host, **extra):
    found = {"ansible_managed": "Ansible managed", "playbook_dir": str(ROOT), "inventory_hostname": host}
    found.update(stack_pins())
    found.update(yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text()))
    found.update(yaml.safe_load((ROLE / "defaults/main.yml").read_text()))
    found.update(yaml.safe_load((GATEWAY / "defaults/main.yml").read_text()))
    found.update(
        groups=GROUPS,
        hostvars={h: {"ansible_host": a} for h, a in ADDRESSES.items()},
        firewall_admin_sources=["10.20.0.2/32"],
    )
    found.update(extra)
    found.update(yaml.safe_load((ROOT / "roles/kunlun_stack/vars/main.yml").read_text()))
    found.update(yaml.safe_load((ROLE / "vars/main.yml").read_text()))
    return found


def template(text, host, **extra):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=monitoring._trust(variables(host, **extra)))
    return templar.template(trust_as_template(text))


def allow_list(host, **extra):
    return template(
        "{{ inventory_hostname | firewall_allow_list(groups, kunlun_stack_serving_addresses, firewall_settings) }}",
        host,
        **extra,
    )


def rules(host, **extra):
    found = variables(host, **extra)
    found["firewall_allow"] = allow_list(host, **extra)
    return monitoring.render(ROLE / "templates/kunlun_fleet.nft.j2", found)


def lines(text):
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_a_serving_host_refuses_all_but_its_allow_list():
    found = lines(rules("a02"))
    # one table of its own, replaced whole in one transaction
    assert found[:3] == ["table inet kunlun_fleet", "delete table inet kunlun_fleet", "table inet kunlun_fleet {"]
    assert "flush ruleset" not in rules("a02")
    chain = found[found.index("chain input {") :]
    assert chain[1] == "type filter hook input priority filter; policy accept;"
    assert chain[2:5] == ['iif "lo" accept', "ct state invalid drop", "ct state established,related accept"]
    assert "tcp dport 22 ip saddr { 10.20.0.2/32 } accept" in chain
    assert "tcp dport 8000 ip saddr { 10.20.0.5/32 } accept" in chain
    assert "tcp dport 8000 ip saddr @measure_v4 accept" in chain
    assert "tcp dport 9100 ip saddr { 10.20.0.5/32 } accept" in chain
    assert "tcp dport 8478 ip saddr { 10.20.0.5/32, 10.20.1.11/32, 10.20.1.12/31 } accept" in chain
    # nothing else opens a port, and the end refuses (reset), never a bare accept
    opened = [line for line in chain if line.startswith("tcp dport")]
    assert {re.match(r"tcp dport (\d+)", line).group(1) for line in opened} == {"22", "8000", "8478", "9100"}
    assert chain[-5:] == [
        "fib daddr type { broadcast, multicast } drop",
        "meta l4proto tcp reject with tcp reset",
        "reject with icmpx type admin-prohibited",
        "}",
        "}",
    ]


def test_the_gateway_port_is_open_to_clients_and_the_builder_serves_its_registry():
    gw = lines(rules("gw"))
    assert "tcp dport 8080 accept" in gw and not any(line.startswith("tcp dport 8000") for line in gw)
    restricted = lines(rules("gw", firewall_gateway_clients=["192.168.7.0/24", "fd00:7::/64"]))
    assert "tcp dport 8080 ip saddr { 10.20.0.2/32, 10.20.0.5/32, 192.168.7.0/24 } accept" in restricted
    assert "tcp dport 8080 ip6 saddr { fd00:7::/64 } accept" in restricted
    assert "tcp dport 5000 ip saddr { 10.20.0.5/32, 10.20.1.11/32, 10.20.1.12/31 } accept" in lines(rules("a01"))


def test_the_ports_follow_the_roles_settings_and_site_rules_come_before_the_allow_list():
    found = lines(
        rules(
            "a01",
            ansible_port=2222,
            kunlun_stack_serving_overrides={"port": 9000},
            model_peer_port=0,
            firewall_site_rules=["tcp dport 9400 ip saddr 10.20.0.0/24 accept"],
        )
    )
    assert "tcp dport 2222 ip saddr { 10.20.0.2/32 } accept" in found
    assert "tcp dport 9000 ip saddr { 10.20.0.5/32 } accept" in found
    assert not any(line.startswith("tcp dport 8478") for line in found)
    assert found.index("tcp dport 9400 ip saddr 10.20.0.0/24 accept") < found.index(
        "tcp dport 2222 ip saddr { 10.20.0.2/32 } accept"
    )


def test_the_guard_lets_only_the_products_users_reach_the_routers_ports():
    found = variables("gw")
    guard = lines(monitoring.render(GATEWAY / "templates/kunlun-gateway-guard.nft.j2", found))
    assert guard[:3] == ["table inet kunlun_gateway", "delete table inet kunlun_gateway", "table inet kunlun_gateway {"]
    assert "type filter hook output priority filter; policy accept;" in guard
    assert (
        'oif "lo" tcp dport { 8081, 29000 } meta skuid != { root, kunlun-gateway, haproxy } reject with tcp reset'
        in guard
    )


# ------------------------------------------------------------ docs/security.md's table
# The port audit's reading of it (tests/security/port_audit.py): the same parser and words.
_spec = importlib.util.spec_from_file_location("port_audit", ROOT / "tests/security/port_audit.py")
port_audit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(port_audit)
doc_table = port_audit.doc_table


def test_the_doc_names_who_may_reach_each_port_in_its_words():
    table = doc_table()
    assert table, "docs/security.md has no listener table"
    for port, row in table.items():
        assert row["hosts"] in port_audit.HOST_WORDS, (port, row)
        assert set(row["sources"]) <= port_audit.SOURCE_WORDS and row["sources"], (port, row)
        assert row["why"], port


@pytest.mark.parametrize("host", ["a01", "a02", "gw"])
def test_the_doc_and_the_rules_admit_the_same(host):
    """Each entry of a host's allow-list is a row of the doc with the same port, hosts and
    sources, and each row the doc says is reachable from elsewhere is in some host's list."""
    table = doc_table()
    for entry in allow_list(host):
        row = table.get(entry["port"])
        assert row is not None, "docs/security.md has no row for port %d (%s)" % (entry["port"], entry["name"])
        assert row["sources"] == entry["who"], (entry["port"], row["sources"], entry["who"])
        assert row["hosts"] == entry["on"], (entry["port"], row["hosts"], entry["on"])
    every = {e["port"]: e for h in ADDRESSES for e in allow_list(h)}
    for port, row in table.items():
        if row["sources"] != ["loopback"]:
            assert port in every, "docs/security.md opens port %d, which no rule admits" % port
        else:
            assert port not in every, "port %d is loopback-only in the doc but the rules open it" % port
