"""The teams' client keys in the inventory's vault (kunlun_fleet/vault.py) and
`kunlun-fleet api-key add|revoke|rotate|list|apply|show`: each value encrypted on its own,
every other line of vault.yml untouched, refusals that change nothing, and no key on stdout
or stderr, in the run reports or in Ansible's output, except the one print of a new key
(and `show`)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import vault

ROOT = Path(__file__).resolve().parents[2]

# A vault.yml as a site keeps it: the fleet key, another secret, a comment and a plain value.
OTHER = "# site secrets\nvault_gateway_tls_key: !vault |\n{tls}\nsite_note: kept as it is  # a comment\n"


def armor(inv, secret):
    password = (Path(inv) / ".vault-password").read_text().strip()
    return "\n".join("  " + line for line in vault._vault(password).encrypt(secret.encode()).decode().splitlines())


@pytest.fixture
def inv(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    vault.ensure_api_key(str(inv))
    path = inv / "group_vars/all/vault.yml"
    path.write_text(path.read_text() + OTHER.format(tls=armor(inv, "-----BEGIN PRIVATE KEY-----tls")))
    return inv


def text_of(inv):
    return (Path(inv) / "group_vars/all/vault.yml").read_text()


def outside_block(text):
    """vault.yml's lines other than the client keys' block (and the comment that opens it)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith(vault.CLIENTS_VAR):
            skipping = True
            continue
        if skipping and line[:1] == " ":
            continue
        skipping = False
        if "Client keys, one per team" in line or "accepts each and sends the workers" in line:
            continue
        out.append(line)
    return out


def load(inv):
    return yaml.load(text_of(inv), Loader=vault._loader())


def test_add_rotate_revoke_list_each_value_encrypted_the_rest_untouched(inv):
    before = text_of(inv)
    fleet = vault.read_api_key(str(inv))
    a = vault.add_client_key(str(inv), "team-a")
    b = vault.add_client_key(str(inv), "team-b")
    assert a != b and a.startswith("kf-") and len(a) > 40
    assert vault.client_names(str(inv)) == ["team-a", "team-b"]
    data = load(inv)
    assert set(data[vault.CLIENTS_VAR]) == {"team-a", "team-b"}
    # Each value its own !vault, decrypting to its key; no key in clear anywhere.
    assert text_of(inv).count("!vault |") == 4
    assert all(isinstance(v, vault._Vaulted) for v in data[vault.CLIENTS_VAR].values())
    assert vault.read_client_key(str(inv), "team-a") == a and vault.read_client_key(str(inv), "team-b") == b
    assert vault.read_client_key(str(inv), "fleet") == fleet
    assert not any(k in text_of(inv) for k in (a, b, fleet))
    assert outside_block(text_of(inv)) == before.splitlines()
    assert os.stat(inv / "group_vars/all/vault.yml").st_mode & 0o777 == 0o600

    # list: every name added, none applied yet; then applied; then what changed since.
    assert vault.client_states(str(inv)) == [("fleet", "added"), ("team-a", "added"), ("team-b", "added")]
    vault.record_applied(str(inv), vault.client_fingerprints(str(inv)))
    record = json.loads((inv / vault.APPLIED_FILE).read_text())
    assert not any(k in json.dumps(record) for k in (a, b, fleet))
    assert [s for _, s in vault.client_states(str(inv))] == ["applied"] * 3

    b2 = vault.rotate_client_key(str(inv), "team-b")
    assert b2 != b and vault.read_client_key(str(inv), "team-b") == b2
    ciphertext_a = load(inv)[vault.CLIENTS_VAR]["team-a"]
    vault.revoke_client_key(str(inv), "team-a")
    c = vault.add_client_key(str(inv), "team-c")
    assert vault.client_states(str(inv)) == [
        ("fleet", "applied"),
        ("team-a", "revoked"),
        ("team-b", "rotated"),
        ("team-c", "added"),
    ]
    # An unchanged client keeps its ciphertext (a small diff in version control).
    ciphertext_c = load(inv)[vault.CLIENTS_VAR]["team-c"]
    vault.add_client_key(str(inv), "team-d")
    assert load(inv)[vault.CLIENTS_VAR]["team-c"] == ciphertext_c
    assert ciphertext_a not in text_of(inv)
    assert outside_block(text_of(inv)) == before.splitlines()
    assert not any(k in text_of(inv) for k in (a, b, b2, c, fleet))
    for name in ("team-b", "team-c", "team-d"):
        vault.revoke_client_key(str(inv), name)
    assert load(inv)[vault.CLIENTS_VAR] == {} and f"{vault.CLIENTS_VAR}: {{}}" in text_of(inv)
    assert outside_block(text_of(inv)) == before.splitlines()


def map_through_ansible(inv, out, expr):
    """`expr` (the role's map expression over the vault's variables) written to `out` by
    Ansible's copy module, the vault opened with the inventory's password: the map's entries,
    and Ansible's output (which must hold no key)."""
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n      ansible_connection: local\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(inv / ".vault-password")
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible"),
            "-i",
            str(inv),
            "h1",
            "-e",
            "ansible_python_interpreter=%s" % sys.executable,
            "-m",
            "ansible.builtin.copy",
            "-a",
            "content={{ %s }} dest=%s mode=0600" % (expr, out),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split() for line in out.read_text().splitlines() if line[:1] != "#"], proc.stdout + proc.stderr


def test_ansible_reads_each_key_and_the_role_s_filter_maps_them(inv, tmp_path):
    a = vault.add_client_key(str(inv), "team-a")
    b = vault.add_client_key(str(inv), "team-b")
    expr = "vault_kunlun_client_keys | gateway_client_map(vault_kunlun_api_key)"
    entries, _ = map_through_ansible(inv, tmp_path / "clients.map", expr)
    assert entries == [[vault.read_api_key(str(inv)), "fleet"], [a, "team-a"], [b, "team-b"]]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda inv: vault.add_client_key(inv, "team-a"), "client 'team-a' has a key already: .* rotate team-a"),
        (lambda inv: vault.revoke_client_key(inv, "team-x"), r"no client 'team-x' .*\(the clients: team-a\)"),
        (lambda inv: vault.rotate_client_key(inv, "team-x"), "no client 'team-x'"),
        (lambda inv: vault.read_client_key(inv, "team-x"), "no client 'team-x'"),
        (lambda inv: vault.add_client_key(inv, "fleet"), "'fleet' is the fleet key's own name"),
        (lambda inv: vault.revoke_client_key(inv, "fleet"), "'fleet' is the fleet key's own name.*not revoked"),
        (lambda inv: vault.rotate_client_key(inv, "fleet"), "not rotated"),
        (lambda inv: vault.add_client_key(inv, "Team A"), "'Team A' is not a client name: lowercase letters"),
        (lambda inv: vault.add_client_key(inv, "a" * 64), "is not a client name"),
        (lambda inv: vault.add_client_key(inv, "-a"), "is not a client name"),
    ],
)
def test_refusals_name_the_fix_and_change_nothing(inv, change, message):
    vault.add_client_key(str(inv), "team-a")
    before = text_of(inv)
    with pytest.raises(vault.Refused, match=message):
        change(str(inv))
    assert text_of(inv) == before


def test_a_vault_that_cannot_be_edited_safely_is_refused(inv, tmp_path):
    before = text_of(inv)
    # the wrong password
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    with pytest.raises(vault.Refused, match="does not open"):
        vault.add_client_key(str(inv), "team-a", str(wrong))
    # no password file
    os.rename(inv / ".vault-password", tmp_path / "pw")
    with pytest.raises(vault.Refused, match="its vault password file .* does not"):
        vault.add_client_key(str(inv), "team-a")
    os.rename(tmp_path / "pw", inv / ".vault-password")
    # a block written by hand with a value in clear
    path = inv / "group_vars/all/vault.yml"
    path.write_text(before + "vault_kunlun_client_keys:\n  team-a: in-clear-0123456789\n")
    with pytest.raises(vault.Refused, match="is not a mapping of client name to a !vault value"):
        vault.add_client_key(str(inv), "team-b")
    # an explicit end of document after which an appended block would not be read
    path.write_text(before + "...\n")
    with pytest.raises(vault.Refused, match="could not be edited safely"):
        vault.add_client_key(str(inv), "team-b")
    assert path.read_text() == before + "...\n"
    # a vault.yml encrypted as a whole
    password = (inv / ".vault-password").read_text().strip()
    path.write_text(vault._vault(password).encrypt(before.encode()).decode())
    with pytest.raises(vault.Refused, match="encrypted as a whole"):
        vault.add_client_key(str(inv), "team-b")
    # no vault.yml at all
    path.unlink()
    with pytest.raises(vault.Refused, match="the inventory has no fleet key yet"):
        vault.revoke_client_key(str(inv), "team-a")


# ---------------------------------------------------------------- the command line


@pytest.fixture
def checkout(tmp_path):
    """The project's playbooks and roles in a tree of their own (KUNLUN_FLEET_ROOT), so that
    the run reports land there; an inventory whose one gateway is this machine (local
    connection), its proxy configuration in the test's directory."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("ansible.cfg", "playbooks", "roles", "library", "module_utils", "plugins"):
        (tree / name).symlink_to(ROOT / name)
    inv = tmp_path / "inv"
    inv.mkdir()
    proxy = tmp_path / "proxy"
    proxy.mkdir()
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "ansible_become": False,
        "gateway_proxy_config": str(proxy / "haproxy.cfg"),
        "gateway_proxy_client_map": str(proxy / "kunlun-clients.map"),
        "gateway_proxy_internal_map": str(proxy / "kunlun-internal.map"),
        # The router's key file (router_key.yml) beside the maps, never this machine's /etc.
        "gateway_config_dir": str(proxy),
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gateways": {"hosts": {"gw": host}}}}}))
    env = dict(os.environ, KUNLUN_FLEET_ROOT=str(tree), PYTHONUNBUFFERED="1", ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)  # the session's is the sim fleet's
    return {"tree": tree, "inv": inv, "proxy": proxy, "env": env}


def cli(checkout, *args):
    return subprocess.run(
        [sys.executable, "-m", "kunlun_fleet.cli", "api-key", "-i", str(checkout["inv"]), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=checkout["env"],
        timeout=300,
    )


def test_the_cli_prints_a_key_only_once_when_made_and_tries_to_apply_each_change(checkout):
    inv, outputs = str(checkout["inv"]), []

    def run(*args, rc=0):
        proc = cli(checkout, *args)
        outputs.append((args, proc))
        assert proc.returncode == rc, (args, proc.stdout[-3000:], proc.stderr[-3000:])
        return proc

    # A proxy the gateway stage has not configured for client keys yet: the apply fails there
    # with the fix, changing nothing (a real run of the clients entry point up to that check;
    # a real apply's reload needs systemd and HAProxy: tests/unit/test_gateway_clients_haproxy.py
    # has HAProxy's side).
    (checkout["proxy"] / "haproxy.cfg").write_text("global\n")
    added = run("add", "team-a", rc=2)
    key_a = vault.read_client_key(inv, "team-a")
    assert added.stdout == key_a + "\n"
    assert "printed this once" in added.stderr and "made the fleet's API key first" in added.stderr
    assert "does not read client keys: the gateway stage has not" in added.stderr
    assert "not applied on every gateway (exit code 2" in added.stderr and "api-key -i %s apply" % inv in added.stderr
    assert not list(checkout["proxy"].glob("*.map"))
    fleet = vault.read_api_key(inv)
    assert run("list").stdout.splitlines() == [
        "fleet   the fleet key: the workers' own, always accepted (not applied by `api-key apply` yet)",
        "team-a  added, not applied yet (the gateways refuse it until `apply`)",
    ]
    key_b = run("add", "team-b", "--no-apply").stdout.strip()
    assert key_b == vault.read_client_key(inv, "team-b")
    # As a successful apply leaves it (kunlun_fleet/cli.py records it after rc 0).
    vault.record_applied(inv, vault.client_fingerprints(inv))
    assert [line.split()[:2] for line in run("list").stdout.splitlines()] == [
        ["fleet", "the"],
        ["team-a", "applied"],
        ["team-b", "applied"],
    ]
    rotated = run("rotate", "team-a", rc=2)
    key_a2 = rotated.stdout.strip()
    assert key_a2 == vault.read_client_key(inv, "team-a") != key_a
    run("revoke", "team-b", "--no-apply")
    assert run("list").stdout.splitlines()[1:] == [
        "team-a  rotated, not applied yet (the gateways accept the old key until `apply`)",
        "team-b  revoked, not applied yet (the gateways accept it until `apply`)",
    ]
    run("apply", rc=2)
    # refusals: exit code 3, nothing changed, no key
    before = text_of(inv)
    run("add", "team-a", rc=3)
    run("revoke", "nobody", rc=3)
    run("rotate", "fleet", rc=3)
    run("add", rc=3)
    run("list", "team-a", rc=3)
    run("--show", "add", "x", rc=3)
    assert text_of(inv) == before
    # asked for: show NAME and --show (the fleet key), as before
    shown = run("show", "team-a")
    assert shown.stdout == key_a2 + "\n"
    assert run("--show").stdout == fleet + "\n"
    assert "kept the fleet's API key" in run().stdout

    # Every key appears only where it was asked for: add/rotate's one line, show, --show.
    allowed = {
        key_a: [(("add", "team-a"), "stdout")],
        key_b: [(("add", "team-b", "--no-apply"), "stdout")],
        key_a2: [(("rotate", "team-a"), "stdout"), (("show", "team-a"), "stdout")],
        fleet: [(("--show",), "stdout")],
    }
    for key, where in allowed.items():
        found = [
            (args, stream) for args, proc in outputs for stream in ("stdout", "stderr") if key in getattr(proc, stream)
        ]
        assert found == where, (key[:6], found)
        for args, stream in where:
            text = getattr(next(p for a, p in outputs if a == args), stream)
            assert text.count(key) == 1
    # The run reports (every event, ansible-runner's artifacts) hold none.
    reports = checkout["tree"] / "reports" / "runs"
    assert len(list(reports.iterdir())) == 3
    for path in reports.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(key in text for key in allowed), path


def test_the_clients_entry_point_never_shows_a_key_even_with_diff(checkout):
    """playbooks/api_keys.yml in check mode with --diff -vv where the proxy reads client
    keys: the map tasks run (and would change), the reload is announced; no key is shown."""
    inv = str(checkout["inv"])
    vault.ensure_api_key(inv)
    key = vault.add_client_key(inv, "team-a")
    fleet = vault.read_api_key(inv)
    (checkout["proxy"] / "haproxy.cfg").write_text("# reads %s\n" % (checkout["proxy"] / "kunlun-clients.map"))
    env = dict(checkout["env"], ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            inv,
            "--vault-password-file",
            str(checkout["inv"] / ".vault-password"),
            str(ROOT / "playbooks/api_keys.yml"),
            "--check",
            "--diff",
            "-vv",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"changed: \[gw\]", out) and "would reload haproxy.service" in out, out[-3000:]
    assert "The map of every accepted key to its client" in out
    assert key not in out and fleet not in out
    assert not list(checkout["proxy"].glob("*.map"))


def test_a_bad_client_in_the_vault_is_refused_by_the_role_naming_it_not_its_key(checkout):
    inv = str(checkout["inv"])
    vault.ensure_api_key(inv)
    fleet = vault.read_api_key(inv)
    path = checkout["inv"] / "group_vars/all/vault.yml"
    # two clients with the same key, put there by hand
    password = (checkout["inv"] / ".vault-password").read_text().strip()
    shared = "kf-shared-0123456789abcdefghij"
    value = "\n".join("    " + line for line in vault._vault(password).encrypt(shared.encode()).decode().splitlines())
    path.write_text(
        path.read_text() + "vault_kunlun_client_keys:\n  a: !vault |\n%s\n  b: !vault |\n%s\n" % (value, value)
    )
    (checkout["proxy"] / "haproxy.cfg").write_text("# reads %s\n" % (checkout["proxy"] / "kunlun-clients.map"))
    proc = cli(checkout, "apply")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "clients a and b have the same key: give each a key of its own" in out, out[-3000:]
    assert shared not in out and fleet not in out
    assert not list(checkout["proxy"].glob("*.map"))


# ---------------------------------------------------------------- the fleet key's rotation


def test_the_fleet_key_rotated_the_old_one_kept_until_finish_the_rest_untouched(inv):
    a = vault.add_client_key(str(inv), "team-a")
    before = load(inv)
    old = vault.read_api_key(str(inv))
    assert not vault.fleet_key_rotating(str(inv))
    new = vault.rotate_fleet_key(str(inv))
    assert new != old and new.startswith("kf-") and vault.read_api_key(str(inv)) == new
    assert vault.fleet_key_rotating(str(inv))
    data = load(inv)
    password = (inv / ".vault-password").read_text().strip()
    assert vault._vault(password).decrypt(data[vault.PREVIOUS_VAR].encode()).decode() == old
    # The old ciphertext moved as it was; everything else as it was; no key in clear.
    assert data[vault.PREVIOUS_VAR].strip() == before[vault.KEY_VAR].strip()
    assert {k: v for k, v in data.items() if k not in (vault.KEY_VAR, vault.PREVIOUS_VAR)} == {
        k: v for k, v in before.items() if k != vault.KEY_VAR
    }
    assert vault.read_client_key(str(inv), "team-a") == a
    assert not any(k in text_of(inv) for k in (a, old, new))
    assert set(vault.client_fingerprints(str(inv))) == {vault.FLEET, vault.FLEET_PREVIOUS, "team-a"}
    # One rotation at a time; a client key's change leaves the rotation as it is.
    with pytest.raises(vault.Refused, match="runs already .* rotate --finish"):
        vault.rotate_fleet_key(str(inv))
    vault.add_client_key(str(inv), "team-b")
    assert vault.fleet_key_rotating(str(inv)) and vault.read_api_key(str(inv)) == new
    middle = text_of(inv)
    vault.finish_fleet_key(str(inv))
    assert not vault.fleet_key_rotating(str(inv)) and vault.read_api_key(str(inv)) == new
    assert vault.PREVIOUS_VAR not in text_of(inv) and "being replaced" not in text_of(inv)
    assert len(text_of(inv).splitlines()) < len(middle.splitlines())
    assert vault.client_names(str(inv)) == ["team-a", "team-b"]
    with pytest.raises(vault.Refused, match="no rotation of the fleet key runs"):
        vault.finish_fleet_key(str(inv))
    # The file stays private through both steps (Ansible reading it: the map test below).
    assert os.stat(inv / "group_vars/all/vault.yml").st_mode & 0o777 == 0o600


def test_the_role_s_map_accepts_both_fleet_keys_while_a_rotation_runs(inv, tmp_path):
    a = vault.add_client_key(str(inv), "team-a")
    old = vault.read_api_key(str(inv))
    new = vault.rotate_fleet_key(str(inv))
    expr = "vault_kunlun_client_keys | gateway_client_map(vault_kunlun_api_key, vault_kunlun_api_key_previous)"
    entries, output = map_through_ansible(inv, tmp_path / "clients.map", expr)
    assert entries == [[new, "fleet"], [old, "fleet"], [a, "team-a"]]
    assert not any(k in output for k in (a, old, new))


def test_the_cli_rotates_the_fleet_key_in_two_steps_printing_the_new_key_once(checkout):
    inv, outputs = str(checkout["inv"]), []

    def run(*args, rc=0):
        proc = cli(checkout, *args)
        outputs.append((args, proc))
        assert proc.returncode == rc, (args, proc.stdout[-3000:], proc.stderr[-3000:])
        return proc

    vault.ensure_api_key(inv)
    old = vault.read_api_key(inv)
    vault.record_applied(inv, vault.client_fingerprints(inv))
    # Refusals first: exit 3, nothing changed.
    before = text_of(inv)
    run("rotate", "--finish", rc=3)
    run("rotate", "team-a", "--finish", rc=3)
    run("list", "--finish", rc=3)
    assert text_of(inv) == before
    rotated = run("rotate", "--no-apply")
    new = rotated.stdout.strip()
    assert new == vault.read_api_key(inv) != old and rotated.stdout == new + "\n"
    assert "rotate --finish" in rotated.stderr and "Not applied (--no-apply)" in rotated.stderr
    assert run("list").stdout.splitlines() == [
        "fleet             the fleet key: the workers' own, always accepted (not applied by `api-key apply` yet)",
        "fleet (previous)  the fleet key a rotation replaces: still accepted, until `api-key rotate --finish` "
        "(not applied by `api-key apply` yet)",
    ]
    run("rotate", "--no-apply", rc=3)  # one rotation at a time
    finished = run("rotate", "--finish", "--no-apply")
    assert finished.stdout == "" and "is finished" in finished.stderr
    assert not vault.fleet_key_rotating(inv) and vault.read_api_key(inv) == new
    # The new key appears once, on the rotation's stdout; the old one nowhere.
    for args, proc in outputs:
        text = proc.stdout + proc.stderr
        assert old not in text, args
        assert text.count(new) == (1 if args == ("rotate", "--no-apply") and proc.returncode == 0 else 0), args
