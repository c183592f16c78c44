"""library/serving_ready.py against a tiny in-process HTTP server (loopback, stdlib only)."""

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

import serving_ready

KEY = "sk-unit-3f9a1c77e2"
NAME = "Qwen3.8-27B-INT8-W8A8-Dynamic"


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


def exit_json(self, **kwargs):
    raise ExitJson(kwargs)


def fail_json(self, **kwargs):
    kwargs["failed"] = True
    raise FailJson(kwargs)


class Fake(object):
    """What the fake server answers; handlers read it, tests set it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.key = KEY
        self.names = [NAME]
        self.not_ready_probes = 0  # answer 503 to this many /v1/models first
        self.completion_status = 200
        self.completion_text = ["Hello", " from", " the", " sea", "."]
        self.usage = True
        self.gets = 0
        self.posts = []
        self.auth_seen = []


def make_handler(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self):
            auth = self.headers.get("Authorization", "")
            fake.auth_seen.append(auth)
            if fake.key and auth != "Bearer %s" % fake.key:
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self):
            if self.path != "/v1/models":
                return self._send(404, {"detail": "Not Found"})
            if not self._authorized():
                return None
            with fake.lock:
                fake.gets += 1
                early = fake.gets <= fake.not_ready_probes
            if early:
                return self._send(503, {"detail": "loading"})
            return self._send(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in fake.names]})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(length) or b"{}")
            if not self._authorized():
                return None
            fake.posts.append(req)
            if fake.completion_status != 200:
                return self._send(fake.completion_status, {"error": {"message": "EngineCore encountered an issue."}})
            pieces = fake.completion_text[: req.get("max_tokens", 16)]
            usage = {"prompt_tokens": 7, "completion_tokens": len(pieces), "total_tokens": 7 + len(pieces)}
            if not req.get("stream"):
                body = {"object": "text_completion", "choices": [{"index": 0, "text": "".join(pieces)}]}
                if fake.usage:
                    body["usage"] = usage
                return self._send(200, body)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(obj):
                data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

            for piece in pieces:
                chunk({"object": "text_completion", "choices": [{"index": 0, "text": piece}]})
            if fake.usage and (req.get("stream_options") or {}).get("include_usage"):
                chunk({"object": "text_completion", "choices": [], "usage": usage})
            chunk(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            return None

    return Handler


@pytest.fixture()
def fake():
    state = Fake()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = "http://127.0.0.1:%d" % server.server_address[1]
    yield state
    server.shutdown()
    server.server_close()


def run(args, check_mode=False):
    """main() with the given arguments; returns (failed, result)."""
    module_args = dict(args)
    if check_mode:
        module_args["_ansible_check_mode"] = True
    with (
        patch_module_args(module_args),
        mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json),
    ):
        with pytest.raises((ExitJson, FailJson)) as exc:
            serving_ready.main()
    return exc.type is FailJson, exc.value.args[0]


def base_args(fake, **over):
    args = {"url": fake.url, "served_model_name": NAME, "api_key": KEY, "timeout": 5, "interval": 0.05}
    args.update(over)
    return args


@pytest.fixture()
def tls_fake(tmp_path):
    """The fake server over TLS, with a certificate for 127.0.0.1 from a CA of the test (as
    a serving host's from the fleet CA): (state, the CA file)."""
    import ssl
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifacts"))
    from standin_helpers import issue_cert, make_ca

    ca = make_ca(tmp_path, "kf serving_ready test CA")
    key, cert = issue_cert(ca, tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    state = Fake()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = "https://127.0.0.1:%d" % server.server_address[1]
    yield state, str(ca["file"])
    server.shutdown()
    server.server_close()


def test_https_server_verified_with_the_ca_file_alone(tls_fake):
    state, ca_file = tls_fake
    failed, result = run(base_args(state, ca_file=ca_file))
    assert not failed and result["ready"] and result["completion_text"] == "Hello from the sea.", result
    # Without it, the system's store does not know that CA: never ready, and the reason says why.
    failed, result = run(base_args(state, timeout=1))
    assert failed and "CERTIFICATE_VERIFY_FAILED" in result["msg"], result["msg"]


def test_a_missing_ca_file_fails_naming_it_and_check_mode_reports_it(tls_fake, tmp_path):
    """The fleet CA's certificate not on the host: a real run fails at once with the file and
    the fix; check mode (a stage before it never installed it) makes its probe, answers with
    the problem, and does not fail."""
    state, _ = tls_fake
    missing = str(tmp_path / "no-such-ca.crt")
    failed, result = run(base_args(state, ca_file=missing))
    assert failed and "ca_file %s cannot be read" % missing in result["msg"], result["msg"]
    assert "install the CA certificate there first" in result["msg"] and result["probes"] == 1, result
    failed, result = run(base_args(state, ca_file=missing), check_mode=True)
    assert not failed and result["ready"] is False and "cannot be read" in result["probe_error"], result


def closed_port_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return "http://127.0.0.1:%d" % port


def test_waits_through_loading_then_streams_a_completion(fake):
    fake.not_ready_probes = 3
    failed, result = run(base_args(fake))
    assert not failed, result
    assert result["ready"] is True and result["changed"] is False
    assert result["probes"] == 4  # three 503 answers, then the list
    assert result["models"] == [NAME]
    assert result["probe_error"] is None
    assert result["completion_text"] == "Hello from the sea."
    assert result["completion_tokens"] == 5
    assert result["ttft_s"] is not None and result["ttft_s"] >= 0
    assert result["tokens_per_s"] is not None and result["tokens_per_s"] > 0
    post = fake.posts[0]
    assert post["model"] == NAME and post["stream"] is True
    assert post["stream_options"] == {"include_usage": True}
    assert post["max_tokens"] == 32
    assert set(fake.auth_seen) == {"Bearer %s" % KEY}


def test_not_streamed_completion(fake):
    failed, result = run(base_args(fake, stream=False, max_tokens=2))
    assert not failed, result
    assert result["completion_text"] == "Hello from"
    assert result["completion_tokens"] == 2
    assert result["ttft_s"] is None
    assert "stream" not in fake.posts[0]


def test_wrong_key_fails_at_once_with_401_and_no_key(fake, tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("INFO started with --api-key %s\nINFO Application startup complete.\n" % "the-real-key")
    fake.key = "the-real-key"
    failed, result = run(base_args(fake, timeout=600, log_file=str(log)))
    assert failed
    assert result["probes"] == 1  # no waiting out the budget
    assert "HTTP 401 Unauthorized" in result["msg"]
    assert "refuses the API key" in result["msg"]
    assert "Fix: pass the key the service was started with" in result["msg"]
    everything = json.dumps(result)
    assert KEY not in everything
    # the log shows what the server printed, but not the key the module was given
    assert "Application startup complete." in result["msg"]
    assert not fake.posts


def test_key_in_the_service_log_is_masked(fake, tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("args: {'api_key': ['%s']}\nERROR boom\n" % KEY)
    fake.completion_status = 500
    failed, result = run(base_args(fake, log_file=str(log)))
    assert failed
    assert "answered HTTP 500" in result["msg"]
    assert "EngineCore encountered an issue." in result["msg"]
    assert KEY not in json.dumps(result)
    assert result["log"] == ["args: {'api_key': ['********']}", "ERROR boom"]


def test_other_model_listed_fails_at_once(fake):
    fake.names = ["Qwen3.8-27B"]
    failed, result = run(base_args(fake, timeout=600))
    assert failed
    assert result["probes"] == 1
    assert "lists ['Qwen3.8-27B'] but not '%s'" % NAME in result["msg"]
    assert "served_model_name" in result["msg"]
    assert result["models"] == ["Qwen3.8-27B"]


def test_no_text_fails(fake):
    fake.completion_text = ["", "  "]
    failed, result = run(base_args(fake))
    assert failed
    assert "returned no text" in result["msg"]
    assert result["ready"] is False


def test_timeout_names_the_last_answer_and_shows_the_log_tail(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("".join("line %d\n" % i for i in range(1, 501)))
    failed, result = run(
        {
            "url": closed_port_url(),
            "served_model_name": NAME,
            "api_key": KEY,
            "timeout": 1,
            "interval": 0.2,
            "request_timeout": 2,
            "log_file": str(log),
            "log_lines": 3,
        }
    )
    assert failed
    assert "did not list '%s' within 1 s" % NAME in result["msg"]
    assert "Connection refused" in result["msg"]
    assert result["probes"] >= 2
    assert result["msg"].endswith("Last 3 lines of %s:\nline 498\nline 499\nline 500" % log)
    assert result["log"] == ["line 498", "line 499", "line 500"]
    assert "raise timeout" in result["msg"]


def test_failed_command_stops_the_wait_early(tmp_path):
    failed, result = run(
        {
            "url": closed_port_url(),
            "served_model_name": NAME,
            "timeout": 600,
            "interval": 0.05,
            "failed_command": "true",
            "log_command": "printf 'a\\nEngine core died\\n'",
        }
    )
    assert failed
    assert result["probes"] == 1
    assert "the service has failed (`true` exited 0)" in result["msg"]
    assert result["log"] == ["a", "Engine core died"]
    assert "Last 2 lines of `printf" in result["msg"]


def test_failed_command_that_says_alive_keeps_waiting(fake):
    fake.not_ready_probes = 2
    failed, result = run(base_args(fake, failed_command="false"))
    assert not failed, result
    assert result["probes"] == 3


def test_check_mode_one_probe_no_completion(fake):
    failed, result = run(base_args(fake), check_mode=True)
    assert not failed
    assert result["ready"] is True
    assert result["probes"] == 1
    assert result["completion_text"] is None
    assert fake.posts == []


def test_check_mode_server_down_does_not_fail_or_wait():
    failed, result = run({"url": closed_port_url(), "served_model_name": NAME, "timeout": 600}, check_mode=True)
    assert not failed
    assert result["ready"] is False
    assert result["probes"] == 1
    assert "Connection refused" in result["probe_error"]


def test_bad_url_is_refused():
    failed, result = run({"url": "127.0.0.1:8000", "served_model_name": NAME})
    assert failed
    assert "not an http:// or https:// URL" in result["msg"]


def test_url_with_v1_suffix_is_accepted(fake):
    failed, result = run(base_args(fake, url=fake.url + "/v1/"))
    assert not failed, result


class FakeResponse(object):
    def __init__(self, lines):
        self.stream = io.BytesIO(b"".join(lines))

    def readline(self):
        return self.stream.readline()

    def close(self):
        pass


def test_stream_figures_from_usage_and_chunk_times():
    """ttft = first text chunk - request; tok/s = (tokens - 1) / (last - first chunk)."""
    ticks = iter([10.0, 10.5, 10.6, 10.7, 10.9, 11.0])  # start, 4 text chunks, end
    lines = [b"data: %s\n\n" % json.dumps({"choices": [{"text": t}]}).encode() for t in ["a", " b", "", " c", " d"]]
    lines += [
        b"data: %s\n\n" % json.dumps({"choices": [], "usage": {"completion_tokens": 5}}).encode(),
        b"data: [DONE]\n\n",
    ]
    client = serving_ready.Client("http://x", None, 1)
    start = next(ticks)
    text, tokens, ttft, rate, took = client._read_stream(FakeResponse(lines), "u", start, lambda: next(ticks))
    assert text == "a b c d"
    assert tokens == 5  # the usage, not the 4 chunks with text
    assert ttft == pytest.approx(0.5)
    assert rate == pytest.approx(4 / 0.4)
    assert took == pytest.approx(1.0)


def test_stream_error_chunk_is_refused():
    lines = [b'data: {"error": {"message": "EngineCore encountered an issue.", "code": 500}}\n\n']
    client = serving_ready.Client("http://x", None, 1)
    with pytest.raises(serving_ready.Refused, match="streamed an error: EngineCore"):
        client._read_stream(FakeResponse(lines), "u", 0.0, lambda: 0.0)
