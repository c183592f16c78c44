# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the host firewall (roles/firewall) works out on the controller: each host's
allow-list (which port, from which addresses, and why), the addresses of a list of
networks, addresses and host names split by family, and whether an address is inside them.
docs/security.md lists the same allow-list for people; tests/unit/test_firewall_rules.py
checks the two against each other. Documentation: the .yml file of each filter beside
this one."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import socket

# The allow-list, in the order the rules are written: the entry's name, the setting that
# holds its port, the group whose hosts listen, who may reach it (the words docs/security.md
# uses) and why. "fleet" is every host of the four groups; "admin" firewall_admin_sources;
# "clients" firewall_gateway_clients. Prometheus listens on loopback only (roles/monitoring):
# no entry, the operators reach it through an SSH tunnel.
ENTRIES = (
    ("ssh", "ssh_port", "fleet", ("admin",), "the controller runs every stage over SSH"),
    (
        "serving",
        "serving_port",
        "serving",
        ("gateways", "monitoring"),
        "vLLM's API: the gateways route to it, Prometheus scrapes its /metrics; its key guards only /v1 paths",
    ),
    (
        "model_share",
        "model_share_port",
        "serving",
        ("fleet",),
        "the weights shared by a host that holds a verified copy, during the model stage",
    ),
    ("node_exporter", "node_exporter_port", "fleet", ("monitoring",), "node-exporter, scraped by Prometheus"),
    ("registry", "registry_port", "builders", ("fleet",), "the fleet registry the hosts pull the serving image from"),
    (
        "gateway",
        "gateway_port",
        "gateways",
        ("clients", "admin", "monitoring"),
        "the fleet endpoint (HAProxy): clients, the controller's acceptance and bench, Prometheus's /metrics",
    ),
)

GROUPS = {"serving": "xpu_servers", "gateways": "gateways", "monitoring": "monitoring", "builders": "image_builders"}

ANYWHERE = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


def _resolve(name):
    """Every address a host name resolves to on the controller (empty when it does not)."""
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]


def _parse(value):
    """(networks, problem) for one source: a network in CIDR form, an address or a host name."""
    text = str(value).strip()
    if not text:
        return [], "an empty entry"
    try:
        return [ipaddress.ip_network(text, strict=False)], None
    except ValueError:
        pass
    if "/" in text or ":" in text:
        return [], "%r is not an address nor a network (write 10.20.0.0/24, 10.20.0.5 or fd00::/64)" % text
    addresses = _resolve(text)
    if not addresses:
        return [], "%r does not resolve on the controller (give its address)" % text
    return [ipaddress.ip_network(a) for a in addresses], None


def firewall_networks(values):
    """{v4, v6, any, problems} for a list of networks, addresses and host names (or a map of
    them, whose keys then name the problems): the networks of each family, collapsed (no
    overlap, no duplicate), whether they cover every address of both families, and what could
    not be read (names resolve on the controller)."""
    if isinstance(values, str):
        values = [values]
    # A map (host -> address) names each problem by its key.
    named = sorted(values.items()) if isinstance(values, dict) else [(None, v) for v in values or []]
    found, problems = [], []
    for name, value in named:
        networks, problem = _parse(value)
        found += networks
        if problem:
            problems.append(problem if name is None else "%s: %s" % (name, problem))
    v4 = [n for n in found if n.version == 4]
    v6 = [n for n in found if n.version == 6]
    v4 = [str(n) for n in ipaddress.collapse_addresses(v4)]
    v6 = [str(n) for n in ipaddress.collapse_addresses(v6)]
    return {"v4": v4, "v6": v6, "any": v4 == ["0.0.0.0/0"] and v6 == ["::/0"], "problems": problems}


def firewall_in_networks(address, values):
    """Whether `address` is inside one of `values` (networks, addresses, host names)."""
    try:
        address = ipaddress.ip_address(str(address).split("%", 1)[0])
    except ValueError:
        return False
    # An IPv4 client seen through an IPv6 socket (::ffff:10.0.0.1) is the IPv4 address.
    if address.version == 6 and address.ipv4_mapped:
        address = address.ipv4_mapped
    networks = firewall_networks(values)
    return any(address in ipaddress.ip_network(n) for n in networks["v4"] + networks["v6"])


def _group(groups, settings, key):
    name = (settings.get("groups") or {}).get(key, GROUPS[key])
    return list(groups.get(name) or [])


def firewall_allow_list(host, groups, addresses, settings):
    """The allow-list of `host`: one entry per port it may listen on for others, each with
    the networks that may reach it (v4, v6, or any), who those are (docs/security.md's words)
    and why. `addresses` is each host's serving address (kunlun_stack_serving_addresses);
    `settings` the ports and the operators' sources (roles/firewall/vars/main.yml)."""
    members = {key: _group(groups, settings, key) for key in GROUPS}
    fleet = list(dict.fromkeys(sum(members.values(), [])))
    members["fleet"] = fleet

    def addresses_of(hosts):
        missing = [h for h in hosts if h not in addresses]
        if missing:
            raise ValueError("firewall_allow_list: no serving address for %s" % ", ".join(missing))
        return [addresses[h] for h in hosts]

    sources = {
        "admin": list(settings.get("admin_sources") or []),
        "clients": list(settings.get("gateway_clients") or []),
        "gateways": addresses_of(members["gateways"]),
        "monitoring": addresses_of(members["monitoring"]),
        "fleet": addresses_of(fleet),
    }
    entries = []
    for name, port_key, on, who, why in ENTRIES:
        port = settings.get(port_key)
        if host not in members[on] or port in (None, "", 0, "0"):
            continue
        values = []
        for word in who:
            values += sources[word]
        networks = firewall_networks(values)
        if networks["problems"]:
            raise ValueError(
                "firewall_allow_list: %s's sources (%s): %s" % (name, ", ".join(who), "; ".join(networks["problems"]))
            )
        # The gateway's clients may be everyone: then so is the rest of its list.
        if name == "gateway" and firewall_networks(sources["clients"])["any"]:
            networks = firewall_networks(["0.0.0.0/0", "::/0"])
        entries.append(
            {
                "name": name,
                "port": int(port),
                "on": on,
                "who": list(who),
                "why": why,
                "any": networks["any"],
                "v4": networks["v4"],
                "v6": networks["v6"],
            }
        )
    return entries


def firewall_open_ports(allow_lists):
    """What stays open when the firewall is off, one line per port: `allow_lists` maps each
    host to its allow-list; a port is named once, with the hosts that listen on it and who
    the firewall would have admitted."""
    seen = {}
    for host in sorted(allow_lists):
        for entry in allow_lists[host]:
            key = (entry["port"], entry["name"])
            if key not in seen:
                seen[key] = {"entry": entry, "hosts": []}
            seen[key]["hosts"].append(host)
    lines = []
    for (port, name), item in sorted(seen.items()):
        entry = item["entry"]
        limited = (
            "every address"
            if entry["any"]
            else "%s (%s)" % (" and ".join(entry["who"]), ", ".join(entry["v4"] + entry["v6"]) or "no address")
        )
        lines.append(
            "port %d (%s) on %s: open to every address; the firewall would admit %s"
            % (port, name, ", ".join(item["hosts"]), limited)
        )
    return lines


class FilterModule:
    def filters(self):
        return {
            "firewall_networks": firewall_networks,
            "firewall_in_networks": firewall_in_networks,
            "firewall_allow_list": firewall_allow_list,
            "firewall_open_ports": firewall_open_ports,
        }
