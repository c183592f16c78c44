"""The gateway's client keys in a real HAProxy (Debian's, the package the role installs):
the role's haproxy.cfg template and the two map files as the role writes them (0600 root),
in front of a small backend on loopback that records the Authorization and X-Kunlun-Client
headers it receives (a stand-in for the router). A team's key reaches the backend as the
fleet key with the team's name; an unknown key and no key get HAProxy's own 401 in
OpenAI's error shape; revoking a key is a new map and a graceful reload (SIGUSR2 to the
master, what Debian's unit's ExecReload sends after `haproxy -c`): the revoked key gets 401
within seconds while a stream started before the reload runs to its end."""

import http.client
import http.server
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from ansible.template import Templar, trust_as_template
from test_gateway_proxy_config import render

from plugins.filter.gateway_clients import gateway_client_map

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")

FLEET = "kf-FLEET-0123456789abcdefghijklmnopqrstuvwxyz"
TEAMS = {
    "team-a": "kf-TEAMA-0123456789abcdefghijklmnopqrstuvwx",
    "team-b": "kf-TEAMB-0123456789abcdefghijklmnopqrstuvwx",
}
STREAM_CHUNKS, STREAM_GAP = 40, 0.25  # a 10 s stream: long beside a reload, even on a loaded machine

pytestmark = [
    pytest.mark.skipif(
        HAPROXY is None, reason="no haproxy on this machine (scripts/install-system-deps.sh installs it)"
    ),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="not root: HAProxy must read the 0600 root maps, then drop privileges"
    ),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backend:
    """The router's stand-in: records each request's headers; /v1/stream sends
    STREAM_CHUNKS lines STREAM_GAP apart."""

    def __init__(self):
        self.seen = []
        backend = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                backend.seen.append(
                    {
                        "path": self.path,
                        "authorization": self.headers.get_all("Authorization"),
                        "client": self.headers.get_all("X-Kunlun-Client"),
                    }
                )
                if self.path == "/v1/stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(STREAM_CHUNKS):
                        line = ("data: %d\n\n" % i).encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        time.sleep(STREAM_GAP)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                body = json.dumps(backend.seen[-1]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def map_contents(client_keys, fleet_key, previous_key=""):
    """The two map files as roles/gateway/tasks/client_maps.yml writes them: its tasks'
    own content expressions, rendered (previous_key: the fleet key a rotation replaces)."""
    tasks = yaml.safe_load((ROOT / "roles/gateway/tasks/client_maps.yml").read_text())
    contents = [task["ansible.builtin.copy"]["content"] for task in tasks]
    assert contents[0] == "{{ gateway_client_keys | gateway_client_map(gateway_api_key, gateway_api_key_previous) }}"
    templar = Templar(variables={"gateway_api_key": fleet_key})
    return gateway_client_map(client_keys, fleet_key, previous_key), templar.template(trust_as_template(contents[1]))


def write_root_0600(path, text):
    """As the copy module replaces a file: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chown(tmp, 0, 0)
    os.replace(tmp, path)


@pytest.fixture
def proxy(tmp_path):
    backend = Backend()
    port = free_port()
    clients, internal = tmp_path / "kunlun-clients.map", tmp_path / "kunlun-internal.map"
    cfg_text = render(
        gateway_host="127.0.0.1",
        gateway_port=port,
        gateway_router_port=backend.port,
        gateway_metrics_port=free_port(),
        gateway_proxy_client_map=str(clients),
        gateway_proxy_internal_map=str(internal),
        # The role's unit drop-in raises the open-files limit for 20000; this shell's may not.
        gateway_proxy_maxconn=1000,
    )
    # The test's own: no syslog here (the log lines to stdout, where the test reads them),
    # the admin socket in the test's directory. Everything else as the role renders it:
    # chroot /var/lib/haproxy, user and group haproxy.
    assert "    log /dev/log local0 info\n" in cfg_text
    cfg_text = cfg_text.replace("    log /dev/log local0 info\n", "    log stdout format raw local0 info\n")
    cfg_text = cfg_text.replace("/run/haproxy/admin.sock", str(tmp_path / "admin.sock"))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(cfg_text)
    client_map, internal_map = map_contents(TEAMS, FLEET)
    write_root_0600(clients, client_map)
    write_root_0600(internal, internal_map)
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = open(tmp_path / "haproxy.log", "w")
    master = subprocess.Popen([HAPROXY, "-W", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 10
    while True:
        try:
            if get(port, "/health")[0] == 200:
                break
        except OSError:
            pass
        assert time.time() < deadline and master.poll() is None, (tmp_path / "haproxy.log").read_text()
        time.sleep(0.1)
    yield {
        "port": port,
        "backend": backend,
        "master": master,
        "cfg": cfg,
        "clients": clients,
        "log": tmp_path / "haproxy.log",
    }
    master.terminate()
    try:
        master.wait(10)
    except subprocess.TimeoutExpired:
        master.kill()
        master.wait()
    log.close()
    backend.close()


def get(port, path, key=None, headers=None, conn=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent = dict(headers or {})
    if key is not None:
        sent["Authorization"] = "Bearer %s" % key
    try:
        conn.request("GET", path, headers=sent)
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        if own:
            conn.close()


def worker_pids(master_pid):
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master_pid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def uid_of(pid):
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid in /proc/%d/status" % pid)


def assert_refused(status, body, headers):
    assert status == 401, body
    assert headers.get("content-type") == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key", body
    assert "Bearer" in error["message"]


def test_team_keys_reach_the_workers_as_the_fleet_key_and_others_get_haproxys_401(proxy):
    port, seen = proxy["port"], proxy["backend"].seen
    # HAProxy read the root-only maps, and its workers run as the haproxy user.
    assert {uid_of(pid) for pid in worker_pids(proxy["master"].pid)} == {pwd.getpwnam("haproxy").pw_uid}
    for name, key in dict(TEAMS, fleet=FLEET).items():
        status, body, _ = get(port, "/v1/models", key, headers={"X-Kunlun-Client": "someone-else"})
        assert status == 200, body
        assert json.loads(body)["authorization"] == ["Bearer %s" % FLEET]
        assert json.loads(body)["client"] == [name]
    # The scheme's case and extra spaces do not matter (RFC 7235); anything but Bearer does.
    status, body, _ = get(port, "/v1/models", headers={"Authorization": "bearer   %s" % TEAMS["team-b"]})
    assert status == 200 and json.loads(body)["client"] == ["team-b"]
    before = len(seen)
    for headers in (
        {},
        {"Authorization": "Bearer kf-unknown-0123456789abcdefghijklmnopqrstuvwx"},
        {"Authorization": "Basic %s" % TEAMS["team-a"]},
        {"Authorization": TEAMS["team-a"]},
        {"Authorization": "Bearer %s " % TEAMS["team-a"][:-1]},
        {"Authorization": "Bearer fleet"},
        {"Authorization": "Bearer internal"},
    ):
        assert_refused(*get(port, "/v1/chat/completions", headers=headers))
    assert len(seen) == before, "a refused request reached the backend: %s" % seen[before:]
    # /health needs no key and gets no client header.
    status, _, _ = get(port, "/health", headers={"X-Kunlun-Client": "spoofed"})
    assert status == 200 and seen[-1]["client"] is None and seen[-1]["path"] == "/health"
    # No key in the configuration HAProxy reads in clear; the log names the client only.
    assert FLEET not in proxy["cfg"].read_text()
    time.sleep(0.5)
    log = proxy["log"].read_text()
    assert "{team-a}" in log and "{fleet}" in log, log
    assert not any(key in log for key in list(TEAMS.values()) + [FLEET]), "a key in HAProxy's log"


def test_a_revoked_key_gets_401_within_seconds_and_a_stream_in_flight_finishes(proxy):
    port, master = proxy["port"], proxy["master"]
    team_a = TEAMS["team-a"]
    # A stream started before the reload, slow enough to outlive it.
    stream = {"chunks": [], "error": None}
    started = threading.Event()

    def read_stream():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/v1/stream", headers={"Authorization": "Bearer %s" % team_a})
            response = conn.getresponse()
            stream["status"] = response.status
            while True:
                line = response.readline()  # the chunked encoding decoded
                if not line:
                    break
                if line.startswith(b"data: "):
                    stream["chunks"].append(int(line.split()[1]))
                    started.set()
            stream["complete"] = response.isclosed()
        except Exception as exc:  # the assertion below says what broke
            stream["error"] = repr(exc)
        finally:
            started.set()
            conn.close()

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert started.wait(10) and stream["error"] is None, stream
    # A keep-alive connection that served team-a, idle at the reload.
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert get(port, "/v1/models", team_a, conn=idle)[0] == 200
    old_workers = worker_pids(master.pid)

    # Revoke team-a: the map the role writes without it, then the reload.
    client_map, _ = map_contents({"team-b": TEAMS["team-b"]}, FLEET)
    write_root_0600(proxy["clients"], client_map)
    check = subprocess.run([HAPROXY, "-c", "-f", str(proxy["cfg"])], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    reloaded = time.time()
    master.send_signal(signal.SIGUSR2)
    while True:
        status, body, headers = get(port, "/v1/models", team_a)
        if status == 401:
            break
        assert status == 200, body
        # A bound on a hang, not a figure (the figure is printed below): a map that was
        # not re-read would accept the key forever.
        assert time.time() - reloaded < 30, "team-a still accepted 30 s after the reload"
        time.sleep(0.05)
    refused_after = time.time() - reloaded
    # The order of events, not a time: the stream was still running when the key was refused.
    streaming_at_refusal = reader.is_alive() and not stream.get("complete")
    assert_refused(status, body, headers)
    assert get(port, "/v1/models", TEAMS["team-b"])[0] == 200
    assert get(port, "/v1/models", FLEET)[0] == 200
    # The idle keep-alive connection does not keep the old key alive: the old worker closes
    # it, or the request on it reaches the new one.
    try:
        status = get(port, "/v1/models", team_a, conn=idle)[0]
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        status = "closed"
    finally:
        idle.close()
    assert status in (401, "closed"), status

    # The stream begun before the reload was not cut: every chunk, in order.
    reader.join(STREAM_CHUNKS * STREAM_GAP + 10)
    assert not reader.is_alive()
    assert stream["error"] is None and stream["status"] == 200 and stream["complete"], stream
    assert stream["chunks"] == list(range(STREAM_CHUNKS)), stream
    # It was still running when the key was refused (the reload did not wait for it).
    assert streaming_at_refusal, refused_after
    # The old worker left once its stream had ended.
    deadline = time.time() + 10
    while set(old_workers) & set(worker_pids(master.pid)) and time.time() < deadline:
        time.sleep(0.1)
    assert not set(old_workers) & set(worker_pids(master.pid))
