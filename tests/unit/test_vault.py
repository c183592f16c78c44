"""The fleet's API key: made once, vaulted, readable only with the password, never printed."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

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
