"""The failure budget: its arithmetic (module_utils/failure_budget.py), and real runs of a
tree of its own through kunlun-fleet's runner (local hosts; each stage playbook ends with a
play that runs library/failure_budget.py once, as the product's stage playbooks do): a host
left out within the budget and the rest finishing (exit 5, partial, the report naming it and
the command that finishes it), the budget exceeded stopping every host, a shared host
stopping the run whatever the budget, and a malformed budget refused."""

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from ansible.module_utils.failure_budget import parse_budget, verdict
from kunlun_fleet import cli, runner, status, vault

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ["s1", "s2", "s3", "s4"]


@pytest.mark.parametrize(
    "value, serving, hosts",
    [
        ("10%", 40, 4),
        ("10%", 39, 3),
        ("10%", 9, 0),
        ("10%", 3, 0),
        ("25%", 4, 1),
        ("0%", 40, 0),
        ("100%", 5, 5),
        (0, 40, 0),
        (2, 3, 2),
        ("3", 40, 3),
    ],
)
def test_budget_in_hosts(value, serving, hosts):
    assert parse_budget(value, serving) == hosts


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "101%", "-5%", "x%", "", True, None])
def test_malformed_budget_refused(value):
    with pytest.raises(ValueError):
        parse_budget(value, 10)


def test_verdict_counts_left_out_hosts_against_the_budget():
    hosts = ["gw"] + SERVERS
    v = verdict(hosts, ["gw", "s1", "s3", "s4"], SERVERS, ["gw"], 1)
    assert v["left_out"] == ["s2"] and v["within"] and v["allowed"] == 1 and v["serving"] == 4
    v = verdict(hosts, ["gw", "s1", "s4"], SERVERS, ["gw"], 1)
    assert v["left_out"] == ["s2", "s3"] and not v["within"]
    assert "2 host(s) left out (s2, s3), budget 1 of 4 serving hosts" in v["why"]
    # A shared host (a gateway) is never within a budget.
    v = verdict(hosts, SERVERS, SERVERS, ["gw"], "100%")
    assert v["shared_left_out"] == ["gw"] and not v["within"]
    # The base of a percentage is the run's serving hosts (a --limit), not the inventory's.
    v = verdict(["s1", "s2"], ["s1"], SERVERS, [], "50%")
    assert v["serving"] == 2 and v["allowed"] == 1 and v["within"]
    assert verdict(hosts, hosts, SERVERS, ["gw"], 0)["within"]


# ---------------------------------------------------------------- runs through the runner

STAGE = """---
- name: {title} | the {stage} play
  hosts: servers:gateways
  gather_facts: false
  tasks:
    - name: {title} | change
      ansible.builtin.debug:
        msg: changed
      changed_when: true
    - name: {title} | fail where asked
      ansible.builtin.fail:
        msg: "{stage} refused {{{{ inventory_hostname }}}}"
      when: inventory_hostname in (fail_in | default({{}})).get('{stage}', [])

- name: {title} | The hosts left out, against the failure budget
  hosts: servers:gateways
  gather_facts: false
  tasks:
    - name: {title} | The failure budget
      failure_budget:
        stage: {stage}
        hosts: "{{{{ ansible_play_hosts_all }}}}"
        remaining: "{{{{ ansible_play_hosts }}}}"
        serving: "{{{{ groups['servers'] }}}}"
        shared: "{{{{ groups['gateways'] }}}}"
        budget: "{{{{ budget | default('10%') }}}}"
      run_once: true
      delegate_to: localhost
"""
STAGES = ["preflight", "storage", "serve"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("budget-tree")
    (base / "ansible.cfg").write_text(
        "[defaults]\nretry_files_enabled = False\ngathering = explicit\nforks = 10\n"
        "library = %s\nmodule_utils = %s\n" % (ROOT / "library", ROOT / "module_utils")
    )
    (base / "playbooks").mkdir()
    site = ["---"]
    for stage in STAGES:
        (base / "playbooks" / ("%s.yml" % stage)).write_text(STAGE.format(title=stage.capitalize(), stage=stage))
        site.append("- name: %s\n  ansible.builtin.import_playbook: playbooks/%s.yml" % (stage.capitalize(), stage))
    (base / "site.yml").write_text("\n".join(site) + "\n")
    inv = base / "inv"
    inv.mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {"servers": {"hosts": {h: local for h in SERVERS}}, "gateways": {"hosts": {"gw": local}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    vault.ensure_api_key(str(inv))
    return {"root": base, "inv": str(inv)}


@pytest.fixture(autouse=True)
def in_tree(tree, monkeypatch):
    monkeypatch.setenv("KUNLUN_FLEET_ROOT", str(tree["root"]))
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)


def deploy(tree, capsys, **extra):
    args = ["-e", json.dumps(extra)]
    code = cli.main(["deploy", "-i", tree["inv"], "--plain"] + args)
    out = capsys.readouterr().out
    run = sorted(p for p in (tree["root"] / "reports" / "runs").iterdir())[-1]
    return code, out, json.loads((run / "summary.json").read_text()), args


def ran(out, stage):
    """The hosts that ran a stage's change task (ansible's plain output)."""
    head = "TASK [%s | change]" % stage.capitalize()
    if head not in out:
        return []
    lines = out.split(head)[1].split("TASK [")[0].splitlines()
    return sorted(line.split("[")[1].split("]")[0] for line in lines if line.startswith("changed: ["))


def test_a_host_left_out_within_the_budget_and_the_rest_finish(tree, capsys):
    code, out, s, extra = deploy(tree, capsys, budget=1, fail_in={"preflight": ["s2"]})
    assert code == runner.PARTIAL == 5, out[-3000:]
    # Preflight refused s2 alone; storage and serve ran on every other host.
    assert ran(out, "storage") == ran(out, "serve") == ["gw", "s1", "s3", "s4"], out[-3000:]
    assert s["exit_code"] == 5 and s["exit_meaning"].startswith("partial")
    assert s["failed_hosts"] == ["s2"] and s["hosts"]["s2"]["first_failure"]["stage"] == "preflight"
    b = s["failure_budget"]
    assert (b["stage"], b["left_out"], b["allowed"], b["within"]) == ("serve", ["s2"], 1, True)
    assert s["stopped_by_budget"] is None
    # The budget's run-once task is the run's verdict, not a host's outcome.
    assert all(s["hosts"][h]["result"] == "ok" for h in ("gw", "s1", "s3", "s4")), s["hosts"]
    resume = shlex.join(["kunlun-fleet", "deploy", "-i", tree["inv"], "--from", "preflight", "--limit", "s2"] + extra)
    assert s["resume"] == resume
    assert "1 host(s) left out, within the failure budget of 1" in out and "resume: %s" % resume in out
    assert "FAILED s2: preflight / Preflight | fail where asked: preflight refused s2" in out


def test_over_the_budget_the_run_stops_for_every_host(tree, capsys):
    code, out, s, extra = deploy(tree, capsys, budget=1, fail_in={"preflight": ["s2"], "storage": ["s3"]})
    # s2 refused, s3 failed in storage: two out, budget 1 - nothing runs serve.
    assert code == runner.FAILED, out[-3000:]
    assert ran(out, "storage") == ["gw", "s1", "s3", "s4"] and ran(out, "serve") == []
    assert sorted(s["failed_hosts"]) == ["s2", "s3"]
    assert "after storage: 2 host(s) left out (s2, s3), budget 1 of 4 serving hosts" in s["stopped_by_budget"]
    assert "STOPPED by the failure budget: after storage" in out
    # Every host starts again from the first stage that failed.
    assert s["resume"] == shlex.join(["kunlun-fleet", "deploy", "-i", tree["inv"], "--from", "preflight"] + extra)


def test_the_default_budget_of_a_small_fleet_is_none(tree, capsys):
    # 10% of 4 serving hosts is 0: a refused host stops the run after preflight, nothing changed.
    code, out, s, _ = deploy(tree, capsys, fail_in={"preflight": ["s4"]})
    assert code == runner.REFUSED, out[-3000:]
    assert ran(out, "storage") == [] and s["failed_hosts"] == ["s4"]
    assert "budget 0 of 4 serving hosts (kunlun_stack_failure_budget: 10%)" in s["stopped_by_budget"]


def test_a_shared_host_stops_the_run_whatever_the_budget(tree, capsys):
    code, out, s, _ = deploy(tree, capsys, budget="100%", fail_in={"storage": ["gw"]})
    assert code == runner.FAILED, out[-3000:]
    assert ran(out, "serve") == [] and s["failed_hosts"] == ["gw"]
    assert "the fleet depends on it" in s["stopped_by_budget"]


def test_a_malformed_budget_is_refused_before_any_change(tree, capsys):
    code, out, s, _ = deploy(tree, capsys, budget="ten")
    assert code == runner.REFUSED, out[-3000:]
    assert ran(out, "storage") == [] and s["failed_hosts"] == []
    assert "kunlun_stack_failure_budget 'ten'" in s["stopped_by_budget"] and "Fix: " in s["stopped_by_budget"]


def test_status_shows_the_hosts_the_last_deploy_left_out(tree, capsys):
    code, out, s, _ = deploy(tree, capsys, budget=1, fail_in={"storage": ["s3"]})
    assert code == runner.PARTIAL, out[-3000:]
    left = status.last_left_out(tree["inv"], tree["root"])
    assert left["run"] == s["id"] and left["exit_code"] == 5
    assert left["hosts"] == {"s3": "storage / Storage | fail where asked: storage refused s3"}
    lines = status.left_out_lines(left)
    assert lines[0].startswith("last deploy %s (exit 5: partial" % s["id"]) and "left out 1 host(s)" in lines[0]
    assert lines[-1] == "  resume: %s" % s["resume"] and "--limit s3" in s["resume"]
    # Another inventory's runs are not this one's; a later run that left none out clears it.
    assert status.last_left_out(str(tree["root"] / "elsewhere"), tree["root"]) is None
    code, out, s, _ = deploy(tree, capsys, budget=1)
    assert code == runner.OK, out[-3000:]
    assert status.last_left_out(tree["inv"], tree["root"]) is None
