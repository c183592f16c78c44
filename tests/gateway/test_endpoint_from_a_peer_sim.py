"""The fleet endpoint as another sim host sees it (suite bench-sim: the served fleet the e2e
leaves, its gateway on kf-node-1, plain HTTP): from kf-node-2, a serving host but not a
monitoring one, the router's admin routes and /metrics are refused by the proxy, the API
answers 401 without the key and 200 with it, a streamed completion arrives in many chunks;
and nothing it asked for changed the router's worker list. (TLS, the 90 s request and the
drain through the router's loopback port: the gateway's molecule scenario and the e2e.)"""

import json
import subprocess

import pytest

from kunlun_fleet import vault
from kunlun_fleet.sim import fleet
from kunlun_fleet.sim.config import INVENTORY_DIR, host_address
from kunlun_fleet.sim.testing import ssh

pytestmark = pytest.mark.sim
ENDPOINT = "http://%s:8080" % host_address(1)
PEER = 2


def from_peer(method, path, key=None, body=None):
    """(HTTP status, body) of a request sent by curl on kf-node-2. The key goes in through
    stdin as a header file (curl -H @-), never on a command line."""
    cmd = "curl -s --path-as-is -o /tmp/kf-peer-body -w '%%{http_code}' -X %s %s%s" % (
        method,
        "-H @- " if key else "",
        "-H 'Content-Type: application/json' -d '%s' " % json.dumps(body) if body else "",
    )
    proc = subprocess.run(
        fleet.ssh_cmd(PEER, cmd + "'%s%s'; echo; cat /tmp/kf-peer-body" % (ENDPOINT, path)),
        input=("Authorization: Bearer %s\n" % key) if key else "",
        capture_output=True,
        text=True,
        timeout=120,
    )
    status, _, text = proc.stdout.partition("\n")
    return int(status or 0), text


def workers():
    return json.loads(ssh(1, "curl -sf http://127.0.0.1:8081/list_workers").stdout)["urls"]


def test_strangers_are_refused_and_clients_served(sim_fleet):
    before = sorted(workers())
    assert len(before) == 3, before
    for method, path in (
        ("POST", "/remove_worker?url=https://%s:8000" % host_address(3)),
        ("POST", "/add_worker?url=https://10.9.9.9:8000"),
        ("GET", "/list_workers"),
        ("GET", "/workers"),
        ("POST", "/flush_cache"),
        ("GET", "/metrics"),
        ("GET", "/v1/../list_workers"),
        ("GET", "/v1/%2e%2e/workers"),
    ):
        assert from_peer(method, path)[0] == 403, (method, path)
    assert sorted(workers()) == before
    assert from_peer("GET", "/health")[0] == 200
    assert from_peer("GET", "/v1/models")[0] == 401
    key = vault.read_api_key(INVENTORY_DIR)
    status, text = from_peer("GET", "/v1/models", key=key)
    assert status == 200, text
    model = json.loads(text)["data"][0]["id"]
    status, text = from_peer(
        "POST",
        "/v1/completions",
        key=key,
        body={"model": model, "prompt": "from a peer", "max_tokens": 40, "ignore_eos": True, "stream": True},
    )
    assert status == 200, text
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert len(events) >= 40 and events[-1] == "data: [DONE]", text[-2000:]
