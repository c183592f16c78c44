"""library/gateway_worker.py against a router on 127.0.0.1: first a replica of vllm-router's
admin API and metrics (stdlib http.server, in threads), then (slow tier) the real vllm-router
of the pin, kunlun_stack_gateway_router, installed from the sim's wheelhouse, in front of
stand-in workers.

What the replica answers is vllm-router 0.1.17's, as run from the pinned wheel (the real
router tests below replay the same requests against it and compare) and as its source says
(github.com/vllm-project/router, src/server.rs `add_worker`/`remove_worker`/`list_workers`,
src/routers/http/router.rs `Router::add_worker`/`Router::remove_worker`):

- GET /list_workers: 200, JSON {"urls": [...]}.
- POST /add_worker?url=U: answered only once U/health answers (the router polls it up to its
  --worker-startup-timeout-secs); then 200 text "Successfully added worker: U", or 400 text
  "Worker U already exists" when it is listed; after the timeout 400 "Timeout Ns waiting for
  worker U to become healthy. ...".
- POST /remove_worker?url=U: 200 "Successfully removed worker: U" whether or not U was listed
  (Router::remove_worker only logs "not found").
- A GET of either POST route: 405; no url query: 400.
- Its Prometheus port: the gauge vllm_router_running_requests{worker="U"} N, the requests routed
  to U that have not ended, kept for U after its removal until they end (and 0 after); no line
  for a worker no request was routed to yet."""

import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

import gateway_worker
from module_docs import documented_spec

ROOT = Path(__file__).resolve().parents[2]
W1, W2 = "http://10.20.1.11:8000", "http://10.20.1.12:8000"
STARTUP_TIMEOUT_TEXT = (
    "Timeout %ds waiting for worker %s to become healthy. Please set --router-worker-startup-timeout-secs "
    "(vllm_router.launch_server) or --worker-startup-timeout-secs (vllm_worker.router) to a larger value"
)


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


def serve(handler_class):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


class ReplicaRouter:
    """vllm-router's admin API (one port) and its metrics (another), as the module docstring
    says, with what a test scripts: the workers whose /health answers (`healthy`, None: all),
    the gauge's successive readings per worker (`gauge`: the last one repeats), another run's
    change that lands just before ours (`race`) or just after a removal (`then`), a slow
    /add_worker (`add_delay`)."""

    def __init__(self, urls, startup_timeout=0.3):
        self.urls = list(urls)
        self.healthy = None
        self.startup_timeout = startup_timeout
        self.gauge = {}
        self.race = None
        self.then = None
        self.add_delay = 0.0
        self.posts, self.metric_reads = [], 0
        self.lock = threading.Lock()
        router = self

        class Admin(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, code, body, kind="text/plain; charset=utf-8"):
                data = body.encode()
                self.send_response(code)
                if data:
                    self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path = urllib.parse.urlsplit(self.path).path
                if path == "/list_workers":
                    with router.lock:
                        return self.reply(200, json.dumps({"urls": router.urls}), "application/json")
                if path in ("/add_worker", "/remove_worker"):
                    return self.reply(405, "")
                return self.reply(404, "")

            def do_POST(self):
                parts = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(parts.query)
                with router.lock:
                    router.posts.append((parts.path, query.get("url", [None])[0]))
                if parts.path not in ("/add_worker", "/remove_worker"):
                    return self.reply(404, "")
                if "url" not in query:
                    return self.reply(400, "Failed to deserialize query string: missing field `url`")
                url = query["url"][0]
                if router.race:
                    router.race()
                if parts.path == "/remove_worker":
                    with router.lock:
                        if url in router.urls:
                            router.urls.remove(url)
                    if router.then:
                        router.then()
                    return self.reply(200, "Successfully removed worker: %s" % url)
                time.sleep(router.add_delay)
                if router.healthy is not None and url not in router.healthy:
                    time.sleep(router.startup_timeout)
                    return self.reply(400, STARTUP_TIMEOUT_TEXT % (int(router.startup_timeout), url))
                with router.lock:
                    if url in router.urls:
                        return self.reply(400, "Worker %s already exists" % url)
                    router.urls.append(url)
                return self.reply(200, "Successfully added worker: %s" % url)

        class Metrics(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with router.lock:
                    router.metric_reads += 1
                    lines = [
                        "# TYPE vllm_router_active_workers gauge",
                        "vllm_router_active_workers %d" % len(router.urls),
                    ]
                    lines.append("# TYPE vllm_router_running_requests gauge")
                    for url, readings in router.gauge.items():
                        value = readings.pop(0) if len(readings) > 1 else readings[0]
                        lines.append('vllm_router_running_requests{worker="%s"} %s' % (url, value))
                data = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("content-type", "text/plain; version=0.0.4")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.admin, self.metrics = serve(Admin), serve(Metrics)
        self.url = "http://127.0.0.1:%d" % self.admin.server_address[1]
        self.metrics_url = "http://127.0.0.1:%d/metrics" % self.metrics.server_address[1]

    def close(self):
        for server in (self.admin, self.metrics):
            server.shutdown()
            server.server_close()


@pytest.fixture
def router():
    r = ReplicaRouter([W1, W2])
    yield r
    r.close()


def run(args, check_mode=False, diff=False):
    """main() with the given arguments: (failed, result, warnings)."""
    module_args = dict(args)
    if check_mode:
        module_args["_ansible_check_mode"] = True
    if diff:
        module_args["_ansible_diff"] = True
    warnings = []

    def exit_json(self, **kwargs):
        raise ExitJson(kwargs)

    def fail_json(self, **kwargs):
        kwargs["failed"] = True
        raise FailJson(kwargs)

    def warn(self, warning, **kwargs):
        warnings.append(warning)

    with (
        patch_module_args(module_args),
        mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json, warn=warn),
    ):
        with pytest.raises((ExitJson, FailJson)) as exc:
            gateway_worker.main()
    return exc.type is FailJson, exc.value.args[0], warnings


def args(router, url, state, **over):
    a = {"url": url, "state": state, "router_url": router.url, "metrics_url": router.metrics_url}
    a.update({"drain_interval": 0.05, "request_timeout": 5})
    a.update(over)
    return a


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]


# --------------------------------------------------------------------------- the replica


def test_documentation_matches_the_argument_spec(monkeypatch):
    doc, spec = documented_spec(monkeypatch, gateway_worker)
    assert spec["state"]["choices"] == doc["options"]["state"]["choices"] == ["absent", "present"]
    assert doc["options"]["timeout"]["default"] == 120 and doc["options"]["drain_timeout"]["default"] == 900


def test_add_when_absent_changes_and_the_router_lists_it(router):
    new = "http://10.20.1.13:8000"
    failed, result, _ = run(args(router, new, "present"))
    assert not failed, result
    assert result["changed"] is True and result["answering"] is True and result["action"] == "add"
    assert router.posts == [("/add_worker", new)]
    assert router.urls == [W1, W2, new] and result["workers"] == router.urls
    assert result["workers_before"] == [W1, W2]
    assert result["router_answer"] == "Successfully added worker: %s" % new
    assert result["msg"] == "added %s to %s" % (new, router.url)


def test_add_when_listed_posts_nothing_and_changes_nothing(router):
    failed, result, _ = run(args(router, W1, "present"))
    assert not failed and result["changed"] is False and result["action"] is None
    assert router.posts == []
    assert result["msg"] == "%s was already in on %s" % (W1, router.url)


def test_a_longer_url_with_the_worker_s_as_prefix_is_another_worker(router):
    router.urls = [W1 + "0"]
    failed, result, _ = run(args(router, W1, "present"))
    assert not failed and result["changed"] is True
    assert router.urls == [W1 + "0", W1]


def test_remove_changes_then_waits_for_the_gauge_to_reach_zero(router):
    router.gauge = {W2: [2, 2, 1, 0], W1: [5]}
    failed, result, warnings = run(args(router, W2, "absent"))
    assert not failed, result
    assert result["changed"] is True and result["action"] == "remove"
    assert router.posts == [("/remove_worker", W2)] and router.urls == [W1]
    assert result["workers"] == [W1]
    # four reads: 2, 2, 1 (W1's 5 is another worker's), then 0
    assert router.metric_reads == 4 and result["in_flight"] == 0
    assert result["msg"].startswith("removed %s from %s; no request left in flight to it" % (W2, router.url))
    assert warnings == []


def test_remove_when_already_out_posts_nothing_but_still_waits(router):
    """An earlier run took it out and failed its drain: a run again waits for what is left."""
    router.urls = [W1]
    router.gauge = {W2: [1, 0]}
    failed, result, _ = run(args(router, W2, "absent"))
    assert not failed and result["changed"] is False
    assert router.posts == [] and router.metric_reads == 2 and result["in_flight"] == 0


def test_no_gauge_line_for_the_worker_reads_zero(router):
    failed, result, _ = run(args(router, W2, "absent"))
    assert not failed and result["changed"] is True and result["in_flight"] == 0 and router.metric_reads == 1


def test_drain_timeout_zero_reads_no_metrics(router):
    """The serve role's rollout waits on the server's own count instead (gateway_drain_timeout 0)."""
    router.gauge = {W2: [3]}
    failed, result, _ = run(args(router, W2, "absent", drain_timeout=0, metrics_url=None))
    assert not failed and result["changed"] is True
    assert router.metric_reads == 0 and result["in_flight"] is None


def test_drain_out_of_time_fails_naming_the_worker_and_the_fix(router):
    router.gauge = {W2: [2]}
    failed, result, _ = run(args(router, W2, "absent", drain_timeout=1, drain_interval=0.1))
    assert failed
    msg = result["msg"]
    assert "%s still had 2 request(s) in flight through the gateway %s after 1 s of drain" % (W2, router.url) in msg
    assert "out of this gateway's worker list" in msg
    assert "gateway_drain_timeout" in msg and "gateway_drain_timeout_fails: false" in msg
    # It was taken out before the wait: the failure reports the change.
    assert result["changed"] is True and router.urls == [W1]
    # It waited, reading the gauge again (how often depends on the machine's load: not counted).
    assert router.metric_reads >= 2 and result["drain_waited_s"] >= 1


def test_drain_out_of_time_warns_and_goes_on_when_it_may(router):
    router.gauge = {W2: [2]}
    failed, result, warnings = run(
        args(router, W2, "absent", drain_timeout=1, drain_interval=0.1, drain_timeout_fails=False)
    )
    assert not failed and result["changed"] is True and result["in_flight"] == 2
    assert len(warnings) == 1 and "%s still had 2 request(s) in flight" % W2 in warnings[0]
    assert "those requests may be cut" in warnings[0]
    assert result["msg"].endswith("2 request(s) still in flight after 1 s, going on")


def test_metrics_that_do_not_answer_end_the_wait_with_a_warning(router):
    failed, result, warnings = run(args(router, W2, "absent", metrics_url=closed_port_url() + "/metrics"))
    assert not failed and result["changed"] is True
    assert len(warnings) == 1 and "metrics did not answer" in warnings[0]


@pytest.mark.parametrize("state", ["absent", "present"])
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_gateway_that_does_not_answer_is_left_alone(state, check_mode):
    down = closed_port_url()
    failed, result, warnings = run(
        {"url": W1, "state": state, "router_url": down, "metrics_url": down + "/metrics"}, check_mode=check_mode
    )
    assert not failed, result
    assert result["changed"] is False and result["answering"] is False and result["workers"] == []
    assert result["msg"].startswith(
        "no gateway answers at %s (not installed or not running: GET %s/list_workers" % (down, down)
    )
    assert result["msg"].endswith("%s left as it is there" % W1)
    assert warnings == []


def test_something_else_on_the_port_counts_as_no_gateway():
    class Other(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("content-length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

    server = serve(Other)
    try:
        url = "http://127.0.0.1:%d" % server.server_address[1]
        failed, result, _ = run({"url": W1, "state": "present", "router_url": url})
    finally:
        server.shutdown()
        server.server_close()
    assert not failed and result["answering"] is False and "not JSON" in result["msg"]


def test_a_list_without_urls_fails_and_says_so(router):
    class NoUrls(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            data = b'{"workers": []}'
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = serve(NoUrls)
    try:
        url = "http://127.0.0.1:%d" % server.server_address[1]
        failed, result, _ = run({"url": W1, "state": "absent", "router_url": url, "drain_timeout": 0})
    finally:
        server.shutdown()
        server.server_close()
    assert failed and "answered without a list of urls" in result["msg"] and "vllm-router's admin API" in result["msg"]


def test_add_race_400_already_exists_changes_nothing(router):
    new = "http://10.20.1.13:8000"

    def other_run():
        with router.lock:
            if new not in router.urls:
                router.urls.append(new)

    router.race = other_run
    failed, result, _ = run(args(router, new, "present"))
    assert not failed, result
    assert result["changed"] is False and router.posts == [("/add_worker", new)]
    assert result["router_answer"] == "Worker %s already exists" % new
    assert "added by another run first" in result["msg"]
    assert result["workers"] == [W1, W2, new]


def test_remove_race_the_router_no_longer_lists_it_and_it_ends_out(router):
    """/remove_worker answers 200 whether or not it listed the worker: what matters is that
    the worker ends out of the list, as wanted; the run does not fail."""

    def other_run():
        with router.lock:
            if W2 in router.urls:
                router.urls.remove(W2)

    router.race = other_run
    failed, result, _ = run(args(router, W2, "absent", drain_timeout=0))
    assert not failed and router.urls == [W1] and result["workers"] == [W1]
    # Listed before, out after: the list changed, by this run or the other (the router's
    # answer cannot tell them apart).
    assert result["changed"] is True


def test_a_worker_still_listed_after_its_removal_fails(router):
    """/remove_worker's 200 says nothing: the list read again does."""

    def other_run_adds_it_back():
        with router.lock:
            router.urls.append(W2)

    router.then = other_run_adds_it_back
    failed, result, _ = run(args(router, W2, "absent"))
    assert failed and "answered POST /remove_worker for %s with 200" % W2 in result["msg"]
    assert "but still lists it" in result["msg"] and router.metric_reads == 0


def test_an_unhealthy_worker_is_refused_with_the_router_s_answer(router):
    router.healthy = {W1, W2}
    new = "http://10.20.1.13:8000"
    failed, result, _ = run(args(router, new, "present"))
    assert failed and result["changed"] is False
    assert "answered POST /add_worker for %s with HTTP 400: Timeout 0s waiting for worker" % new in result["msg"]
    assert "its /health answers from this gateway host" in result["msg"]
    assert router.urls == [W1, W2]


def test_add_without_an_answer_in_time_fails_and_says_why(router):
    router.add_delay = 2
    failed, result, _ = run(args(router, "http://10.20.1.13:8000", "present", timeout=0.5))
    assert failed and "then the POST got no answer" in result["msg"]
    assert "/add_worker only once http://10.20.1.13:8000/health answers" in result["msg"]


@pytest.mark.parametrize(
    "state, url, changed",
    [
        ("present", "http://10.20.1.13:8000", True),
        ("present", W1, False),
        ("absent", W2, True),
        ("absent", "http://10.20.1.13:8000", False),
    ],
)
def test_check_mode_predicts_what_a_real_run_does_and_posts_nothing(router, state, url, changed):
    router.gauge = {W2: [2]}
    failed, result, _ = run(args(router, url, state), check_mode=True)
    assert not failed, result
    assert result["changed"] is changed
    assert router.posts == [] and router.metric_reads == 0 and router.urls == [W1, W2]
    # a real run on the same router agrees
    router.gauge = {W2: [0]}
    _, real, _ = run(args(router, url, state))
    assert real["changed"] is changed and real["workers"] == result["workers"]


def test_check_mode_says_what_it_would_do(router):
    _, result, _ = run(args(router, W2, "absent"), check_mode=True)
    assert result["msg"] == "would remove %s on %s; check mode: the drain is not waited for" % (W2, router.url)
    assert result["workers"] == [W1] and result["workers_before"] == [W1, W2]


def test_diff_shows_the_list_before_and_after(router):
    new = "http://10.20.1.13:8000"
    _, predicted, _ = run(args(router, new, "present"), check_mode=True, diff=True)
    assert predicted["diff"]["before"] == "%s\n%s\n" % (W1, W2)
    assert predicted["diff"]["after"] == "%s\n%s\n%s\n" % (W1, W2, new)
    assert predicted["diff"]["before_header"] == router.url + "/list_workers"
    _, real, _ = run(args(router, W1, "absent", drain_timeout=0), diff=True)
    assert real["diff"]["before"] == "%s\n%s\n" % (W1, W2) and real["diff"]["after"] == "%s\n" % W2
    _, none, _ = run(args(router, W2, "present"), diff=True)
    assert none["diff"]["before"] == none["diff"]["after"] == "%s\n" % W2


@pytest.mark.parametrize(
    "url, why",
    [
        ("", "is empty"),
        ("10.20.1.11:8000", "not an http:// or https:// URL"),
        ("ftp://10.20.1.11:8000", "not an http:// or https:// URL"),
        ("http://10.20.1.11:8000/", "has a path"),
        ("http://10.20.1.11:8000/v1", "has a path"),
        ("http://10.20.1.11:8000?x=1", "has a path, query"),
        ("http://10.20.1.11", "has no port"),
        ("http://user@10.20.1.11:8000", "has a user part"),
        ("http://10.20.1.11:80000", "does not parse"),
        ("http://10.20.1.11 :8000", "holds a space"),
    ],
)
def test_a_malformed_worker_url_is_refused_before_any_request(router, url, why):
    failed, result, _ = run(args(router, url, "absent"))
    assert failed and why in result["msg"], result["msg"]
    assert "Fix: give the worker's URL as the gateways list it, http://<address>:<port>" in result["msg"]
    assert router.posts == [] and router.metric_reads == 0


def test_https_and_ipv6_worker_urls_are_accepted(router):
    for url in ("https://gpu-7.example:8443", "http://[fd00::7]:8000"):
        failed, result, _ = run(args(router, url, "present"))
        assert not failed and result["changed"] is True, result
    assert router.posts == [("/add_worker", "https://gpu-7.example:8443"), ("/add_worker", "http://[fd00::7]:8000")]


def test_a_drain_without_metrics_url_is_refused(router):
    failed, result, _ = run(args(router, W2, "absent", metrics_url=None))
    assert failed and "metrics_url is not set" in result["msg"] and "drain_timeout: 0" in result["msg"]
    assert router.posts == []


def test_the_gauge_is_read_for_that_worker_only():
    text = "\n".join(
        [
            "# HELP vllm_router_running_requests Number of running requests per worker",
            "# TYPE vllm_router_running_requests gauge",
            'vllm_router_running_requests{worker="%s"} 2' % W1,
            'vllm_router_running_requests{worker="%s0"} 7' % W1,
            'vllm_router_running_requests{model="m",worker="%s"} 1.5' % W1,
            'vllm_router_running_requests_total{worker="%s"} 9' % W1,
            'vllm_router_processed_requests_total{worker="%s"} 11' % W1,
            'vllm_router_running_requests{worker="%s"} 4' % W2,
        ]
    )
    assert gateway_worker.running_requests(text, W1) == 3.5
    assert gateway_worker.running_requests(text, W2) == 4
    assert gateway_worker.running_requests(text, "http://10.20.1.13:8000") == 0


# --------------------------------------------------------------------------- the real router


class StandInWorker:
    """A vllm worker as the router sees it: /health, and completions held until released."""

    def __init__(self):
        self.release = threading.Event()
        self.release.set()
        self.served = 0
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    return self.reply(200, {})
                return self.reply(404, {"detail": "Not Found"})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                worker.release.wait(60)
                worker.served += 1
                self.reply(200, {"object": "text_completion", "choices": [{"index": 0, "text": "x"}]})

        self.server = serve(Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


def request(method, url, timeout=30):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def real_router(tmp_path_factory):
    """The pinned vllm-router from the sim's wheelhouse, in a venv of the tests' own Python
    (kunlun_fleet.sim.testing.router_venv), on loopback in front of two stand-in workers."""
    from kunlun_fleet.sim.testing import router_venv

    venv = tmp_path_factory.mktemp("router") / "venv"
    router = router_venv(venv)
    workers = [StandInWorker(), StandInWorker()]
    port, metrics = free_port(), free_port()
    log = open(venv.parent / "router.log", "w")
    proc = subprocess.Popen(
        [router, "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
         "--worker-urls", *[w.url for w in workers], "--policy", "power_of_two",
         "--health-check-interval-secs", "1", "--worker-startup-timeout-secs", "2",
         "--worker-startup-check-interval", "1", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, NO_PROXY="*"),
    )  # fmt: skip
    url = "http://127.0.0.1:%d" % port
    deadline = time.monotonic() + 60
    while True:
        try:
            if get(url + "/list_workers")[0] == 200:
                break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (venv.parent / "router.log").read_text()
        time.sleep(0.3)
    yield {"url": url, "metrics_url": "http://127.0.0.1:%d/metrics" % metrics, "workers": workers}
    proc.terminate()
    proc.wait(10)
    log.close()
    for w in workers:
        w.close()


def admin_answers(base, w1, w2, dead):
    """The admin API's answers to one sequence of requests, worker URLs shown as W1/W2/DEAD."""
    names = {w1: "W1", w2: "W2", dead: "DEAD"}

    def shown(text):
        for url, name in names.items():
            text = text.replace(url, name)
        return text

    def listed():
        status, body = get(base + "/list_workers")
        return status, sorted(names.get(u, u) for u in json.loads(body)["urls"])

    q = urllib.parse.quote
    steps = [
        listed(),
        request("POST", base + "/remove_worker?url=" + q(w2, safe="")),
        listed(),
        request("POST", base + "/remove_worker?url=" + q(w2, safe="")),
        request("POST", base + "/add_worker?url=" + q(w2, safe="")),
        request("POST", base + "/add_worker?url=" + q(w2, safe="")),
        request("POST", base + "/add_worker?url=" + q(dead, safe="")),
        request("GET", base + "/add_worker?url=" + q(w2, safe="")),
        request("POST", base + "/add_worker"),
        listed(),
    ]
    return [(status, shown(body) if isinstance(body, str) else body) for status, body in steps]


@pytest.mark.slow
@pytest.mark.network
def test_the_replica_answers_as_the_real_router(real_router):
    w1, w2 = (w.url for w in real_router["workers"])
    dead = closed_port_url()
    real = admin_answers(real_router["url"], w1, w2, dead)
    replica = ReplicaRouter([w1, w2], startup_timeout=2)
    replica.healthy = {w1, w2}
    try:
        assert admin_answers(replica.url, w1, w2, dead) == real
    finally:
        replica.close()
    assert real[1] == (200, "Successfully removed worker: W2")
    assert real[3] == (200, "Successfully removed worker: W2")  # not listed: 200 all the same
    assert real[5] == (400, "Worker W2 already exists")
    assert real[6][0] == 400 and real[6][1].startswith("Timeout 2s waiting for worker DEAD to become healthy")
    assert real[7][0] == 405 and real[8][0] == 400


@pytest.mark.slow
@pytest.mark.network
def test_against_the_real_router_predict_change_and_drain_in_flight_requests(real_router):
    base, metrics = real_router["url"], real_router["metrics_url"]
    fast, slow = real_router["workers"]
    common = {"router_url": base, "metrics_url": metrics, "drain_interval": 0.2, "request_timeout": 5}

    # Only the slow worker takes requests.
    failed, result, _ = run(dict(common, url=fast.url, state="absent", drain_timeout=0))
    assert not failed and result["changed"] is True, result
    failed, result, _ = run(dict(common, url=fast.url, state="absent", drain_timeout=0))
    assert not failed and result["changed"] is False, result
    # Check mode predicts the add from the real list, and changes nothing.
    failed, result, _ = run(dict(common, url=fast.url, state="present"), check_mode=True, diff=True)
    assert not failed and result["changed"] is True and result["action"] == "add"
    assert fast.url not in json.loads(get(base + "/list_workers")[1])["urls"]
    assert fast.url in result["diff"]["after"] and fast.url not in result["diff"]["before"]

    # Two requests held by the slow worker: the router's gauge for it reads 2.
    slow.release.clear()
    answers = []
    senders = [
        threading.Thread(target=lambda i=i: answers.append(post_completion(base, "drain %d" % i))) for i in range(2)
    ]
    for t in senders:
        t.start()
    deadline = time.monotonic() + 20
    while gateway_worker.running_requests(get(metrics)[1], slow.url) < 2:
        assert time.monotonic() < deadline, get(metrics)[1]
        time.sleep(0.1)

    # Out of time with them in flight: fails, naming the worker and the fix; it is out.
    failed, result, _ = run(dict(common, url=slow.url, state="absent", drain_timeout=1))
    assert failed and "%s still had 2 request(s) in flight" % slow.url in result["msg"], result
    assert "gateway_drain_timeout_fails: false" in result["msg"] and result["changed"] is True
    assert slow.url not in json.loads(get(base + "/list_workers")[1])["urls"]

    # Run again: nothing to remove, it waits; the worker finishes them 1.5 s in.
    threading.Timer(1.5, slow.release.set).start()
    failed, result, _ = run(dict(common, url=slow.url, state="absent", drain_timeout=30))
    assert not failed and result["changed"] is False and result["in_flight"] == 0, result
    assert result["drain_waited_s"] >= 1
    for t in senders:
        t.join(10)
    assert sorted(a[0] for a in answers) == [200, 200] and slow.served == 2

    # Both back; a second restore changes nothing.
    for w in (fast, slow):
        failed, result, _ = run(dict(common, url=w.url, state="present"))
        assert not failed and result["changed"] is True and result["router_answer"].startswith("Successfully added")
    failed, result, _ = run(dict(common, url=slow.url, state="present"))
    assert not failed and result["changed"] is False
    assert sorted(json.loads(get(base + "/list_workers")[1])["urls"]) == sorted([fast.url, slow.url])


def post_completion(base, prompt):
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(
        base + "/v1/completions", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
