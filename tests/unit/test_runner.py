"""kunlun_fleet/runner/: deploy, stage and bench through ansible-runner. Real runs of tiny
playbooks in a tree of their own (KUNLUN_FLEET_ROOT) against local hosts: the run reports,
the exit codes (ok, failed, refused, unreachable, interrupted), the output modes, the resume
command, --from/--only, the rotation of run directories and `kunlun-fleet runs`."""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import cli, runner, vault

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["preflight", "storage", "serve"]

STAGE_PLAY = """---
- name: {title} | the {stage} play
  hosts: servers
  gather_facts: false
  any_errors_fatal: {fatal}
  tasks:
    - name: {title} | read
      ansible.builtin.debug:
        msg: "{stage} on {{{{ inventory_hostname }}}}"
    - name: {title} | change
      ansible.builtin.debug:
        msg: changed
      changed_when: true
    - name: {title} | fail where asked
      ansible.builtin.fail:
        msg: "{stage} refused {{{{ inventory_hostname }}}}: curl -H 'Authorization: Bearer tok-0123456789'
          with {{{{ vault_kunlun_api_key }}}}"
      when: inventory_hostname in (fail_in | default({{}})).get('{stage}', [])
"""


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A checkout of its own: ansible.cfg, a site.yml of three stages, a stage that sleeps,
    one that connects, the pins file, and an inventory directory with a vaulted API key."""
    base = tmp_path_factory.mktemp("tree")
    (base / "ansible.cfg").write_text(
        "[defaults]\nretry_files_enabled = False\ncallback_result_format = yaml\ngathering = explicit\nforks = 10\n"
    )
    (base / "playbooks").mkdir()
    site = ["---"]
    for stage in STAGES:
        title = stage.capitalize()
        (base / "playbooks" / ("%s.yml" % stage)).write_text(
            STAGE_PLAY.format(title=title, stage=stage, fatal="true" if stage == "preflight" else "false")
        )
        site.append("- name: %s\n  ansible.builtin.import_playbook: playbooks/%s.yml" % (title, stage))
    (base / "site.yml").write_text("\n".join(site) + "\n")
    (base / "playbooks" / "sleepy.yml").write_text(
        "---\n- name: Sleepy | wait\n  hosts: servers\n  gather_facts: false\n  tasks:\n"
        "    - name: Sleepy | sleep\n      ansible.builtin.command: sleep 47.5\n"
    )
    (base / "playbooks" / "reach.yml").write_text(
        "---\n- name: Reach | every host\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Reach | ping\n      ansible.builtin.ping:\n"
    )
    pins = base / "roles" / "kunlun_stack" / "defaults"
    pins.mkdir(parents=True)
    (pins / "main.yml").write_text(
        "kunlun_stack_components:\n  vllm: {version: '0.15.1'}\nkunlun_stack_driver: {version: '5.0.21.26'}\n"
    )
    inv = base / "inv"
    inv.mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "servers": {"hosts": {"a": local, "b": local}},
        "far": {
            "hosts": {
                "c": {
                    "ansible_connection": "ssh",
                    "ansible_host": "127.0.0.1",
                    "ansible_port": _closed_port(),
                    "ansible_ssh_timeout": 3,
                    "ansible_ssh_retries": 0,
                }
            }
        },
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    vault.ensure_api_key(str(inv))
    return {"root": base, "inv": str(inv), "key": vault.read_api_key(str(inv))}


@pytest.fixture(autouse=True)
def in_tree(tree, monkeypatch):
    monkeypatch.setenv("KUNLUN_FLEET_ROOT", str(tree["root"]))
    # The test session's (tests/conftest.py) is the sim fleet's; this inventory has its own.
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)


def last_run(tree):
    run = sorted(p for p in (tree["root"] / "reports" / "runs").iterdir())[-1]
    return run, json.loads((run / "summary.json").read_text())


def test_a_good_deploy_prints_ansible_output_and_writes_the_report(tree, capsys):
    code = cli.main(["deploy", "-i", tree["inv"], "--plain"])
    out = capsys.readouterr().out
    assert code == runner.OK
    assert "PLAY RECAP" in out and "TASK [Storage | change]" in out
    run, s = last_run(tree)
    assert run.name.endswith("-deploy") and s["id"] == run.name
    assert (s["status"], s["exit_code"], s["command"], s["inventory"], s["limit"]) == (
        "successful",
        0,
        "deploy",
        tree["inv"],
        None,
    )
    assert [st["stage"] for st in s["stages"]] == STAGES
    assert all(st["result"] == "ok" and st["wall_s"] >= 0 for st in s["stages"])
    assert s["wall_s"] >= sum(st["wall_s"] for st in s["stages"]) - 0.5
    for host in ("a", "b"):
        counts = {k: s["hosts"][host][k] for k in ("ok", "changed", "failed", "unreachable", "skipped")}
        assert counts == {"ok": 6, "changed": 3, "failed": 0, "unreachable": 0, "skipped": 3}
    assert s["failed_hosts"] == [] and s["resume"] is None
    assert s["stack"]["versions"] == {"vllm": "0.15.1", "xre_driver": "5.0.21.26"}
    md = (run / "summary.md").read_text()
    assert "# kunlun-fleet deploy: successful" in md and "| a | 6 | 3 | 0 | 0 | 3 | ok |" in md
    assert "report: " in out and str(run / "summary.md") in out


def test_a_failed_host_from_a_stage_in_json(tree, capsys):
    extra = ["-e", json.dumps({"fail_in": {"storage": ["b"]}})]
    code = cli.main(["deploy", "-i", tree["inv"], "--from", "storage", "--json"] + extra)
    out = capsys.readouterr().out
    assert code == runner.FAILED
    lines = [json.loads(line) for line in out.splitlines()]
    events = [e["event"] for e in lines]
    assert events[0] == "playbook_on_start" and events[-1] == "kunlun_fleet_summary"
    assert {e["stage"] for e in lines if e["event"] == "playbook_on_play_start"} == {"storage", "serve"}
    failed = [e for e in lines if e["event"] == "runner_on_failed"]
    assert [(e["host"], e["stage"], e["task"]) for e in failed] == [("b", "storage", "Storage | fail where asked")]
    assert "Bearer ********" in failed[0]["msg"] and "tok-0123456789" not in failed[0]["msg"]
    assert tree["key"] not in out and "tok-0123456789" not in out
    assert lines[-1]["exit_code"] == 2 and lines[-1]["failed_hosts"] == ["b"]

    run, s = last_run(tree)
    assert s["status"] == "failed" and s["stages_selected"] == ["storage", "serve"]
    assert [st["stage"] for st in s["stages"]] == ["storage", "serve"]
    f = s["hosts"]["b"]["first_failure"]
    assert (f["stage"], f["task"], f["unreachable"]) == ("storage", "Storage | fail where asked", False)
    assert f["message"].startswith("storage refused b: curl -H 'Authorization: Bearer ********' with ********")
    assert s["hosts"]["a"]["result"] == "ok" and s["hosts"]["a"]["changed"] == 2
    assert s["resume"] == shlex.join(
        ["kunlun-fleet", "deploy", "-i", tree["inv"], "--from", "storage", "--limit", "b"] + extra
    )
    played = yaml.safe_load((run / "site.yml").read_text())
    assert [p["ansible.builtin.import_playbook"] for p in played] == [
        str(tree["root"] / "playbooks" / ("%s.yml" % n)) for n in ("storage", "serve")
    ]
    # Nothing the run stored holds a secret: the report, the events, ansible's stdout.
    for path in run.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert tree["key"] not in text and "tok-0123456789" not in text, path
    assert "Bearer ********" in (run / "artifacts" / "stdout").read_text()
    assert "env" not in json.loads((run / "artifacts" / "command").read_text())

    assert cli.main(["runs", "show", run.name[:20]]) == 0
    shown = capsys.readouterr().out
    assert shown == (run / "summary.md").read_text()
    assert "## Resume" in shown and s["resume"] in shown


def test_a_preflight_refusal_resumes_every_host_from_preflight(tree, capsys):
    extra = ["-e", json.dumps({"fail_in": {"preflight": ["a"]}})]
    assert cli.main(["deploy", "-i", tree["inv"], "--limit", "a,b"] + extra) == runner.REFUSED
    run, s = last_run(tree)
    assert s["exit_code"] == 3 and s["limit"] == "a,b"
    assert [st["result"] for st in s["stages"]] == ["failed", "not run", "not run"]
    # The run stopped for every host (any_errors_fatal): all of them start again.
    assert s["resume"] == shlex.join(
        ["kunlun-fleet", "deploy", "-i", tree["inv"], "--from", "preflight", "--limit", "a,b"] + extra
    )
    assert "FAILED a: preflight / Preflight | fail where asked" in capsys.readouterr().out


def test_an_unreachable_host(tree, capsys):
    assert cli.main(["stage", "reach", "-i", tree["inv"], "--limit", "c"]) == runner.UNREACHABLE
    run, s = last_run(tree)
    assert run.name.endswith("-stage-reach")
    assert s["unreachable_hosts"] == ["c"] and s["failed_hosts"] == []
    f = s["hosts"]["c"]["first_failure"]
    assert f["unreachable"] and f["task"] == "Reach | ping" and "Failed to connect" in f["message"]
    assert s["resume"] == shlex.join(["kunlun-fleet", "stage", "reach", "-i", tree["inv"], "--limit", "c"])


def _tree_processes(base):
    """Processes still running from this tree (ansible-playbook, its workers, the sleep)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(base) in cmd or "sleep 47.5" in cmd:
            found.append((int(pid), cmd))
    return found


def test_ctrl_c_stops_the_run_and_writes_an_interrupted_report(tree):
    env = dict(os.environ, KUNLUN_FLEET_ROOT=str(tree["root"]), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kunlun_fleet.cli", "stage", "sleepy", "-i", tree["inv"], "--plain"],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, started = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "TASK [Sleepy | sleep]" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(60), "".join(lines)
        time.sleep(1)  # the sleep task under way on both hosts
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == runner.INTERRUPTED, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    run, s = last_run(tree)
    assert run.name.endswith("-stage-sleepy")
    assert (s["status"], s["exit_code"]) == ("interrupted", 130)
    assert s["hosts"]["a"]["in_flight"] == {"stage": "sleepy", "task": "Sleepy | sleep"}
    assert "## In flight when interrupted" in (run / "summary.md").read_text()
    assert s["resume"] == shlex.join(["kunlun-fleet", "stage", "sleepy", "-i", tree["inv"]])
    deadline = time.time() + 10
    while _tree_processes(tree["root"]) and time.time() < deadline:
        time.sleep(0.2)
    assert _tree_processes(tree["root"]) == []  # the workers and their task stopped too


def test_an_unknown_stage_is_refused_before_anything_runs(tree, capsys):
    runs = tree["root"] / "reports" / "runs"
    before = sorted(runs.iterdir()) if runs.exists() else []
    assert cli.main(["deploy", "-i", tree["inv"], "--from", "stroage"]) == runner.REFUSED
    assert "no stage 'stroage'; the stages of site.yml, in order: preflight, storage, serve" in capsys.readouterr().err
    assert cli.main(["deploy", "-i", tree["inv"], "--only", "serve,bogus"]) == runner.REFUSED
    assert cli.main(["stage", "bogus", "-i", tree["inv"]]) == runner.REFUSED
    assert "the stages: preflight, reach, serve, sleepy, storage" in capsys.readouterr().err
    assert cli.main(["deploy", "-i", str(tree["root"] / "no-such-inventory")]) == runner.REFUSED
    assert "no inventory" in capsys.readouterr().err
    assert (sorted(runs.iterdir()) if runs.exists() else []) == before


def test_the_environment_is_the_checkouts(tree, monkeypatch):
    """ansible.cfg of the tree, the inventory's vault password, and host keys still checked
    (ansible-runner would turn that off)."""
    monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    env = runner.Run("deploy", "site.yml", inventory=tree["inv"], base=tree["root"]).envvars()
    assert env["ANSIBLE_CONFIG"] == str(tree["root"] / "ansible.cfg")
    assert env["ANSIBLE_VAULT_PASSWORD_FILE"] == os.path.join(tree["inv"], ".vault-password")
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True" and env["ANSIBLE_NOCOLOR"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    # An inventory file: the password beside it, where its group_vars are.
    hosts = os.path.join(tree["inv"], "hosts.yml")
    env = runner.Run("deploy", "site.yml", inventory=hosts, base=tree["root"]).envvars()
    assert env["ANSIBLE_VAULT_PASSWORD_FILE"] == os.path.join(tree["inv"], ".vault-password")


@pytest.mark.parametrize("force, colour", [(None, False), ("0", False), ("false", False), ("1", True), ("True", True)])
def test_colour_only_when_forced_true(tree, monkeypatch, force, colour):
    """Output that is not a terminal has no colour codes unless ANSIBLE_FORCE_COLOR is a
    true boolean: a caller that pipes the output and sets it to 0 gets plain text."""
    if force is None:
        monkeypatch.delenv("ANSIBLE_FORCE_COLOR", raising=False)
    else:
        monkeypatch.setenv("ANSIBLE_FORCE_COLOR", force)
    env = runner.Run("deploy", "site.yml", inventory=tree["inv"], base=tree["root"]).envvars()
    assert ("ANSIBLE_NOCOLOR" not in env) is colour, env


def test_from_and_only_choose_stages_in_site_order(tree, tmp_path):
    stages = runner.site_stages(tree["root"])
    assert [s["stage"] for s in stages] == STAGES
    assert stages[1]["plays"] == ["Storage | the storage play"]
    assert [s["stage"] for s in runner.select_stages(stages, start="storage")] == ["storage", "serve"]
    assert [s["stage"] for s in runner.select_stages(stages, only="serve, preflight")] == ["preflight", "serve"]
    assert runner.select_stages(stages) == stages
    path = runner.write_selection(runner.select_stages(stages, only="serve,preflight"), tmp_path / "site.yml")
    assert [(p["name"], Path(p["ansible.builtin.import_playbook"]).name) for p in yaml.safe_load(path.read_text())] == [
        ("Preflight", "preflight.yml"),
        ("Serve", "serve.yml"),
    ]


def test_the_real_site_stages_are_read_from_site_yml():
    names = [s["stage"] for s in runner.site_stages(ROOT)]
    assert names[:10] == [
        "preflight",
        "firewall",
        "storage",
        "engine",
        "driver",
        "image",
        "model",
        "serve",
        "gateway",
        "acceptance",
    ]
    serve = [s for s in runner.site_stages(ROOT) if s["stage"] == "serve"][0]
    # The fleet-wide pass, the failure budget before any restart, the gateways' trust of the
    # fleet CA, the batched rollout, the failure budget after it.
    assert len(serve["plays"]) == 5 and all(p.startswith("Serve |") for p in serve["plays"])


def test_rotation_keeps_the_newest_runs(tmp_path):
    parent = runner.runs_dir(tmp_path)
    parent.mkdir(parents=True)
    old = ["2026010%dT000000Z-deploy" % i for i in range(1, 6)]
    for name in old:
        (parent / name).mkdir()
    (parent / "notes").mkdir()  # not a run: never touched
    new = runner.new_run_dir("deploy", tmp_path, keep=3)
    assert sorted(p.name for p in parent.iterdir()) == old[-2:] + [new.name, "notes"]
    again = runner.new_run_dir("deploy", tmp_path, keep=3)
    assert again != new and again.name.startswith(new.name.split("-")[0])
    assert sorted(p.name for p in parent.iterdir()) == old[-1:] + [new.name, again.name, "notes"]
    # Kept by kind: many status runs (a cron) evict status runs only, never the deploys.
    statuses = ["2026020%dT000000Z-status" % i for i in range(1, 6)]
    for name in statuses:
        (parent / name).mkdir()
    runner.rotate(parent, keep=3)
    names = sorted(p.name for p in parent.iterdir())
    assert [n for n in names if n.endswith("-deploy") or "-deploy-" in n] == old[-1:] + [new.name, again.name]
    assert [n for n in names if runner.run_kind(n) == "status"] == statuses[-3:]
    assert runner.run_kind("20260101T000000Z-stage-serve-2") == "stage-serve"


def test_runs_lists_the_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUNLUN_FLEET_ROOT", str(tmp_path))
    assert cli.main(["runs"]) == 0
    assert "no runs yet" in capsys.readouterr().out
    parent = runner.runs_dir(tmp_path)
    for name, status, wall, failed in (
        ("20260101T000000Z-deploy", "successful", 3723.0, []),
        ("20260102T000000Z-stage-serve", "failed", 42.5, ["p800-a02"]),
    ):
        (parent / name).mkdir(parents=True)
        (parent / name / "summary.json").write_text(
            json.dumps(
                {
                    "id": name,
                    "command": name.split("-")[1],
                    "playbook": "playbooks/serve.yml",
                    "status": status,
                    "wall_s": wall,
                    "failed_hosts": failed,
                    "unreachable_hosts": ["p800-a09"] if failed else [],
                }
            )
        )
    (parent / "20260103T000000Z-deploy").mkdir()
    assert cli.main(["runs"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0][:3] == ["id", "command", "status"]
    assert rows[1] == ["20260101T000000Z-deploy", "deploy", "successful", "1h02m03s", "0"]
    assert rows[2] == [
        "20260102T000000Z-stage-serve",
        "stage",
        "serve",
        "failed",
        "42.5",
        "s",
        "2:",
        "p800-a02,",
        "p800-a09",
    ]
    assert rows[3][:3] == ["20260103T000000Z-deploy", "-", "no"]
    assert cli.main(["runs", "show", "2026"]) == runner.REFUSED
    assert "it matches" in capsys.readouterr().err
    assert cli.main(["runs", "show", "last"]) == 1  # no summary.md: still running, or killed


def _event(kind, host=None, play=None, task=None, **res):
    data = {"play": play, "task": task}
    if host:
        data["host"] = host
    if res:
        data["res"] = res
    return {"event": kind, "event_data": data, "created": "2026-01-01T00:00:00+00:00"}


def test_the_live_view_groups_a_large_fleet(tree):
    from rich.console import Console

    stages = runner.site_stages(tree["root"])
    t = runner.Tracker(stages, runner.Masker())
    hosts = ["p800-a%02d" % i for i in range(1, 31)]
    t.feed(_event("playbook_on_play_start", play="Preflight | the preflight play"))
    t.feed(_event("playbook_on_play_start", play="Storage | the storage play"))
    for h in hosts:
        t.feed(_event("runner_on_start", h, "Storage | the storage play", "Storage | change"))
    for h in hosts[:25]:
        t.feed(_event("runner_on_ok", h, "Storage | the storage play", "Storage | change", changed=True))
    t.feed(
        _event(
            "runner_on_failed",
            hosts[25],
            "Storage | the storage play",
            "Storage | change",
            msg="disk busy, Authorization: Bearer abcdef",
        )
    )
    console = Console(record=True, width=160)
    console.print(runner.render(t, "kunlun-fleet deploy"))
    text = console.export_text()
    assert "✓ preflight › ✗ storage › · serve" in text
    assert "p800-a01 … p800-a25 (25 hosts)  ok" in text and " 25 " in text
    assert "p800-a27 … p800-a30 (4 hosts)   running" in text
    assert [line.split()[:2] for line in text.splitlines() if line.startswith("p800-a26")] == [["p800-a26", "failed"]]
    assert t.hosts[hosts[25]]["failure"]["message"] == "disk busy, Authorization: Bearer ********"
    small = runner.Tracker(stages, runner.Masker())
    for h in hosts[:3]:
        small.feed(_event("runner_on_start", h, "Serve | the serve play", "Serve | read"))
    console = Console(record=True, width=160)
    console.print(runner.render(small, "kunlun-fleet deploy"))
    assert [line.split()[0] for line in console.export_text().splitlines()[3:]] == hosts[:3]


def test_secrets_of_the_inventory_are_masked(tree):
    secrets = runner.vault_secrets(tree["inv"])
    assert tree["key"] in secrets
    m = runner.Masker(secrets)
    assert m.text("key=%s!" % tree["key"]) == "key=********!"
    assert m.obj({"a": ["Authorization: bearer xyz.123", 5]}) == {"a": ["Authorization: bearer ********", 5]}


def labelled_inventory(tree, name):
    """An inventory directory of its own whose fleet key is vaulted under the vault id `prod`
    with a password kept elsewhere (not INV/.vault-password): as a site that runs with
    --vault-id prod@FILE keeps it. (inventory, password file, key)."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    inv = tree["root"] / name
    (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text((Path(tree["inv"]) / "hosts.yml").read_text())
    password = tree["root"] / (name + ".prod-password")
    password.write_text("the-prod-vault-password\n")
    key = "kf-prod-" + name + "-0123456789"
    armored = VaultLib([("prod", VaultSecret(b"the-prod-vault-password"))]).encrypt(key, vault_id="prod").decode()
    (inv / "group_vars" / "all" / "vault.yml").write_text(
        "vault_kunlun_api_key: !vault |\n" + "".join("  %s\n" % line for line in armored.splitlines())
    )
    return inv, password, key


@pytest.mark.parametrize("how", ["inventory file", "vault id"])
def test_vaulted_values_are_masked_whatever_the_invocation(tree, capsys, how):
    """-i an inventory file (its group_vars beside it) or --vault-id label@FILE: the run
    report, the events and ansible's stdout still hold no vaulted value."""
    if how == "inventory file":
        inventory, key = os.path.join(tree["inv"], "hosts.yml"), tree["key"]
        args = ["--vault-password-file", os.path.join(tree["inv"], ".vault-password")]
    else:
        inv, password, key = labelled_inventory(tree, "inv-prod")
        inventory, args = str(inv), ["--vault-id", "prod@%s" % password]
    extra = ["-e", json.dumps({"fail_in": {"storage": ["b"]}})]
    code = cli.main(["deploy", "-i", inventory, "--only", "storage", "--plain"] + args + extra)
    out = capsys.readouterr().out
    run, s = last_run(tree)
    assert code == runner.FAILED, out[-3000:]
    # The failure printed the key (Ansible decrypted it): masked in the report.
    assert s["hosts"]["b"]["first_failure"]["message"].endswith("with ********"), s["hosts"]["b"]
    assert key not in out
    for path in run.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path


def test_the_support_bundles_check_knows_them_whatever_the_invocation(tree, tmp_path, monkeypatch):
    """The secrets the bundle is masked with and checked against (the status run's masker):
    found for an inventory file, and under a vault id the environment gives
    (ANSIBLE_VAULT_IDENTITY_LIST, as ansible-playbook reads it)."""
    from kunlun_fleet import support

    assert tree["key"] in runner.vault_secrets(os.path.join(tree["inv"], "hosts.yml"))
    inv, password, key = labelled_inventory(tree, "inv-env")
    assert key not in runner.vault_secrets(str(inv))
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", "prod@%s" % password)
    for inventory in (str(inv), str(inv / "hosts.yml")):
        assert key in runner.vault_secrets(inventory), inventory
    masker = runner.Masker(runner.vault_secrets(str(inv / "hosts.yml")))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "journal-tail.txt").write_text("started with --api-key-file, key %s\n" % key)
    with tarfile.open(tmp_path / "b.tar.gz", "w:gz") as tar:
        tar.add(str(tmp_path / "b"), arcname="b")
    assert support.secrets_in(tmp_path / "b.tar.gz", masker) == ["b/journal-tail.txt"]


def test_the_vault_passwords_of_the_arguments_as_ansible_reads_them(monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", "dev@/etc/dev-pw, /etc/plain-pw")
    args = [
        "--check",
        "--vault-id",
        "prod@/etc/prod-pw",
        "--vault-id=/etc/bare",
        "--vault-pass-file",
        "/etc/f",
        "-e",
        "x=1",
    ]
    assert runner.vault_sources(args) == [
        ("prod", "/etc/prod-pw"),
        ("default", "/etc/bare"),
        ("default", "/etc/f"),
        ("dev", "/etc/dev-pw"),
        ("default", "/etc/plain-pw"),
    ]
