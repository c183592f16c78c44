"""The fleet's API key: made once, vaulted, readable only with the password, never printed."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import vault

ROOT = Path(__file__).resolve().parents[2]


def test_made_once_and_kept(tmp_path):
    created, path = vault.ensure_api_key(str(tmp_path))
    assert created
    key = vault.read_api_key(str(tmp_path))
    assert key.startswith("kf-") and len(key) > 40
    text = Path(path).read_text()
    assert key not in text and "$ANSIBLE_VAULT;1.1;AES256" in text
    for f in (path, tmp_path / ".vault-password"):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    created, _ = vault.ensure_api_key(str(tmp_path))
    assert not created and vault.read_api_key(str(tmp_path)) == key


def test_ansible_reads_it_with_the_password_only(tmp_path):
    vault.ensure_api_key(str(tmp_path))
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n      ansible_connection: local\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    cmd = [
        str(ROOT / ".venv/bin/ansible"),
        "-i",
        str(tmp_path),
        "h1",
        "-m",
        "ansible.builtin.debug",
        "-a",
        "msg={{ vault_kunlun_api_key | length }}",
    ]
    without = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert "no vault secrets found" in without.stdout + without.stderr
    env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(tmp_path / ".vault-password")
    withpw = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert withpw.returncode == 0 and "msg: %d" % len(vault.read_api_key(str(tmp_path))) in withpw.stdout


def test_vault_without_its_password_is_refused_not_replaced(tmp_path):
    _, path = vault.ensure_api_key(str(tmp_path))
    before = Path(path).read_text()
    (tmp_path / ".vault-password").unlink()
    with pytest.raises(SystemExit, match="vault password file .* does not"):
        vault.ensure_api_key(str(tmp_path))
    assert Path(path).read_text() == before


def test_cli_never_prints_the_key_unless_asked(tmp_path):
    cli = [sys.executable, "-m", "kunlun_fleet.cli", "api-key", "-i", str(tmp_path)]
    made = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    key = vault.read_api_key(str(tmp_path))
    assert key not in made.stdout + made.stderr and "made the fleet's API key" in made.stdout
    again = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT)
    assert "kept the fleet's API key" in again.stdout and key not in again.stdout
    shown = subprocess.run(cli + ["--show"], capture_output=True, text=True, cwd=ROOT)
    assert shown.stdout.strip() == key


# ---------------------------------------------------------------- a password script
def _script(path, password, client=False):
    """An executable vault password file, as Ansible runs one: it prints the password (a
    -client script only when asked for the id --vault-password-file gives, `default`)."""
    if client:
        body = (
            'if [ "$1" = --vault-id ] && [ "$2" = default ]; then echo %s; exit 0; fi\n'
            'echo "no secret for $*" >&2; exit 2\n' % password
        )
    else:
        body = "echo %s\n" % password
    path.write_text("#!/bin/sh\n# prints the vault password\n" + body)
    path.chmod(0o700)
    return path


@pytest.mark.parametrize("name", ["vault-pass.sh", "vault-client.sh"])
def test_an_executable_password_file_is_run_as_ansible_runs_it(tmp_path, name):
    """api-key vaults the key under the script's output, not its source: Ansible (given the
    same file) opens it, and so do kunlun-fleet's own readers."""
    inv = tmp_path / "inv"
    inv.mkdir()
    script = _script(tmp_path / name, "pw-from-the-script", client="client" in name)
    created, path = vault.ensure_api_key(str(inv), str(script))
    assert created and not (inv / ".vault-password").exists()
    key = vault.read_api_key(str(inv), str(script))
    ciphertext = yaml.load(Path(path).read_text(), Loader=vault._loader())[vault.KEY_VAR]
    assert vault._vault("pw-from-the-script").decrypt(ciphertext.encode()).decode() == key
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n      ansible_connection: local\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_VAULT_PASSWORD_FILE=str(script))
    cmd = [str(ROOT / ".venv/bin/ansible"), "-i", str(inv), "h1", "-m", "ansible.builtin.debug"]
    shown = subprocess.run(
        cmd + ["-a", "msg={{ vault_kunlun_api_key | length }}"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0 and "msg: %d" % len(key) in shown.stdout, shown.stdout + shown.stderr
    # A client key, added under the same script, opens with it too.
    client = vault.add_client_key(str(inv), "team-a", str(script))
    assert vault.read_client_key(str(inv), "team-a", str(script)) == client


def test_a_password_script_that_fails_is_refused_naming_it(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    script = tmp_path / "vault-pass.sh"
    script.write_text("#!/bin/sh\necho 'the vault is locked' >&2\nexit 1\n")
    script.chmod(0o700)
    with pytest.raises(SystemExit, match=r"vault password file %s gives no password .*returned non-zero" % script):
        vault.ensure_api_key(str(inv), str(script))
    assert not (inv / vault.VAULT_FILE).exists()


def test_a_link_planted_at_the_old_temporary_name_does_not_redirect_the_secret(tmp_path):
    """The password and vault.yml go through a new file of a unique name (created exclusively,
    0600), never through whatever sits at <file>.tmp: a link there is left alone, and so is
    the file it points at."""
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("not a secret\n")
    victim.chmod(0o644)
    for name in (".vault-password.tmp", "group_vars/all/vault.yml.tmp"):
        (inv / name).symlink_to(victim)
    vault.ensure_api_key(str(inv))
    assert victim.read_text() == "not a secret\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert vault.read_api_key(str(inv)).startswith("kf-")
    for name in (".vault-password", "group_vars/all/vault.yml"):
        assert stat.S_IMODE(os.lstat(inv / name).st_mode) == 0o600 and (inv / name).is_file(), name
    # Nothing of the writes is left beside the files but the planted links.
    left = sorted(str(p.relative_to(inv)) for p in inv.rglob("*") if p.is_symlink() or ".tmp" in p.name)
    assert left == [".vault-password.tmp", "group_vars/all/vault.yml.tmp"]
