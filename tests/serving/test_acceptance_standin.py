"""The acceptance role's judgement against the stand-in vllm server on 127.0.0.1: a
server slower than the single-stream target gets a FAIL line, and the run fails when
acceptance_fail_on_miss is set (the default); a server far above the target gets a PASS
line. The stand-ins are paced far from the target (10 and 2000 tok/s against 30), so a
loaded machine cannot turn a verdict: the tests check the mechanism, not a figure."""

import json
import os
import subprocess
import sys

import pytest

from serving_helpers import ROOT

KEY = "sk-standin-acceptance-5c2e"
NAME = "qwen38-fleet"


def run_acceptance(tmp_path, url, **extra):
    play = [
        {
            "name": "acceptance",
            "hosts": "localhost",
            "gather_facts": False,
            "roles": [{"role": "acceptance"}],
            "vars": dict(
                {
                    "acceptance_host_url": url,
                    "acceptance_api_key": KEY,
                    "acceptance_served_model_name": NAME,
                    "acceptance_gateway_url": "",
                    "acceptance_max_tokens": 48,
                    "acceptance_report_dir": str(tmp_path / "report"),
                },
                **extra,
            ),
        }
    ]
    book = tmp_path / "acceptance.yml"
    book.write_text(json.dumps(play))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
    )
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=%s" % sys.executable,
            str(book),
        ],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    lines = (tmp_path / "report" / "acceptance.txt").read_text().splitlines()
    figures = json.loads((tmp_path / "report" / "acceptance.json").read_text())
    return proc, lines, figures


def serving(standin, tok_s):
    srv = standin(api_key=KEY, served_name=NAME, load_seconds=0)
    srv.env["KUNLUN_SIM_TOKENS_PER_SECOND"] = str(tok_s)
    srv.start()
    return srv


@pytest.mark.parametrize("fail_on_miss", [True, False])
def test_a_slow_server_gets_a_fail_line(tmp_path, standin, fail_on_miss):
    srv = serving(standin, 10)
    proc, lines, figures = run_acceptance(tmp_path, srv.url, acceptance_fail_on_miss=fail_on_miss)
    out = proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("FAIL localhost: single stream "), lines
    # Measured over all 48 tokens, and below the target it was judged against.
    host = figures["hosts"]["localhost"]
    assert host["completion_tokens"] == 48 and 0 < host["tokens_per_s"] < 30, figures
    if fail_on_miss:
        assert proc.returncode != 0, out[-3000:]
        assert "Acceptance failed: FAIL localhost" in out, out[-3000:]
    else:
        assert proc.returncode == 0, out[-3000:]


def test_a_fast_server_gets_a_pass_line(tmp_path, standin):
    srv = serving(standin, 2000)
    proc, lines, figures = run_acceptance(tmp_path, srv.url)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len(lines) == 1 and lines[0].startswith("PASS localhost: single stream "), lines
    assert lines[0].endswith(", 48 tokens"), lines
    assert figures["hosts"]["localhost"]["tokens_per_s"] >= figures["target_single_stream_tok_s"], figures
