"""The fleet's API key: generated once per inventory, kept in an ansible-vault file.

Layout inside an inventory directory:
  .vault-password              the vault password (mode 0600, never committed)
  group_vars/all/vault.yml     ``vault_kunlun_api_key: !vault |`` (the value encrypted inline,
                               as `ansible-vault encrypt_string` writes it)

Inline, so that only the plays that use the key need the vault password: Ansible
decrypts a vaulted value when it is first used.

Roles read ``vault_kunlun_api_key`` (serve, gateway, acceptance) and never log it.
Nothing here prints the key unless asked to with ``show_api_key``.

Client keys, one per team (docs/gateway.md "Client keys"), in the same file:

  vault_kunlun_client_keys:
    team-a: !vault |
      $ANSIBLE_VAULT;1.1;AES256
      ...

each value encrypted on its own; and, while a rotation of the fleet key runs (`rotate`
without a name, until `rotate --finish`), ``vault_kunlun_api_key_previous``: the key it
replaces, still accepted. add/revoke/rotate rewrite their block only: every other
line of vault.yml stays as it was (checked after each edit, before the file is replaced).
The gateway role makes HAProxy's key map of them (roles/gateway/tasks/client_maps.yml).
"""

import datetime
import hashlib
import json
import os
import re
import secrets
import tempfile

PASSWORD_FILE = ".vault-password"
VAULT_FILE = os.path.join("group_vars", "all", "vault.yml")
KEY_VAR = "vault_kunlun_api_key"
# During a rotation of the fleet key (`api-key rotate` until `rotate --finish`): the key it
# replaces, still accepted by the workers and the gateways (docs/gateway.md "Rotating the
# fleet key").
PREVIOUS_VAR = "vault_kunlun_api_key_previous"
CLIENTS_VAR = "vault_kunlun_client_keys"
# The record of the last `kunlun-fleet api-key apply` (client name -> fingerprint), beside the
# password file; a dot file, so neither Ansible's inventory nor the masker reads it.
APPLIED_FILE = ".api-keys-applied.json"
# As plugins/filter/gateway_clients.py (the role refuses what this refuses).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
NAME_RULE = "lowercase letters, digits, - and _, starting with a letter or digit, at most 63 characters"
FLEET = "fleet"
# The fingerprint of the key a fleet-key rotation replaces, in the applied record.
FLEET_PREVIOUS = "fleet (previous)"


class Refused(Exception):
    """A change refused before anything was written; the message names the fix."""


def paths(inventory_dir):
    return (os.path.join(inventory_dir, PASSWORD_FILE), os.path.join(inventory_dir, VAULT_FILE))


def _vault(password):
    from ansible.constants import DEFAULT_VAULT_ID_MATCH
    from ansible.parsing.vault import VaultLib, VaultSecret

    if not isinstance(password, bytes):  # as read_password returns it, or text
        password = password.encode()
    return VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(password))])


def read_password(path, refused=Refused):
    """The vault password in `path` as ansible-playbook reads it (get_file_vault_secret of
    ansible/parsing/vault/__init__.py): an executable file is run and its stdout is the
    password (a name ending in -client, as vault-client.py, is run with --vault-id default,
    the id --vault-password-file gives); any other file's content, stripped. Reading an
    executable as text would vault the key under the script's source."""
    from ansible.constants import DEFAULT_VAULT_IDENTITY
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import get_file_vault_secret

    try:
        secret = get_file_vault_secret(filename=path, vault_id=DEFAULT_VAULT_IDENTITY, loader=DataLoader())
        secret.load()
    except AnsibleError as exc:
        raise refused(
            "the vault password file %s gives no password (%s). Fix: the file holds the password, or is a script "
            "that prints it (executable; ansible-playbook runs it the same way)" % (path, str(exc).strip().rstrip("."))
        ) from None
    return secret.bytes


def _write_private(path, data):
    """`data` into `path`, mode 0600 from the first byte: written to a new file of a unique
    name in the same directory (created exclusively, never through a link someone put
    there), flushed to disk, then renamed over `path`."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
    password = read_password(pw_path, SystemExit)
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
    password = read_password(password_file or default_pw, SystemExit)

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


# ---------------------------------------------------------------- client keys


class _Vaulted(str):
    """An inline !vault value, as its ciphertext."""


def _loader():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!vault", lambda loader, node: _Vaulted(loader.construct_scalar(node)))
    return Loader


def _open(inventory_dir, password_file=None):
    """(vault password, vault.yml's path, its text, its data with !vault values as ciphertext);
    refused when either file is missing or the password does not open the fleet key."""
    import yaml

    default_pw, vault_path = paths(inventory_dir)
    pw_path = password_file or default_pw
    if not os.path.exists(vault_path):
        raise Refused(
            "%s does not exist: the inventory has no fleet key yet. Fix: `kunlun-fleet api-key -i %s` makes it "
            "(or `add NAME` makes both)" % (vault_path, inventory_dir)
        )
    if not os.path.exists(pw_path):
        raise Refused(
            "%s exists but its vault password file %s does not: give it with --vault-password-file (or put it back)"
            % (vault_path, pw_path)
        )
    password = read_password(pw_path)
    text = open(vault_path).read()
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        raise Refused(
            "%s is encrypted as a whole; kunlun-fleet keeps its values encrypted one by one (as `ansible-vault "
            "encrypt_string` writes them). Fix: `ansible-vault decrypt %s`, then encrypt each secret value with "
            "`ansible-vault encrypt_string`, and run this again" % (vault_path, vault_path)
        )
    try:
        data = yaml.load(text, Loader=_loader()) or {}
    except yaml.YAMLError as exc:
        raise Refused("%s is not YAML that can be edited (%s): fix it by hand first" % (vault_path, exc)) from None
    if not isinstance(data, dict):
        raise Refused("%s is not a mapping of variables: fix it by hand first" % vault_path)
    if not isinstance(data.get(KEY_VAR), str):
        raise Refused(
            "%s holds no %s. Fix: `kunlun-fleet api-key -i %s` makes the fleet key"
            % (vault_path, KEY_VAR, inventory_dir)
        )
    clients = data.get(CLIENTS_VAR)
    if clients is None:
        data[CLIENTS_VAR] = clients = {}
    if not isinstance(clients, dict) or any(not isinstance(v, _Vaulted) for v in clients.values()):
        raise Refused(
            "%s's %s is not a mapping of client name to a !vault value: fix it by hand (or remove it) first"
            % (vault_path, CLIENTS_VAR)
        )
    try:
        _vault(password).decrypt(data[KEY_VAR].encode())
    except Exception:
        raise Refused(
            "the vault password in %s does not open %s's %s: give the right one with --vault-password-file"
            % (pw_path, vault_path, KEY_VAR)
        ) from None
    return password, vault_path, text, data


def _check_name(name, verb):
    if name == FLEET:
        raise Refused(
            "'fleet' is the fleet key's own name (vault_kunlun_api_key, the key the workers check and the product's "
            "own clients use): it is not %s here. Choose another name for a team" % verb
        )
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise Refused("%r is not a client name: %s (for example team-a)" % (name, NAME_RULE))


def _block(clients):
    """vault.yml's lines for the client keys, {name: ciphertext}."""
    if not clients:
        return ["%s: {}" % CLIENTS_VAR]
    lines = ["%s:" % CLIENTS_VAR]
    for name in sorted(clients):
        lines.append("  %s: !vault |" % name)
        lines.extend("    %s" % line for line in str(clients[name]).strip().splitlines())
    return lines


def _block_span(lines, var):
    """(start, end) of the top-level `var:` block of vault.yml's lines (its key line and the
    indented lines under it); (None, None) when there is none."""
    start = next((i for i, line in enumerate(lines) if re.match(r"^%s\s*:" % var, line)), None)
    if start is None:
        return None, None
    end = start + 1
    while end < len(lines) and lines[end][:1] in (" ", "\t"):
        end += 1
    return start, end


def _read_back(text):
    """vault.yml's text as the edit would leave it, read as the checks compare it."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader()) or {}
    except yaml.YAMLError as exc:
        return {"<unreadable>": str(exc)}


def _write_clients(inventory_dir, vault_path, text, data, clients):
    """vault.yml with its client block replaced by `clients` ({name: ciphertext}), every
    other line as it was; checked by reading it back before it replaces the file."""
    lines = text.splitlines()
    start, end = _block_span(lines, CLIENTS_VAR)
    block = _block(clients)
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += [
            "# Client keys, one per team (kunlun-fleet api-key -i INV add|revoke|rotate NAME, list): the gateway",
            '# accepts each and sends the workers the fleet key in its place (docs/gateway.md "Client keys").',
        ] + block
    else:
        lines[start:end] = block
    new_text = "\n".join(lines) + "\n"
    after = _read_back(new_text)
    expected = dict(data, **{CLIENTS_VAR: dict(clients)})
    if after != expected or sorted(after.get(CLIENTS_VAR) or {}) != sorted(clients):
        raise Refused(
            "%s could not be edited safely (its %s block is not as kunlun-fleet writes it, or the file ends in a way "
            "that an appended block would change): nothing was written. Fix: put %s in its own block at the end of "
            "the file, each value a !vault, and run this again" % (vault_path, CLIENTS_VAR, CLIENTS_VAR)
        )
    _write_private(vault_path, new_text.encode())


def client_names(inventory_dir, password_file=None):
    """The client names of vault.yml, sorted (the fleet key's own "fleet" not among them)."""
    return sorted(_open(inventory_dir, password_file)[3][CLIENTS_VAR])


def _no_such(inventory_dir, name, clients):
    return Refused(
        "no client %r in %s (the clients: %s). `kunlun-fleet api-key -i %s list` lists them"
        % (name, paths(inventory_dir)[1], ", ".join(sorted(clients)) or "none", inventory_dir)
    )


def read_client_key(inventory_dir, name, password_file=None):
    """A client's key, decrypted (`api-key show NAME`; "fleet" is the fleet key)."""
    password, _, _, data = _open(inventory_dir, password_file)
    if name == FLEET:
        return _vault(password).decrypt(data[KEY_VAR].encode()).decode()
    clients = data[CLIENTS_VAR]
    if name not in clients:
        raise _no_such(inventory_dir, name, clients)
    return _vault(password).decrypt(clients[name].encode()).decode()


def _new_key(password):
    key = "kf-" + secrets.token_urlsafe(32)
    return key, _Vaulted(_vault(password).encrypt(key.encode()).decode())


def add_client_key(inventory_dir, name, password_file=None):
    """A new random key for a new client, encrypted into vault.yml; returns the key (for the
    one print the operator hands over). Refused for an existing or a bad name."""
    _check_name(name, "added")
    password, vault_path, text, data = _open(inventory_dir, password_file)
    clients = dict(data[CLIENTS_VAR])
    if name in clients:
        raise Refused(
            "client %r has a key already: `kunlun-fleet api-key -i %s rotate %s` makes it a new one, `show %s` "
            "prints the one it has" % (name, inventory_dir, name, name)
        )
    key, clients[name] = _new_key(password)
    _write_clients(inventory_dir, vault_path, text, data, clients)
    return key


def revoke_client_key(inventory_dir, name, password_file=None):
    """Removes a client's key from vault.yml. Refused for an unknown name."""
    _check_name(name, "revoked")
    _, vault_path, text, data = _open(inventory_dir, password_file)
    clients = dict(data[CLIENTS_VAR])
    if name not in clients:
        raise _no_such(inventory_dir, name, clients)
    del clients[name]
    _write_clients(inventory_dir, vault_path, text, data, clients)


def rotate_client_key(inventory_dir, name, password_file=None):
    """A new key for an existing client in place of its old one; returns the new key."""
    _check_name(name, "rotated")
    password, vault_path, text, data = _open(inventory_dir, password_file)
    clients = dict(data[CLIENTS_VAR])
    if name not in clients:
        raise _no_such(inventory_dir, name, clients)
    key, clients[name] = _new_key(password)
    _write_clients(inventory_dir, vault_path, text, data, clients)
    return key


def _fingerprint(key):
    """A short digest of a key: tells a rotated key from the applied one, reveals nothing of
    it (the keys are 256 random bits)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def client_fingerprints(inventory_dir, password_file=None):
    """{name: fingerprint} of every client key in vault.yml, the fleet key as "fleet"."""
    password, _, _, data = _open(inventory_dir, password_file)
    vlib = _vault(password)
    found = {FLEET: _fingerprint(vlib.decrypt(data[KEY_VAR].encode()).decode())}
    if PREVIOUS_VAR in data:
        found[FLEET_PREVIOUS] = _fingerprint(vlib.decrypt(data[PREVIOUS_VAR].encode()).decode())
    for name, ciphertext in data[CLIENTS_VAR].items():
        found[name] = _fingerprint(vlib.decrypt(ciphertext.encode()).decode())
    return found


def record_applied(inventory_dir, fingerprints):
    """The client keys the last successful `api-key apply` put on the gateways."""
    record = {
        "applied_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "clients": fingerprints,
    }
    _write_private(os.path.join(inventory_dir, APPLIED_FILE), (json.dumps(record, indent=1) + "\n").encode())


def applied_record(inventory_dir):
    """The record of the last `api-key apply` ({applied_at, clients}), or None."""
    try:
        with open(os.path.join(inventory_dir, APPLIED_FILE)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("clients"), dict) else None


def client_states(inventory_dir, password_file=None):
    """[(name, state)] for the fleet and every client, and the clients the last apply had
    that the vault no longer holds: "applied", "added", "rotated", "revoked" (the last three
    not applied yet: `api-key apply`)."""
    now = client_fingerprints(inventory_dir, password_file)
    record = applied_record(inventory_dir)
    before = record["clients"] if record else {}
    states = []
    for name in sorted(set(now) | set(before), key=lambda n: (n != FLEET, n)):
        if name not in now:
            states.append((name, "revoked"))
        elif name not in before:
            states.append((name, "added"))
        elif before[name] != now[name]:
            states.append((name, "rotated"))
        else:
            states.append((name, "applied"))
    return states


# ---------------------------------------------------------------- the fleet key's rotation


def _vault_lines(var, ciphertext):
    return ["%s: !vault |" % var] + ["  %s" % line for line in str(ciphertext).strip().splitlines()]


_PREVIOUS_COMMENT = "# The fleet key being replaced (kunlun-fleet api-key rotate): accepted until `rotate --finish`."


def _write_fleet_keys(vault_path, text, data, current, previous):
    """vault.yml with the fleet key's block holding `current` (ciphertext) and the previous
    key's block `previous` (ciphertext, or None: no block), every other line as it was;
    checked by reading it back before it replaces the file."""
    lines = text.splitlines()
    start, end = _block_span(lines, PREVIOUS_VAR)
    if start is not None:
        if start > 0 and lines[start - 1] == _PREVIOUS_COMMENT:
            start -= 1
        del lines[start:end]
    start, end = _block_span(lines, KEY_VAR)
    new = _vault_lines(KEY_VAR, current)
    if previous is not None:
        new += [_PREVIOUS_COMMENT] + _vault_lines(PREVIOUS_VAR, previous)
    lines[start:end] = new
    new_text = "\n".join(lines) + "\n"
    after = _read_back(new_text)
    expected = {k: v for k, v in data.items() if k != PREVIOUS_VAR}
    expected[KEY_VAR] = current
    if previous is not None:
        expected[PREVIOUS_VAR] = previous
    after.setdefault(CLIENTS_VAR, {})

    def same(a, b):
        return {k: (v.strip() if isinstance(v, str) else v) for k, v in a.items()} == {
            k: (v.strip() if isinstance(v, str) else v) for k, v in b.items()
        }

    if not same(after, expected):
        raise Refused(
            "%s could not be edited safely (its %s is not a !vault value in a block of its own as kunlun-fleet writes "
            "it): nothing was written. Fix: put %s: !vault | at the start of a line, its ciphertext indented below it"
            % (vault_path, KEY_VAR, KEY_VAR)
        )
    _write_private(vault_path, new_text.encode())


def fleet_key_rotating(inventory_dir, password_file=None):
    """True while a rotation of the fleet key runs (vault.yml holds the key it replaces)."""
    return PREVIOUS_VAR in _open(inventory_dir, password_file)[3]


def rotate_fleet_key(inventory_dir, password_file=None):
    """A new fleet key; the old one kept as PREVIOUS_VAR (accepted until finish_fleet_key).
    Returns the new key. Refused while a rotation runs already."""
    password, vault_path, text, data = _open(inventory_dir, password_file)
    if PREVIOUS_VAR in data:
        raise Refused(
            "a rotation of the fleet key runs already (%s holds %s): finish it first with `kunlun-fleet api-key -i %s "
            "rotate --finish` once every client uses the new key" % (vault_path, PREVIOUS_VAR, inventory_dir)
        )
    for name, ciphertext in data[CLIENTS_VAR].items():
        if not isinstance(ciphertext, _Vaulted):
            raise Refused("%s's client %s is not a !vault value: fix it by hand first" % (vault_path, name))
    key, ciphertext = _new_key(password)
    _write_fleet_keys(vault_path, text, data, ciphertext, _Vaulted(data[KEY_VAR]))
    return key


def finish_fleet_key(inventory_dir, password_file=None):
    """The rotation's end: the replaced key removed from vault.yml. Refused when none runs."""
    _, vault_path, text, data = _open(inventory_dir, password_file)
    if PREVIOUS_VAR not in data:
        raise Refused(
            "no rotation of the fleet key runs (%s holds no %s): `kunlun-fleet api-key -i %s rotate` begins one"
            % (vault_path, PREVIOUS_VAR, inventory_dir)
        )
    _write_fleet_keys(vault_path, text, data, _Vaulted(data[KEY_VAR]), None)
