"""kunlun_stack's full_power tasks (included by preflight's host checks and the driver
stage's card checks), run for real by ansible-playbook on this machine against a fake
xpu-smi that prints recorded outputs: the refusal, the warning, the note on an unknown
cap, in check mode too. The decision itself (which cards, the message) is unit-tested in
test_xpu_smi.py / test_xpu_info.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fake_xpu_smi import write_fake_smi

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "ansible-playbook").exists(), reason="no .venv/bin/ansible-playbook"
)


PLAY = """
- name: The full power check as the stages run it
  hosts: localhost
  gather_facts: false
  vars_files:
    - {defaults}
  tasks:
    - name: Read the cards
      xpu_info:
        xpu_smi_path: {smi}
        dev_dir: {dev}
        proc_dir: {proc}
        power_cap_full: "{{{{ kunlun_stack_full_power_cap_w }}}}"

    - name: Every card at its full power
      ansible.builtin.include_role:
        name: kunlun_stack
        tasks_from: full_power
      vars:
        kunlun_stack_power_changes_note: Nothing was changed.

    - name: Past the check
      ansible.builtin.debug:
        msg: the run goes on
"""

FIX_ONE = "Fix: set the card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run."
FIX_MANY = "Fix: set each card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run."


def said(out):
    """The run's output as one line: the YAML result format folds long messages and
    doubles the apostrophes of single-quoted strings."""
    return re.sub(r"\s+", " ", out).replace("''", "'")


@pytest.fixture
def play(tmp_path):
    def run(table, query, *extra):
        smi = write_fake_smi(tmp_path, table, query)
        dev = tmp_path / "dev"
        dev.mkdir(exist_ok=True)
        proc = tmp_path / "proc"
        proc.mkdir(exist_ok=True)
        book = tmp_path / "play.yml"
        book.write_text(
            PLAY.format(defaults=ROOT / "roles/kunlun_stack/defaults/main.yml", smi=smi, dev=dev, proc=proc)
        )
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
        return res.returncode, res.stdout

    return run


@pytest.mark.parametrize("check", [False, True])
def test_cards_at_120_w_are_refused(play, check):
    rc, out = play("xpu-smi_power120.txt", "xpu-smi-q_power120.txt", *(["--check"] if check else []))
    text = said(out)
    assert rc != 0, out[-3000:]
    assert (
        "localhost: 8 of 8 cards are capped below the full 400 W: device 0 (serial 02KE5E61F0010) at 120 W, "
        "device 1 (serial 02KE5E61F0011) at 120 W,"
    ) in text, out[-3000:]
    assert "device 7 (serial 02KE5E61F0017) at 120 W." in text
    assert FIX_MANY + " Nothing was changed." in text
    assert "set kunlun_stack_require_full_power to false" in text
    assert "the run goes on" not in text
    assert "changed=0" in out


def test_one_card_is_named_and_an_unknown_cap_noted(play):
    rc, out = play("xpu-smi_power3_120_5_na.txt", "xpu-smi-q_power3_120_5_na.txt")
    text = said(out)
    assert rc != 0, out[-3000:]
    assert (
        "localhost: 1 of 8 cards is capped below the full 400 W: device 3 (serial 02KE5E61F0013) at 120 W." in text
    ), out[-3000:]
    assert FIX_ONE in text
    assert (
        "NOTE localhost: xpu-smi gives no power cap for device 5 (serial 02KE5E61F0015), so it was not "
        "checked against the full 400 W."
    ) in text


def test_not_required_is_a_warning_and_the_run_goes_on(play):
    rc, out = play(
        "xpu-smi_power3_120_5_na.txt",
        "xpu-smi-q_power3_120_5_na.txt",
        "-e",
        '{"kunlun_stack_require_full_power": false}',
    )
    text = said(out)
    assert rc == 0, out[-3000:]
    assert (
        "WARNING localhost: 1 of 8 cards is capped below the full 400 W: device 3 (serial 02KE5E61F0013) at 120 W."
    ) in text, out[-3000:]
    assert FIX_ONE + " kunlun_stack_require_full_power is false, so the run goes on at reduced throughput." in text
    assert "msg: the run goes on" in text


def test_full_power_passes_quietly(play):
    rc, out = play("xpu-smi_8_vc.txt", "xpu-smi-q_8_vc.txt")
    text = said(out)
    assert rc == 0, out[-3000:]
    assert "capped below the full" not in text and "NOTE localhost" not in text and "WARNING localhost" not in text
    assert "msg: the run goes on" in text


def test_full_cap_is_the_pinned_default(play):
    """A fleet whose cards are rated lower sets kunlun_stack_full_power_cap_w; 120 W then passes."""
    rc, out = play("xpu-smi_power120.txt", "xpu-smi-q_power120.txt", "-e", '{"kunlun_stack_full_power_cap_w": 120}')
    assert rc == 0, out[-3000:]
    assert "capped below the full" not in said(out)
