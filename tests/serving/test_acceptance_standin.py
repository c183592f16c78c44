"""The acceptance role's judgement against the stand-in vllm server on 127.0.0.1: a
server slower than the single-stream target gets a FAIL line, and the run fails when
acceptance_fail_on_miss is set (the default); a server far above the target gets a PASS
line. The stand-ins are paced far from the target (10 and 2000 tok/s against 30), so a
loaded machine cannot turn a verdict: the tests check the mechanism, not a figure."""

import json
import os
import re
import subprocess
import sys

from serving_helpers import ROOT

KEY = "sk-standin-acceptance-5c2e"
NAME = "qwen38-fleet"


def run_acceptance(tmp_path, cases):
    """One ansible-playbook run, a play of the acceptance role per case ({name: (url, vars)},
    in order; each its own report directory). A failing play ends the run there."""
    play = [
        {
            "name": name,
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
                    "acceptance_report_dir": str(tmp_path / name),
                },
                **extra,
            ),
        }
        for name, (url, extra) in cases.items()
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
    out = proc.stdout + proc.stderr
    reports = {}
    for name in cases:
        assert (tmp_path / name / "acceptance.txt").exists(), "no report of %s:\n%s" % (name, out[-3000:])
        reports[name] = (
            (tmp_path / name / "acceptance.txt").read_text().splitlines(),
            json.loads((tmp_path / name / "acceptance.json").read_text()),
        )
    return proc.returncode, out, reports


def serving(standin, tok_s):
    srv = standin(api_key=KEY, served_name=NAME, load_seconds=0)
    srv.env["KUNLUN_SIM_TOKENS_PER_SECOND"] = str(tok_s)
    srv.start()
    return srv


# The three cases in one run, a play each (a run costs about 5 CPU-s; each used to be a run
# of its own): the failing one last, since it ends the run. That the plays before it wrote
# their reports shows they did not fail the run.
def test_a_slow_server_gets_a_fail_line_and_a_fast_one_a_pass_line(tmp_path, standin):
    slow, fast = serving(standin, 10), serving(standin, 2000)
    rc, out, reports = run_acceptance(
        tmp_path,
        {
            "fast": (fast.url, {}),
            "slow-no-fail": (slow.url, {"acceptance_fail_on_miss": False}),
            "slow": (slow.url, {"acceptance_fail_on_miss": True}),
        },
    )
    lines, figures = reports["fast"]
    assert len(lines) == 1 and lines[0].startswith("PASS localhost: single stream "), lines
    assert lines[0].endswith(", 48 tokens"), lines
    assert figures["hosts"]["localhost"]["tokens_per_s"] >= figures["target_single_stream_tok_s"], figures
    for name in ("slow-no-fail", "slow"):
        lines, figures = reports[name]
        assert len(lines) == 1 and lines[0].startswith("FAIL localhost: single stream "), lines
        # Measured over all 48 tokens, and below the target it was judged against.
        host = figures["hosts"]["localhost"]
        assert host["completion_tokens"] == 48 and 0 < host["tokens_per_s"] < 30, figures
    # Only the play with acceptance_fail_on_miss failed, and it failed the run.
    assert rc != 0, out[-3000:]
    assert "Acceptance failed: FAIL localhost" in out and re.search(r"localhost +: .* failed=1 ", out), out[-3000:]
