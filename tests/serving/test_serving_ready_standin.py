"""serving_ready against the stand-in vllm 0.15.1 server on 127.0.0.1 (short load time),
run as a task of a real ansible-playbook on localhost."""

import urllib.request

from serving_helpers import finish, run_module, wait_for

KEY = "sk-standin-8d41b0e9c2"
NAME = "qwen38-fleet"


def wait_health(srv, budget=60.0):
    import time

    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(srv.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("stand-in not healthy:\n" + srv.log_path.read_text())


def test_waits_through_the_load_then_completes(tmp_path, standin):
    srv = standin(api_key=KEY, served_name=NAME, load_seconds=2)
    mark = tmp_path / "probed"
    # The module starts first: the server is not even started, then loads for 2 s
    # (port bound but not listening, like vllm): it has to wait through both.
    proc = run_module(
        tmp_path,
        {
            "url": srv.url,
            "served_model_name": NAME,
            "api_key": KEY,
            "timeout": 120,
            "interval": 0.5,
            "failed_command": "sh -c 'touch %s; test -s %s'" % (mark, srv.exit_path),
            "log_file": str(srv.log_path),
            "max_tokens": 8,
        },
        background=True,
    )
    wait_for(mark)
    srv.start()
    (result,), output = finish(proc)
    assert result.get("failed") is not True, output
    assert result["ready"] is True
    assert result["probes"] >= 2
    assert result["models"] == [NAME]
    assert result["probe_error"] is None
    assert result["completion_text"].strip()
    assert result["completion_tokens"] == 8
    assert result["ttft_s"] > 0
    assert result["tokens_per_s"] > 0
    assert "Application startup complete." in srv.log_path.read_text()
    assert KEY not in output


# One run, a task each (a run costs about 2.5 CPU-s; each used to be a run of its own).
def test_wrong_key_fails_with_401_and_a_server_that_dies_shows_its_log(tmp_path, standin):
    srv = standin(api_key=KEY, served_name=NAME, load_seconds=0).start()
    # 7 devices for tensor parallel 8: vllm refuses to start and exits 1.
    dying = standin(api_key=KEY, served_name=NAME, devices=7, load_seconds=2).start()
    wait_health(srv)
    wrong = "sk-wrong-5be7a9d3"
    (result, died), output = run_module(
        tmp_path,
        {
            "url": srv.url,
            "served_model_name": NAME,
            "api_key": wrong,
            "timeout": 600,
            "log_file": str(srv.log_path),
            "log_lines": 5,
        },
        {
            "url": dying.url,
            "served_model_name": NAME,
            "api_key": KEY,
            "timeout": 600,
            "interval": 0.5,
            "failed_command": dying.failed_command(),
            "log_file": str(dying.log_path),
        },
    )
    assert result["failed"] is True
    assert result["probes"] == 1
    assert "answered HTTP 401 Unauthorized" in result["msg"]
    assert "refuses the API key" in result["msg"]
    # The service log's tail comes with the message (the 401 access line itself may be
    # written just after the module read the file, so it is not asserted).
    assert "Application startup complete." in result["msg"]
    assert wrong not in output and KEY not in output
    assert result["invocation"]["module_args"]["api_key"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"

    assert died["failed"] is True
    assert "the service has failed (`test -s" in died["msg"]
    assert "Connection refused" in died["msg"]
    assert "World size (8) is larger than the number of available GPUs (7)" in died["msg"]
    assert any("World size (8)" in line for line in died["log"])


# Check mode (one probe, no completion, never a failure, the server down): the module's
# own test, tests/unit/test_serving_ready.py::test_check_mode_server_down_does_not_fail_or_wait,
# and through the stages, the e2e's --check run of site.yml.
