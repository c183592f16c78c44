"""The port audit's reading of docs/security.md and its judgement, apart from the fleet it
runs on (tests/security/test_port_audit_sim.py gathers the sockets and the probes;
tests/unit/test_port_audit.py feeds this recorded ones).

The listener table of docs/security.md: one row per port (the default), the hosts that
listen on it and who may reach it, in the doc's words (WORDS). A listening socket is judged:
- on a loopback address: nobody else reaches it; a row that says otherwise is wrong;
- on another address: it must have a row (a listener without one fails, reachable or not),
  its host must be one the row names, and each probe must find it open exactly when the
  row admits the probe's origin.
"""

import ipaddress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"

HOST_WORDS = {"fleet", "serving", "builders", "gateways", "monitoring"}
SOURCE_WORDS = HOST_WORDS | {"admin", "clients", "loopback"}
# The inventory groups behind the words (fleet: all four).
GROUPS = {"serving": "xpu_servers", "builders": "image_builders", "gateways": "gateways", "monitoring": "monitoring"}


def doc_table(text=None):
    """{port: {service, listens, hosts, sources, why}} from the doc's listener table (the rows
    whose first cell is a port number)."""
    found = {}
    for line in (text if text is not None else DOC.read_text()).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].isdigit():
            port, service, listens, hosts, sources, why = cells
            found[int(port)] = {
                "service": service,
                "listens": listens,
                "hosts": hosts,
                "sources": [w.strip() for w in sources.split(",")],
                "why": why,
            }
    return found


def words_of(host, groups):
    """The words that name `host` (as a listener's host and as a probe's origin)."""
    found = set()
    for word, group in GROUPS.items():
        if host in groups.get(group, []):
            found.add(word)
    if found:
        found.add("fleet")
    return found


def loopback(address):
    try:
        return ipaddress.ip_address(address.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def parse_ss(text):
    """[(address, port)] of `ss -ltnH` lines (its fourth column, Local Address:Port)."""
    sockets = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and ":" in fields[3]:
            address, port = fields[3].rsplit(":", 1)
            sockets.append((address, int(port)))
    return sorted(set(sockets))


def covers(bound, address):
    """Whether a socket bound to `bound` accepts connections to `address`."""
    bound = bound.strip("[]").split("%", 1)[0]
    return bound in ("*", "0.0.0.0", "::") or bound == address


def judge(hosts, groups, addresses, probes, table, origins):
    """Every problem of the audit, in words.

    hosts: {host: [(address, port)]} the listening sockets; groups: the inventory's groups;
    addresses: {host: fleet address}; probes: {(origin, host, port): open|refused|silent|...};
    table: doc_table(); origins: {origin: set of words} (a fleet host's words plus "clients",
    the controller's "admin" and "clients", an outsider's "clients")."""
    problems = []
    for host in sorted(hosts):
        mine = words_of(host, groups)
        for bound, port in hosts[host]:
            row = table.get(port)
            where = "%s %s:%d" % (host, bound, port)
            # Nobody else reaches it, whatever the doc says.
            if loopback(bound):
                continue
            if row is None:
                problems.append("%s has no row in docs/security.md (port, who may reach it, why)" % where)
                continue
            if row["sources"] == ["loopback"]:
                problems.append("%s: the doc says loopback only, it listens on %s" % (where, bound))
            if row["hosts"] not in mine:
                problems.append("%s: the doc has port %d on %s hosts only" % (where, port, row["hosts"]))
            for origin, words in sorted(origins.items()):
                if origin == host:
                    continue
                found = probes.get((origin, host, port))
                if found is None:
                    problems.append("%s: not probed from %s" % (where, origin))
                    continue
                admitted = bool(set(row["sources"]) & words) and covers(bound, addresses[host])
                if admitted and found != "open":
                    problems.append("%s: %s should reach it (the doc admits %s), got %s" % (
                        where, origin, ", ".join(row["sources"]), found))  # fmt: skip
                if not admitted and found == "open":
                    problems.append("%s: reached from %s, which the doc does not admit (%s)" % (
                        where, origin, ", ".join(row["sources"])))  # fmt: skip
    return problems
