"""The fleet key rotated on the served sim fleet, under streamed load through the fleet
endpoint (the gateway on kf-node-1) with clients that never retry (docs/gateway.md
"Rotating the fleet key"): `kunlun-fleet api-key rotate` while clients use the old key (the
serving hosts restarted in batches, each then accepting both keys; the gateway accepting
both and sending the new one), clients on the new key, then `rotate --finish` (the gateway
refusing the old key first, then the serving hosts restarted on the new key alone). No
request fails in either step; the old key is refused afterwards at the gateway and at a
worker; no engine's log holds either key. The vault keeps the new key (the suites after
this one read it from there)."""

import http.client
import json
import os
import subprocess

import pytest
import yaml

from kunlun_fleet import vault
from kunlun_fleet.bundle import load_pins as stack_pins
from kunlun_fleet.sim import config
from kunlun_fleet.sim.testing import INVENTORY, REPO, ssh
from failover_load import BEFORE, IN_FLIGHT, SERVED, Load, count, reasons

pytestmark = [pytest.mark.sim, pytest.mark.slow]

PINS = stack_pins()
GATEWAY = yaml.safe_load(open(os.path.join(REPO, "roles/gateway/defaults/main.yml")))
ENDPOINT = (config.host_address(1), GATEWAY["gateway_port"])
MODEL = PINS["kunlun_stack_model"]["name"]
HOSTS = (1, 2, 3)
KEYS_FILE = "/etc/kunlun-serve/api-keys.yaml"
VLLM_LOG = "/home/newdata/logs/serve/vllm.log"
CLIENTS, MAX_TOKENS = 8, 48


def api_key(*args):
    """`kunlun-fleet api-key -i INVENTORY ...`: (rc, stdout, stderr) apart (the new key is
    printed alone on stdout)."""
    proc = subprocess.run(
        [os.path.join(REPO, ".venv/bin/kunlun-fleet"), "api-key", "-i", INVENTORY, *args, "--plain"],
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=1800,
    )
    return proc.returncode, proc.stdout, proc.stderr


def models_status(key):
    """GET /v1/models through the endpoint with `key`, one try: the status and the error's code."""
    conn = http.client.HTTPConnection(*ENDPOINT, timeout=30)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key})
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    code = json.loads(body).get("error", {}).get("code") if resp.status != 200 else None
    return resp.status, code


def worker_status(host, key):
    """GET /v1/models on kf-node-`host`'s engine, asked from the gateway host (the only one
    its port answers), with `key`. The command is not shown on failure: it holds the key."""
    url = "https://%s:%d/v1/models" % (config.host_address(host), PINS["kunlun_stack_serving"]["port"])
    proc = ssh(
        1,
        "curl -s -o /dev/null -w '%%{http_code}' --cacert /etc/kunlun-fleet/ca.crt -H 'Authorization: Bearer %s' %s"
        % (key, url),
        check=False,
    )
    return proc.stdout.strip()


def accepted_keys(host):
    """How many keys kf-node-`host`'s engine is given (its --config file), and the file's mode."""
    out = ssh(
        host,
        "stat -c %%a %s && python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))[\"api-key\"]))' %s"
        % (KEYS_FILE, KEYS_FILE),
    ).stdout.split()
    return int(out[1]), out[0]


def in_log(host, key):
    """Whether kf-node-`host`'s engine log holds `key` (grep's exit status only)."""
    return ssh(host, "grep -qF -e '%s' %s; echo $?" % (key, VLLM_LOG), check=False).stdout.strip() == "0"


def test_the_fleet_key_rotated_under_load_in_two_steps(sim_fleet):
    old = vault.read_api_key(INVENTORY)
    assert not vault.fleet_key_rotating(INVENTORY)
    assert models_status(old) == (200, None)
    load_old = Load(ENDPOINT, MODEL, old, CLIENTS, MAX_TOKENS)
    load_old.start()
    load_new, rows_old, rows_new = None, None, []
    try:
        rc, out, err = api_key("rotate")
        assert rc == 0, (err[-6000:]).replace(out.strip() or "-", "********")
        new = out.strip()
        assert new and new == vault.read_api_key(INVENTORY) != old and out == new + "\n"
        assert old not in err and new not in err
        assert "Move every client of the fleet key to the new key" in err, err[-2000:]
        # Both keys: at the gateway, at every worker (its --config file, 0600), in no log.
        assert models_status(old) == (200, None) and models_status(new) == (200, None)
        for host in HOSTS:
            assert accepted_keys(host) == (2, "600")
            assert worker_status(host, old) == "200" and worker_status(host, new) == "200"
        # The clients move: new-key clients start, old-key ones stop.
        load_new = Load(ENDPOINT, MODEL, new, CLIENTS, MAX_TOKENS)
        load_new.start()
        rows_old = load_old.stop()
        rc, out, err = api_key("rotate", "--finish")
        assert rc == 0, err[-6000:]
        # No key printed (the run's own output is on stdout, as for a revoked client's).
        assert old not in out + err and new not in out + err
        assert "the old fleet key is refused everywhere" in err, err[-2000:]
        assert not vault.fleet_key_rotating(INVENTORY) and vault.read_api_key(INVENTORY) == new
        # The old key refused at the gateway (HAProxy's own 401) and at every worker.
        assert models_status(old) == (401, "invalid_api_key") and models_status(new) == (200, None)
        for host in HOSTS:
            assert accepted_keys(host) == (1, "600")
            assert worker_status(host, old) == "401" and worker_status(host, new) == "200"
            assert not in_log(host, old) and not in_log(host, new), "kf-node-%d's engine log holds a key" % host
    finally:
        if rows_old is None:
            rows_old = load_old.stop()
        rows_new = load_new.stop() if load_new else []
        # Whatever the checks above found, no rotation is left half done for the suites after.
        if vault.fleet_key_rotating(INVENTORY):
            api_key("rotate", "--finish")
    got_old, got_new = count(rows_old), count(rows_new)
    print("fleet key rotation under load: old-key clients %s, new-key clients %s" % (got_old, got_new))
    # Not one request failed, before its first byte or in flight, in either step.
    assert got_old[BEFORE] == 0 and got_old[IN_FLIGHT] == 0, reasons(rows_old)
    assert got_new[BEFORE] == 0 and got_new[IN_FLIGHT] == 0, reasons(rows_new)
    assert got_old[SERVED] > 0 and got_new[SERVED] > 0
