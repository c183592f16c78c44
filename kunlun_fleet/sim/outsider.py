"""An address outside the sim fleet's allow-lists: a network namespace of this machine with
one end of a veth pair on the sim bridge (kfsim0) and an address of the sim subnet that no
sim host and no inventory names (sim hosts are 172.31.250.11..250, the controller is .1).
A probe from it is what a stranger on the fleet's network sees; the host firewall's tests
(tests/security, molecule/firewall) use one each, under names and addresses of their own,
so that lanes running side by side never share one.

    python -m kunlun_fleet.sim.outsider up NAME ADDRESS     # e.g. up kfsim-audit 172.31.250.254
    python -m kunlun_fleet.sim.outsider probe NAME HOST PORT  # prints open, refused or silent
    python -m kunlun_fleet.sim.outsider probe - HOST PORT     # the same from this machine (the controller)
    python -m kunlun_fleet.sim.outsider down NAME
"""

import ipaddress
import os
import sys

from .config import NETWORK_BRIDGE, SUBNET, SimError, run

# Addresses above the sim hosts' range (10 + MAX_INDEX, fleet.py), below the broadcast.
FIRST_FREE = 251


def _veth(name):
    # Interface names are at most 15 characters.
    return ("kfo-" + name.replace("kfsim-", ""))[:15]


def check(name, address):
    net = ipaddress.ip_network(SUBNET)
    addr = ipaddress.ip_address(address)
    if addr not in net or int(addr) - int(net.network_address) < FIRST_FREE or addr == net.broadcast_address:
        raise SimError(
            "outsider %s: %s is not a free address of the sim subnet %s (use .%d to .%d: below that are the "
            "controller and the sim hosts)" % (name, address, SUBNET, FIRST_FREE, net.num_addresses - 2)
        )
    if not name or len(name) > 32 or not name.replace("-", "").isalnum():
        raise SimError("outsider: %r is not a namespace name (letters, digits and -)" % name)


def exists(name):
    return name in (run(["ip", "netns", "list"]).stdout or "").split()


def up(name, address):
    """The namespace `name` at `address` on the sim bridge (made once; kept as it is)."""
    check(name, address)
    if exists(name):
        return
    veth = _veth(name)
    prefix = ipaddress.ip_network(SUBNET).prefixlen
    run(["ip", "netns", "add", name])
    try:
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name])
        run(["ip", "link", "set", veth, "master", NETWORK_BRIDGE])
        run(["ip", "link", "set", veth, "up"])
        run(["ip", "netns", "exec", name, "ip", "addr", "add", "%s/%d" % (address, prefix), "dev", "eth0"])
        run(["ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"])
        run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
    except SimError:
        down(name)
        raise


def down(name):
    run(["ip", "link", "del", _veth(name)], check=False)
    run(["ip", "netns", "del", name], check=False)


PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("open")
except ConnectionRefusedError:
    print("refused")
except socket.timeout:
    print("silent")
except OSError as exc:
    print("error %s" % exc)
"""


def probe(name, host, port, timeout=3.0):
    """open (a connection was made), refused (a TCP reset at once), silent (no answer within
    `timeout`) or "error <reason>" (an ICMP error, no route), for a TCP connection from the namespace (None or "-": from
    this machine itself)."""
    where = [] if name in (None, "-") else ["ip", "netns", "exec", name]
    proc = run(where + [sys.executable, "-c", PROBE, str(host), str(port), str(timeout)], timeout=timeout + 30)
    return proc.stdout.strip()


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["up"] and len(args) == 3:
            up(args[1], args[2])
        elif args[:1] == ["down"] and len(args) == 2:
            down(args[1])
        elif args[:1] == ["probe"] and len(args) == 4:
            print(probe(args[1], args[2], args[3]))
        else:
            sys.stderr.write(__doc__)
            return 2
    except SimError as exc:
        sys.stderr.write("%s\n" % exc)
        return 1
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.stderr.write("outsider: needs root (network namespaces)\n")
        sys.exit(1)
    sys.exit(main())
