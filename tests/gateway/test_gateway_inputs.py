"""The gateway stage refuses bad input on the controller, before any host is contacted;
the worker URLs the router lists and the drain's are the same."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_playbook(inventory, playbook, tmp_path, *extra):
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
    )
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), str(ROOT / playbook), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def inventory(tmp_path):
    dest = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventories/example", dest)
    return dest


def test_empty_gateways_group_is_refused(inventory, tmp_path):
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["gateways"]["hosts"] = {}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    rc, out = run_playbook(inventory, "playbooks/gateway.yml", tmp_path)
    assert rc != 0, out
    assert "the gateways group has no hosts: add one in hosts.yml" in out, out[-3000:]
    assert "gw-01" not in out


def test_missing_api_key_is_refused_before_hosts(inventory, tmp_path):
    # The example inventory has no vault: the key check fails on the controller first.
    rc, out = run_playbook(inventory, "playbooks/gateway.yml", tmp_path, "-e", "vault_kunlun_api_key=")
    assert rc != 0, out
    assert "No API key for the fleet" in out and "the gateway (its workers check it) needs it" in out, out[-3000:]
    assert "kunlun-fleet api-key" in out
    assert "Install | " not in out


def run_controller_step(inventory, tmp_path, msg, *extra):
    """The gateway role's controller step on gw-01, then a debug task printing ``msg``."""
    play = tmp_path / "controller.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "controller",
                    "hosts": "gw-01",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "controller",
                            "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "controller"},
                            "vars": {"gateway_install_from": "index", "vault_kunlun_api_key": "k" * 20},
                        },
                        {"name": "after", "ansible.builtin.debug": {"msg": msg}},
                    ],
                }
            ]
        )
    )
    return run_playbook(inventory, str(play), tmp_path, *extra)


def router_worker_urls(inventory, tmp_path, *extra):
    """The worker list the gateway stage writes into the router's unit (gateway_worker_urls)."""
    # Comma-joined: no space, so the output callback never wraps the line.
    rc, out = run_controller_step(inventory, tmp_path, "URLS={{ gateway_worker_urls | join(',') }}", *extra)
    assert rc == 0, out[-3000:]
    return out.split("URLS=", 1)[1].split("\n", 1)[0].strip().strip("'").split(",")


# The sim bundle's wheelhouse (the router and its dependencies, listed in the manifest):
# tests/artifacts/test_bundle.py::test_bundle_wheelhouse_holds_the_router_and_its_dependencies,
# on the bundle that file builds anyway; installed from it offline by the gateway scenario's
# converge (molecule/gateway) and the e2e, which use the sim bundle (gateway_install_from: bundle).


class RecordingRouter:
    """The router's admin API as the worker entry point uses it (list, remove, add, and the
    per-worker in-flight gauge on /metrics), on 127.0.0.1, recording every change."""

    def __init__(self, urls):
        import http.server
        import json
        import threading
        import urllib.parse

        self.urls, self.calls = list(urls), []
        router = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, body, kind="application/json"):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/list_workers":
                    self.reply(200, json.dumps({"urls": router.urls}))
                elif self.path == "/metrics":
                    self.reply(
                        200,
                        "".join('vllm_router_running_requests{worker="%s"} 0\n' % u for u in router.urls),
                        "text/plain",
                    )
                else:
                    self.reply(404, "{}")

            def do_POST(self):
                parsed = urllib.parse.urlparse(self.path)
                url = urllib.parse.parse_qs(parsed.query).get("url", [""])[0]
                router.calls.append((parsed.path, url))
                if parsed.path == "/remove_worker" and url in router.urls:
                    router.urls.remove(url)
                    self.reply(200, "{}")
                elif parsed.path == "/add_worker" and url not in router.urls:
                    router.urls.append(url)
                    self.reply(200, "{}")
                else:
                    self.reply(400, "{}")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_rollout_drains_the_worker_the_router_lists(inventory, tmp_path):
    """The router's workers: every xpu_servers host at https://<ansible_host>:<serving port>,
    the host name when it has no ansible_host, and a host whose ansible_host is a management
    name and whose serving address is set apart (kunlun_stack_serving_address) at the
    serving address. The rollout's drain (serve -> gateway worker entry point) removes
    exactly that URL and puts it back. With the address worked out in two places, the drain
    asked the router to remove a URL it never listed, and the host kept receiving requests
    while it restarted."""
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["xpu_servers"]["hosts"]["p800-a02"] = {"ansible_host": "p800-a02.mgmt.example"}
    hosts["all"]["children"]["xpu_servers"]["hosts"]["p800-a04"] = None
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    vars_file = inventory / "host_vars/p800-a02.yml"
    host_vars = yaml.safe_load(vars_file.read_text()) if vars_file.exists() else {}
    host_vars["kunlun_stack_serving_address"] = "10.30.1.12"
    vars_file.write_text(yaml.safe_dump(host_vars))
    local = ["-e", "ansible_connection=local", "-e", "ansible_python_interpreter=%s" % sys.executable]

    listed = router_worker_urls(inventory, tmp_path, *local)
    # https: the workers serve TLS with the fleet CA (kunlun_stack_serving_tls, docs/gateway.md).
    assert listed == [
        "https://10.20.1.11:8000",
        "https://10.30.1.12:8000",
        "https://10.20.1.13:8000",
        "https://p800-a04:8000",
    ], listed

    router = RecordingRouter(listed)
    try:
        drain = tmp_path / "drain.yml"
        drain.write_text(
            yaml.safe_dump(
                [
                    {
                        "name": "drain",
                        "hosts": "p800-a02",
                        "gather_facts": False,
                        "vars": {"gateway_router_port": router.port, "gateway_metrics_port": router.port},
                        "tasks": [
                            {
                                "name": "out",
                                "ansible.builtin.include_role": {"name": "serve", "tasks_from": "gateway_worker"},
                                "vars": {"serve_gateway_worker_state": "absent"},
                            },
                            {
                                "name": "back",
                                "ansible.builtin.include_role": {"name": "serve", "tasks_from": "gateway_worker"},
                                "vars": {"serve_gateway_worker_state": "present"},
                            },
                        ],
                    }
                ]
            )
        )
        rc, out = run_playbook(inventory, str(drain), tmp_path, *local)
    finally:
        router.close()
    assert rc == 0, out[-3000:]
    assert router.calls == [
        ("/remove_worker", "https://10.30.1.12:8000"),
        ("/add_worker", "https://10.30.1.12:8000"),
    ], (
        router.calls,
        out[-3000:],
    )
    assert sorted(router.urls) == sorted(listed)


OPEN_ENDPOINTS = {
    "router-not-on-loopback": ({"gateway_router_host": "0.0.0.0"}, "gateway_router_host 0.0.0.0 and"),
    "metrics-not-on-loopback": (
        {"gateway_metrics_host": "10.20.1.11"},
        "gateway_metrics_host 10.20.1.11 must be loopback addresses",
    ),
    "router-on-the-public-port": ({"gateway_router_port": 8080}, "gateway_port 8080, gateway_router_port 8080"),
    "metrics-on-the-router-port": ({"gateway_metrics_port": 8081}, "gateway_metrics_port 8081 must differ"),
    "certificate-without-key": (
        {"gateway_tls_cert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"},
        "gateway_tls_cert and gateway_tls_key must be given together",
    ),
}


def test_an_open_endpoint_is_refused_on_the_controller(inventory, tmp_path):
    """Settings that would open the router's unauthenticated admin API or its metrics to
    the network, or give the proxy half a TLS pair: each refused by the controller step,
    naming the variable and its value, before any host is contacted. One run (each case
    used to be a run of its own, about 2 CPU-s): a block per case, the controller step then
    a marker that must not be reached, its refusal caught and printed by the rescue."""
    import json

    tasks = [
        {
            "name": "case %s" % case,
            "block": [
                {
                    "name": "controller %s" % case,
                    "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "controller"},
                    "vars": dict(setting, gateway_install_from="index", vault_kunlun_api_key="k" * 20),
                },
                {"name": "after %s" % case, "ansible.builtin.debug": {"msg": "REACHED %s" % case}},
            ],
            "rescue": [
                {
                    "name": "refused %s" % case,
                    "ansible.builtin.debug": {"msg": "REFUSED %s: {{ ansible_failed_result.msg }}" % case},
                }
            ],
        }
        for case, (setting, _) in OPEN_ENDPOINTS.items()
    ]
    play = tmp_path / "open.yml"
    play.write_text(json.dumps([{"name": "open", "hosts": "gw-01", "gather_facts": False, "tasks": tasks}]))
    rc, out = run_playbook(inventory, str(play), tmp_path)
    assert rc == 0, out[-3000:]
    text = " ".join(out.split())
    for case, (_, shown) in OPEN_ENDPOINTS.items():
        assert "REFUSED %s: " % case in text, (case, out[-3000:])
        refusal = text.split("REFUSED %s: " % case, 1)[1].split(" REFUSED ", 1)[0]
        assert "cannot make a closed endpoint" in refusal and shown in refusal, (case, out[-3000:])
        assert "Nothing was changed. Fix the variables in the inventory." in refusal, (case, out[-3000:])
        assert "REACHED %s" % case not in out, (case, out[-3000:])
    assert "k" * 20 not in out
