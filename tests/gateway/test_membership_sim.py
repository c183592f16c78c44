"""Membership on the served sim fleet, under streamed load through the fleet endpoint (the
gateway on kf-node-1) with a client that never retries: `kunlun-fleet host remove kf-node-3`
(the capacity gate, drained from the gateway with its requests in flight finished, serving
stopped and disabled, out of the router's workers and Prometheus's targets, its data left),
then `kunlun-fleet host add kf-node-3` (its key checked, every stage on it with the image
builder, the gateway and monitoring: serving again, back in the router and Prometheus).
No request fails, before its first byte or in flight. The fleet is left as it was."""

import os
import subprocess

import pytest
import yaml

from kunlun_fleet import status, vault
from kunlun_fleet.sim import config
from kunlun_fleet.sim.testing import INVENTORY, REPO, ssh
from failover_load import BEFORE, IN_FLIGHT, SERVED, Load, count, reasons
from kunlun_fleet.bundle import load_pins as stack_pins

pytestmark = [pytest.mark.sim, pytest.mark.slow]

PINS = stack_pins()
GATEWAY = yaml.safe_load(open(os.path.join(REPO, "roles/gateway/defaults/main.yml")))
MONITORING = yaml.safe_load(open(os.path.join(REPO, "roles/monitoring/defaults/main.yml")))
LEAVING = 3
URL = "https://%s:%d" % (config.host_address(LEAVING), PINS["kunlun_stack_serving"]["port"])
CLIENTS, MAX_TOKENS = 8, 48


def kunlun_fleet(*args):
    proc = subprocess.run(
        [os.path.join(REPO, ".venv/bin/kunlun-fleet"), *args, "--plain"],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout + proc.stderr


def router_workers():
    """The worker URLs the gateway's router unit was started with."""
    unit = ssh(1, "systemctl cat %s" % GATEWAY["gateway_service_name"]).stdout
    return status.unit_worker_urls(unit) or []


def prometheus_targets_host(host):
    """Prometheus's configuration on kf-node-1 has a target labelled with the host."""
    return ('host: "%s"' % host) in ssh(1, "cat %s" % MONITORING["monitoring_config_file"]).stdout


def test_a_host_removed_and_added_back_under_load(sim_fleet):
    name = config.host_name(LEAVING)
    assert URL in router_workers() and prometheus_targets_host(name)
    # The weights' directory (roles/model: <data root>/newdata/models/<the model's directory>).
    model_dir = "/home/newdata/models/%s" % PINS["kunlun_stack_model"]["directory"]
    # The data volume as it is (the e2e's kf-node-3 keeps the ext4 /home it was delivered with).
    home = ssh(LEAVING, "findmnt -n -o SOURCE,FSTYPE --mountpoint /home").stdout.strip()
    assert home, "kf-node-3 has no /home volume"
    endpoint = (config.host_address(1), GATEWAY["gateway_port"])
    load = Load(endpoint, PINS["kunlun_stack_model"]["name"], vault.read_api_key(INVENTORY), CLIENTS, MAX_TOKENS)
    load.start()
    try:
        rc, out = kunlun_fleet("host", "remove", "-i", INVENTORY, name)
        assert rc == 0, out[-6000:]
        try:
            assert "removed from serving: %s" % name in out and "Now delete it from" in out, out[-2000:]
            removed = count(list(load.rows))
            # Out of service, its data left: the unit stopped and disabled, /home still mounted.
            assert ssh(LEAVING, "systemctl is-active kunlun-serve", check=False).stdout.strip() != "active"
            assert ssh(LEAVING, "systemctl is-enabled kunlun-serve", check=False).stdout.strip() == "disabled"
            assert ssh(LEAVING, "findmnt -n -o SOURCE,FSTYPE --mountpoint /home").stdout.strip() == home
            assert ssh(LEAVING, "docker image inspect kunlun-serving:current --format ok").stdout.strip() == "ok"
            assert ssh(LEAVING, "test -f %s/config.json && echo ok" % model_dir).stdout.strip() == "ok"
            # Out of the router's workers and Prometheus's targets; the others still there.
            workers = router_workers()
            assert URL not in workers and len(workers) == 2, workers
            assert not prometheus_targets_host(name) and prometheus_targets_host(config.host_name(2))
        finally:
            # Added back whatever the checks above found: the suites after this one need it.
            added = kunlun_fleet("host", "add", "-i", INVENTORY, name)
        rc, out = added
        assert rc == 0, out[-6000:]
        assert ssh(LEAVING, "systemctl is-active kunlun-serve", check=False).stdout.strip() == "active"
        assert ssh(LEAVING, "systemctl is-enabled kunlun-serve", check=False).stdout.strip() == "enabled"
        assert URL in router_workers() and prometheus_targets_host(name)
    finally:
        rows = load.stop()
    got = count(rows)
    print("membership under load: removed with %s, then %s overall" % (removed, got))
    # Not one request failed, before its first byte or in flight, through both.
    assert got[BEFORE] == 0 and got[IN_FLIGHT] == 0, reasons(rows)
    assert got[SERVED] > 0 and removed[SERVED] > 0, got
