"""The fleet's API key: generated once per inventory, kept in an ansible-vault file.

Layout inside an inventory directory:
  .vault-password              the vault password (mode 0600, never committed)
  group_vars/all/vault.yml     ``vault_kunlun_api_key: !vault |`` (the value encrypted inline,
                               as `ansible-vault encrypt_string` writes it)

Inline, so that only the plays that use the key need the vault password: Ansible
decrypts a vaulted value when it is first used.

Roles read ``vault_kunlun_api_key`` (serve, gateway, acceptance) and never log it.
Nothing here prints the key unless asked to with ``show_api_key``.
"""

import os
import secrets

PASSWORD_FILE = ".vault-password"
VAULT_FILE = os.path.join("group_vars", "all", "vault.yml")
KEY_VAR = "vault_kunlun_api_key"


def paths(inventory_dir):
    return (os.path.join(inventory_dir, PASSWORD_FILE), os.path.join(inventory_dir, VAULT_FILE))


def _vault(password):
    from ansible.constants import DEFAULT_VAULT_ID_MATCH
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(password.encode()))])


def _write_private(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def ensure_api_key(inventory_dir, password_file=None):
    """Create the vault password and the encrypted key if they are missing.

    Returns (created, vault_path). An existing vault.yml is never rewritten: the key is
    made once per fleet. A vault.yml without its password file is an error (the key
    could not be read; making a new one would lock out every client)."""
    default_pw, vault_path = paths(inventory_dir)
    pw_path = password_file or default_pw
    if os.path.exists(vault_path):
        if not os.path.exists(pw_path):
            raise SystemExit(
                "%s exists but its vault password file %s does not: give the password file with "
                "--vault-password-file (or put it back); a new key is not generated over an existing one"
                % (vault_path, pw_path)
            )
        read_api_key(inventory_dir, pw_path)  # proves the password opens it
        return False, vault_path
    if not os.path.exists(pw_path):
        _write_private(pw_path, (secrets.token_urlsafe(32) + "\n").encode())
    password = open(pw_path).read().strip()
    key = "kf-" + secrets.token_urlsafe(32)
    armored = _vault(password).encrypt(key.encode()).decode()
    text = (
        "# The fleet's API key (clients send it as a Bearer token). Made once by\n"
        "# `kunlun-fleet api-key`; print it with `kunlun-fleet api-key -i INVENTORY --show`.\n"
        "---\n%s: !vault |\n%s" % (KEY_VAR, "".join("  %s\n" % line for line in armored.splitlines()))
    )
    _write_private(vault_path, text.encode())
    return True, vault_path


def read_api_key(inventory_dir, password_file=None):
    import yaml

    default_pw, vault_path = paths(inventory_dir)
    password = open(password_file or default_pw).read().strip()

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))
    data = yaml.load(open(vault_path).read(), Loader=Loader) or {}
    if not data.get(KEY_VAR):
        raise SystemExit("%s holds no %s" % (vault_path, KEY_VAR))
    return _vault(password).decrypt(data[KEY_VAR].encode()).decode()


def vault_env(inventory_dir, env=None):
    """env with ANSIBLE_VAULT_PASSWORD_FILE set to the inventory's password file, when it
    has one and the caller has not chosen another."""
    env = dict(os.environ if env is None else env)
    pw_path = paths(inventory_dir)[0]
    if "ANSIBLE_VAULT_PASSWORD_FILE" not in env and os.path.exists(pw_path):
        env["ANSIBLE_VAULT_PASSWORD_FILE"] = os.path.abspath(pw_path)
    return env
