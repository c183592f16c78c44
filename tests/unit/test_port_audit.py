"""The port audit's judgement (tests/security/port_audit.py) on recorded sockets and probes:
a listener without a row in docs/security.md fails, reachable or not; one reached from an
origin its row does not admit fails, as does one the row admits but the probe did not
reach; loopback listeners are nobody else's business. The audit itself runs on the served
sim fleet (tests/security/test_port_audit_sim.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("port_audit", ROOT / "tests/security/port_audit.py")
audit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(audit)

GROUPS = {"xpu_servers": ["n1", "n2"], "image_builders": ["n1"], "gateways": ["n1"], "monitoring": ["n1"]}
ADDRESSES = {"n1": "10.0.0.11", "n2": "10.0.0.12"}
ORIGINS = {
    "controller": {"admin", "clients"},
    "outsider": {"clients"},
    "n1": audit.words_of("n1", GROUPS) | {"clients"},
    "n2": audit.words_of("n2", GROUPS) | {"clients"},
}
SS = """LISTEN 0 128 0.0.0.0:22 0.0.0.0:*
LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:*
LISTEN 0 4096 127.0.0.1:8081 0.0.0.0:*
LISTEN 0 4096 127.0.0.11:43497 0.0.0.0:*
LISTEN 0 128 [::]:22 [::]:*
"""


def probes_for(host, port, **found):
    return {(origin, host, port): found.get(origin, "refused") for origin in ORIGINS if origin != host}


def fleet_probes():
    probes = {}
    for host in ("n1", "n2"):
        probes.update(probes_for(host, 22, controller="open"))
        probes.update(probes_for(host, 8000, **({"n1": "open"} if host == "n2" else {})))
    return probes


def test_ss_and_the_words():
    assert audit.parse_ss(SS) == [
        ("0.0.0.0", 22),
        ("0.0.0.0", 8000),
        ("127.0.0.1", 8081),
        ("127.0.0.11", 43497),
        ("[::]", 22),
    ]
    assert audit.words_of("n1", GROUPS) == {"serving", "builders", "gateways", "monitoring", "fleet"}
    assert audit.words_of("n2", GROUPS) == {"serving", "fleet"}
    assert audit.loopback("127.0.0.11") and audit.loopback("[::1]") and not audit.loopback("[::]")


def test_the_fleet_as_the_doc_says_passes():
    sockets = {"n1": audit.parse_ss(SS), "n2": audit.parse_ss(SS)}
    assert audit.judge(sockets, GROUPS, ADDRESSES, fleet_probes(), audit.doc_table(), ORIGINS) == []


def test_a_new_listener_without_a_row_fails_even_when_refused():
    sockets = {"n1": audit.parse_ss(SS), "n2": audit.parse_ss(SS) + [("0.0.0.0", 7777)]}
    probes = {**fleet_probes(), **probes_for("n2", 7777)}
    problems = audit.judge(sockets, GROUPS, ADDRESSES, probes, audit.doc_table(), ORIGINS)
    assert problems == ["n2 0.0.0.0:7777 has no row in docs/security.md (port, who may reach it, why)"]


def test_reached_from_where_the_doc_does_not_admit_fails():
    sockets = {"n1": audit.parse_ss(SS), "n2": audit.parse_ss(SS)}
    probes = {**fleet_probes(), **probes_for("n2", 8000, n1="open", outsider="open")}
    problems = audit.judge(sockets, GROUPS, ADDRESSES, probes, audit.doc_table(), ORIGINS)
    assert problems == ["n2 0.0.0.0:8000: reached from outsider, which the doc does not admit (gateways, monitoring)"]


def test_not_reached_from_where_the_doc_admits_fails():
    sockets = {"n1": audit.parse_ss(SS), "n2": audit.parse_ss(SS)}
    probes = {**fleet_probes(), **probes_for("n2", 8000, n1="refused")}
    problems = audit.judge(sockets, GROUPS, ADDRESSES, probes, audit.doc_table(), ORIGINS)
    assert problems == ["n2 0.0.0.0:8000: n1 should reach it (the doc admits gateways, monitoring), got refused"]


def test_a_loopback_only_port_on_another_address_and_a_port_on_the_wrong_host_fail():
    sockets = {"n1": audit.parse_ss(SS), "n2": audit.parse_ss(SS) + [("10.0.0.12", 8081), ("10.0.0.12", 5000)]}
    probes = {**fleet_probes(), **probes_for("n2", 8081), **probes_for("n2", 5000)}
    problems = audit.judge(sockets, GROUPS, ADDRESSES, probes, audit.doc_table(), ORIGINS)
    assert "n2 10.0.0.12:8081: the doc says loopback only, it listens on 10.0.0.12" in problems
    assert "n2 10.0.0.12:5000: the doc has port 5000 on builders hosts only" in problems
    # the registry's row admits the fleet: n1 should have reached it
    assert "n2 10.0.0.12:5000: n1 should reach it (the doc admits fleet), got refused" in problems
