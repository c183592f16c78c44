"""The rollout's drain, decided out loud, on a serving sim host (kf-node-1, converged and in
the gateway): a request that outlasts serve_drain_timeout stops the rollout with the host
not restarted and back in the gateway (the new configuration pending for the next run);
with serve_drain_force the host is restarted, the run says how many requests were cut,
and the cut stream really ends early."""

import http.client
import json
import os
import ssl
import subprocess
import threading
import time

import pytest
import yaml

from kunlun_fleet import vault
from kunlun_fleet.sim.testing import FLEET_CA, INVENTORY, REPO, VENV_BIN, _env, admitted, ssh
from kunlun_fleet.bundle import load_pins as stack_pins

pytestmark = [pytest.mark.sim, pytest.mark.slow]

HOST, ADDRESS = 1, "172.31.250.11"
PINS = stack_pins()
PORT = PINS["kunlun_stack_serving"]["port"]
WORKER = "https://%s:%d" % (ADDRESS, PORT)
SIM_ENV = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars/all/sim.yml")))["kunlun_stack_serving_env_overrides"]
# A change of the serving environment: the run must drain and restart the host.
CHANGED_ENV = dict(SIM_ENV, KF_DRAIN_TEST="1")


def serve(*extra):
    # Without the capacity gate: in this lane the other hosts may not be serving, and the
    # gate would (rightly) hold the batch until the long request ends, before any drain.
    # The gate has its own tests (tests/unit/test_rollout_capacity.py, the e2e rollout).
    proc = subprocess.run(
        [
            os.path.join(VENV_BIN, "ansible-playbook"),
            "-i",
            INVENTORY,
            "playbooks/serve.yml",
            "--limit",
            "kf-node-%d" % HOST,
            "-e",
            "serve_capacity_check=false",
            *extra,
        ],
        cwd=REPO,
        env=_env(),
        text=True,
        capture_output=True,
        timeout=900,
    )
    return proc.returncode, proc.stdout + proc.stderr


def extra_env(env):
    return ["-e", json.dumps({"kunlun_stack_serving_env_overrides": env})]


class LongStream(threading.Thread):
    """One streamed completion of many tokens straight to the host (not through the
    gateway: the drain must see the server's own count). Records chunks and how it ended."""

    def __init__(self, max_tokens):
        super().__init__(daemon=True)
        self.max_tokens, self.chunks, self.finish, self.error = max_tokens, 0, None, None
        self.done = threading.Event()

    def run(self):
        key = vault.read_api_key(INVENTORY)
        body = json.dumps(
            {
                "model": PINS["kunlun_stack_model"]["name"],
                "prompt": "The drain",
                "stream": True,
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
            }
        )
        try:
            # TLS with the fleet CA's certificate, as the gateway reaches it (docs/gateway.md).
            context = ssl.create_default_context(cafile=FLEET_CA)
            conn = http.client.HTTPSConnection(ADDRESS, PORT, timeout=300, context=context)
            conn.request(
                "POST", "/v1/completions", body, {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                self.chunks += 1
                self.finish = choice.get("finish_reason") or self.finish
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.error = repr(exc)
        finally:
            self.done.set()

    def started_streaming(self, timeout=60):
        end = time.monotonic() + timeout
        while self.chunks < 5 and not self.done.is_set() and time.monotonic() < end:
            time.sleep(0.2)
        return self.chunks >= 5


def service_invocation():
    return ssh(HOST, "systemctl show --property InvocationID --value kunlun-serve.service").stdout.strip()


def pending():
    return ssh(HOST, "test -e /etc/kunlun-serve/restart-pending", check=False).returncode == 0


def gateway_workers():
    # The router's admin API answers on the gateway host itself only (loopback).
    return json.loads(ssh(HOST, "curl -sf http://127.0.0.1:8081/list_workers").stdout)["urls"]


@pytest.fixture
def serving_host(sim_fleet):
    """kf-node-1 serving on the sim inventory's configuration and listed by the gateway;
    put back on it afterwards (one restart)."""
    rc, out = serve(*extra_env(SIM_ENV))
    assert rc == 0, out[-3000:]
    assert WORKER in gateway_workers()
    yield
    rc, out = serve(*extra_env(SIM_ENV))
    assert rc == 0, out[-3000:]
    assert not pending()


def test_drain_out_of_time_stops_then_force_cuts(serving_host):
    # The stream goes to the host directly from this machine: admitted to vLLM's port as the
    # bench is (the host firewall opens it to the gateways and the monitoring hosts only).
    with admitted(HOST):
        drain_out_of_time_stops_then_force_cuts()


def drain_out_of_time_stops_then_force_cuts():
    stream = LongStream(max_tokens=4000)
    stream.start()
    assert stream.started_streaming(), stream.error
    before = service_invocation()

    # 1. The request outlasts the drain: the rollout stops, the host is not restarted.
    rc, out = serve("-e", "serve_drain_timeout=4", *extra_env(CHANGED_ENV))
    assert rc != 0, out[-3000:]
    assert "kf-node-1 still had 1 request(s) running or waiting after serve_drain_timeout=4 s" in out, out[-4000:]
    assert "It was not restarted" in out and "serve_drain_force: true" in out
    assert "Roll this host back" not in out.split("Stop the rollout here, not restarted")[-1], out[-3000:]
    assert service_invocation() == before, "the host was restarted although its drain ran out of time"
    assert WORKER in gateway_workers(), "the host was left out of the gateway"
    assert pending(), "the written configuration is not marked pending for the next run"
    assert not stream.done.is_set(), "the long request ended (%s) before the forced run" % stream.error
    served_so_far = stream.chunks

    # 2. Forced: restarted at once, the cut counted, the stream ends early.
    rc, out = serve("-e", "serve_drain_timeout=4", "-e", "serve_drain_force=true", *extra_env(CHANGED_ENV))
    assert rc == 0, out[-3000:]
    assert "going on with 1 request(s) still running or waiting" in out and "1 request(s) cut" in out, out[-4000:]
    assert service_invocation() != before, "serve_drain_force did not restart the host"
    assert stream.done.wait(60), "the cut stream did not end"
    assert served_so_far <= stream.chunks < 4000 and stream.finish != "length", (stream.chunks, stream.finish)
    assert not pending()
    assert WORKER in gateway_workers()
    assert "KF_DRAIN_TEST=1" in ssh(HOST, "cat /etc/kunlun-serve/serve.env").stdout
