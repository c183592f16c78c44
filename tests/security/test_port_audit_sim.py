"""The port audit of the served sim fleet (the e2e leaves it served, the host firewall on):
every listening TCP socket of every host (`ss -ltnH` on the host) is judged against
docs/security.md's listener table (tests/security/port_audit.py). A socket on a loopback
address is out of everyone else's reach; any other must have a row, listen only on the
hosts the row names, and be reached exactly from where the row says - probed from the
controller, from a serving host that is not a gateway, from the gateway host (the fleet's
builder and monitoring host too) and from an address outside every allow-list (a network
namespace on the sim bridge, kunlun_fleet/sim/outsider.py). No measurement admission is
active meanwhile (the bench, the canary gate: roles/firewall/tasks/admit.yml)."""

import os
import subprocess
import sys

import pytest
import yaml

from kunlun_fleet.sim import config, fleet, outsider
from kunlun_fleet.sim.testing import INVENTORY, ssh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import port_audit  # noqa: E402 (beside this file)

pytestmark = pytest.mark.sim

OUTSIDER = ("kfsim-audit", "172.31.250.254")
PROBE_MANY = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        found = "open"
    except ConnectionRefusedError:
        found = "refused"
    except socket.timeout:
        found = "silent"
    except OSError as exc:
        found = "error %s" % exc.errno
    finally:
        s.close()
    print("%s %s" % (target, found))
"""


def inventory():
    """(groups, {host: index}, {host: address}) of the session's fleet, from its inventory."""
    with open(os.path.join(INVENTORY, "hosts.yml")) as fh:
        children = yaml.safe_load(fh)["all"]["children"]
    groups = {name: list((group or {}).get("hosts") or {}) for name, group in children.items()}
    hosts = sorted({h for members in groups.values() for h in members}, key=config.index_of)
    return groups, {h: config.index_of(h) for h in hosts}, {h: config.host_address(config.index_of(h)) for h in hosts}


def probed(output):
    found = {}
    for line in output.splitlines():
        target, _, result = line.partition(" ")
        host, port = target.rsplit(":", 1)
        found[(host, int(port))] = result
    return found


@pytest.fixture(scope="module")
def outside():
    outsider.up(*OUTSIDER)
    yield OUTSIDER[0]
    outsider.down(OUTSIDER[0])


def test_every_listener_is_in_the_allow_list_or_out_of_reach(sim_fleet, outside):
    groups, index, address = inventory()
    table = port_audit.doc_table()
    sockets = {h: port_audit.parse_ss(ssh(index[h], "ss -ltnH").stdout) for h in index}
    # Probe every non-loopback listener's port at the host's fleet address.
    targets = sorted(
        {"%s:%d" % (address[h], port) for h in sockets for bound, port in sockets[h] if not port_audit.loopback(bound)}
    )
    gateway = groups["gateways"][0]
    worker = next(h for h in groups["xpu_servers"] if h not in groups["gateways"])
    runs = {
        "controller": [sys.executable, "-c", PROBE_MANY] + targets,
        "outsider": ["ip", "netns", "exec", outside, sys.executable, "-c", PROBE_MANY] + targets,
        gateway: fleet.ssh_cmd(index[gateway], "python3 -c %s %s" % (_quote(PROBE_MANY), " ".join(targets))),
        worker: fleet.ssh_cmd(index[worker], "python3 -c %s %s" % (_quote(PROBE_MANY), " ".join(targets))),
    }
    by_address = {a: h for h, a in address.items()}
    probes = {}
    for origin, cmd in runs.items():
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (origin, proc.stderr[-2000:])
        for (host_address, port), found in probed(proc.stdout).items():
            probes[(origin, by_address[host_address], port)] = found
    origins = {
        "controller": {"admin", "clients"},
        "outsider": {"clients"},
        gateway: port_audit.words_of(gateway, groups) | {"clients"},
        worker: port_audit.words_of(worker, groups) | {"clients"},
    }
    problems = port_audit.judge(sockets, groups, address, probes, table, origins)
    listing = "\n".join(
        "%s: %s" % (h, ", ".join("%s:%d" % s for s in sockets[h])) for h in sorted(sockets, key=config.index_of)
    )
    assert not problems, "\n".join(problems) + "\n\nlisteners:\n" + listing
    # The audit saw what the fleet serves: vLLM on every serving host, the endpoint, SSH.
    for h in groups["xpu_servers"]:
        assert any(port == 8000 for _, port in sockets[h]), (h, sockets[h])
    assert probes[("outsider", gateway, 8080)] == "open" and probes[("controller", worker, 22)] == "open"
    assert probes[("controller", worker, 8000)] == "refused" and probes[(worker, gateway, 8000)] == "refused"


def _quote(text):
    import shlex

    return shlex.quote(text)
