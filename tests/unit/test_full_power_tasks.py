"""kunlun_stack's full_power tasks (included by preflight's host checks and the driver
stage's card checks), run for real by ansible-playbook on this machine against a fake
xpu-smi that prints recorded outputs: the refusal, the warning, the note on an unknown
cap, in check mode too. The decision itself (which cards, the message) is unit-tested in
test_xpu_smi.py / test_xpu_info.py."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_xpu_smi import write_fake_smi

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "ansible-playbook").exists(), reason="no .venv/bin/ansible-playbook"
)


# One run for the cases below, a host each (their settings in the inventory, the role's
# defaults under them as group_vars), and one in check mode: six runs of their own cost
# about 2 CPU-s each. The messages and the recap name each host.
PLAY = """
- name: The full power check as the stages run it
  hosts: all
  gather_facts: false
  tasks:
    - name: Read the cards
      xpu_info:
        xpu_smi_path: "{{ case_smi }}"
        dev_dir: "{{ case_dev }}"
        proc_dir: "{{ case_proc }}"
        power_cap_full: "{{ kunlun_stack_full_power_cap_w }}"

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

# host: (the table, xpu-smi -q, the host's settings)
CASES = {
    "all-at-120": ("xpu-smi_power120.txt", "xpu-smi-q_power120.txt", {}),
    "one-at-120": ("xpu-smi_power3_120_5_na.txt", "xpu-smi-q_power3_120_5_na.txt", {}),
    "not-required": (
        "xpu-smi_power3_120_5_na.txt",
        "xpu-smi-q_power3_120_5_na.txt",
        {"kunlun_stack_require_full_power": False},
    ),
    "full-power": ("xpu-smi_8_vc.txt", "xpu-smi-q_8_vc.txt", {}),
    # A fleet whose cards are rated lower sets kunlun_stack_full_power_cap_w; 120 W then passes.
    "rated-120": ("xpu-smi_power120.txt", "xpu-smi-q_power120.txt", {"kunlun_stack_full_power_cap_w": 120}),
}

FIX_ONE = "Fix: set the card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run."
FIX_MANY = "Fix: set each card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run."


def said(out):
    """The run's output as one line: the YAML result format folds long messages and
    doubles the apostrophes of single-quoted strings."""
    return re.sub(r"\s+", " ", out).replace("''", "'")


def run(work, hosts, *extra):
    """ansible-playbook over the named cases, each a local host with its fake xpu-smi."""
    inv = work / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    shutil.copy(ROOT / "roles/kunlun_stack/defaults/main.yml", inv / "group_vars" / "all.yml")
    entries = {}
    for host in hosts:
        table, query, settings = CASES[host]
        case = work / host
        for sub in ("dev", "proc"):
            (case / sub).mkdir(parents=True)
        entries[host] = dict(
            settings,
            ansible_connection="local",
            ansible_python_interpreter=sys.executable,
            case_smi=str(write_fake_smi(case, table, query)),
            case_dev=str(case / "dev"),
            case_proc=str(case / "proc"),
        )
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": entries}}))
    book = work / "play.yml"
    book.write_text(PLAY)
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_DEPRECATION_WARNINGS="False",
        ANSIBLE_LOCAL_TEMP=str(work / "ansible-local"),
    )
    res = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inv), str(book), *extra],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        timeout=300,
    )
    return res.returncode, res.stdout


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """(rc, output) of one run over every case."""
    return run(tmp_path_factory.mktemp("full-power"), list(CASES))


def recap(out, host):
    """The host's line of the PLAY RECAP: {ok: n, changed: n, failed: n, ...}."""
    line = re.search(r"^%s\s+: (.*)$" % re.escape(host), out, re.M)
    assert line, (host, out[-3000:])
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line.group(1))}


def went_on(out, host):
    return re.search(r"ok: \[%s\] =>\s+msg: the run goes on" % re.escape(host), out) is not None


# The refusal's message (the WARNING and NOTE lines carry that word before the host).
REFUSAL = r"(?<!WARNING )(?<![\w-])HOST: \d of 8 cards (?:is|are) capped below the full"


def said_by(text, pattern):
    """The hosts named at the start of each message matching pattern (``HOST`` in it)."""
    return {m.group(1) for m in re.finditer(pattern.replace("HOST", r"([\w-]+)"), text)}


def test_the_cases_in_one_run_each_host_its_own_outcome(cases):
    rc, out = cases
    text = said(out)
    assert rc != 0, out[-3000:]
    # Refused (stopped before the run goes on): the cards below 400 W with the fix; nothing changed.
    assert said_by(text, REFUSAL) == {"all-at-120", "one-at-120"}
    assert said_by(text, r"WARNING HOST: \d of 8 cards") == {"not-required"}
    assert said_by(text, r"NOTE HOST: xpu-smi gives no power cap") == {"one-at-120", "not-required"}
    for host in CASES:
        stopped = host in ("all-at-120", "one-at-120")
        assert recap(out, host)["failed"] == int(stopped), (host, out[-3000:])
        assert recap(out, host)["changed"] == 0, (host, out[-3000:])
        assert went_on(out, host) is not stopped, (host, out[-3000:])

    assert (
        "all-at-120: 8 of 8 cards are capped below the full 400 W: device 0 (serial 02KE5E61F0010) at 120 W, "
        "device 1 (serial 02KE5E61F0011) at 120 W,"
    ) in text, out[-3000:]
    assert "device 7 (serial 02KE5E61F0017) at 120 W." in text and FIX_MANY + " Nothing was changed." in text
    assert "set kunlun_stack_require_full_power to false" in text

    assert (
        "one-at-120: 1 of 8 cards is capped below the full 400 W: device 3 (serial 02KE5E61F0013) at 120 W."
    ) in text, out[-3000:]
    assert FIX_ONE + " Nothing was changed." in text  # the one refusal of a single card
    assert (
        "NOTE one-at-120: xpu-smi gives no power cap for device 5 (serial 02KE5E61F0015), so it was not "
        "checked against the full 400 W."
    ) in text

    assert (
        "WARNING not-required: 1 of 8 cards is capped below the full 400 W: device 3 (serial 02KE5E61F0013) at 120 W."
    ) in text, out[-3000:]
    assert FIX_ONE + " kunlun_stack_require_full_power is false, so the run goes on at reduced throughput." in text


def test_cards_at_120_w_are_refused_in_check_mode(tmp_path):
    rc, out = run(tmp_path, ["all-at-120", "full-power"], "--check")
    text = said(out)
    assert rc != 0, out[-3000:]
    assert said_by(text, REFUSAL) == {"all-at-120"}, out[-3000:]
    assert "device 7 (serial 02KE5E61F0017) at 120 W." in text and FIX_MANY + " Nothing was changed." in text
    assert recap(out, "all-at-120")["failed"] == 1 and not went_on(out, "all-at-120"), out[-3000:]
    assert recap(out, "full-power")["failed"] == 0 and went_on(out, "full-power"), out[-3000:]
    assert all(recap(out, host)["changed"] == 0 for host in ("all-at-120", "full-power"))
