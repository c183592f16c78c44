"""The driver stage's read of /proc/xpu/probe_error (roles/driver/tasks/probe_error.yml,
included by its verify), run by ansible-playbook on this machine against a file standing
for the driver's: empty or absent passes, any text fails naming the file and the text."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "ansible-playbook").exists(),
    reason="not applicable: no .venv/bin/ansible-playbook (make setup)",
)

PLAY = """
- name: The probe error check as the driver's verify runs it, once per file
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Probe errors
      ansible.builtin.include_role:
        name: driver
        tasks_from: probe_error
      vars:
        driver_probe_error_file: "{{{{ item }}}}"
        driver_changes_note: Nothing was changed on the host.
      loop: {paths}

    - name: Past the check
      ansible.builtin.debug:
        msg: the run goes on
"""


def run(tmp_path, contents, *extra):
    """The play over one file per content (None: no file at all)."""
    paths = []
    for i, content in enumerate(contents):
        paths.append(str(tmp_path / ("probe_error.%d" % i)))
        if content is not None:
            Path(paths[-1]).write_text(content)
    book = tmp_path / "play.yml"
    book.write_text(PLAY.format(paths=paths))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_DEPRECATION_WARNINGS="False",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
    )
    res = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=%s" % sys.executable,
            str(book),
        ]
        + list(extra),
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        timeout=300,
    )
    return res.returncode, re.sub(r"\s+", " ", res.stdout).replace("''", "'"), paths


def test_no_probe_error_passes(tmp_path):
    """No file (a driver that keeps none), an empty one, one with only a newline."""
    rc, out, _ = run(tmp_path, [None, "", "\n"])
    assert rc == 0, out
    assert "the run goes on" in out


def test_a_probe_error_fails_naming_the_file_and_its_text(tmp_path):
    rc, out, paths = run(
        tmp_path, ["xpu3 0000:5c:00.0: probe failed, err -110\nxpu5 0000:9a:00.0: firmware timeout\n"], "--check"
    )
    assert rc != 0
    assert (
        "localhost: %s is not empty, the driver failed to probe a card: xpu3 0000:5c:00.0: probe failed, "
        "err -110; xpu5 0000:9a:00.0: firmware timeout. Nothing was changed on the host. Fix: find the card "
        "it names" % paths[0]
    ) in out, out
    assert "the run goes on" not in out


def test_verify_reads_the_driver_s_file():
    text = (ROOT / "roles/driver/tasks/verify.yml").read_text()
    assert "ansible.builtin.include_tasks: probe_error.yml" in text
    assert "driver_probe_error_file: /proc/xpu/probe_error" in text
