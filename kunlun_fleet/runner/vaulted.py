"""The inventory's vaulted values, decrypted, for the masker (kunlun_fleet.runner.masking)."""

import contextlib
import io
import os
from pathlib import Path

# The vault id Ansible gives a password without a label (--vault-password-file, a bare
# --vault-id FILE): ansible.constants.DEFAULT_VAULT_IDENTITY.
DEFAULT_ID = "default"
# --vault-id sources that are answered at the prompt, not read from a file.
PROMPTS = ("prompt", "prompt_ask_vault_pass")


def vault_sources(args):
    """[(label, source)] of the vault passwords ansible-playbook's arguments name
    (--vault-id [label@]source, --vault-password-file FILE, in any spelling Ansible's own
    parser takes), then those of the environment it runs with (ANSIBLE_VAULT_IDENTITY_LIST,
    ANSIBLE_VAULT_PASSWORD_FILE), as ansible/cli/__init__.py builds them."""
    from ansible.cli.playbook import PlaybookCLI

    slugs, files = [], []
    cli = PlaybookCLI(["ansible-playbook"])
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            cli.init_parser()
            options, _ = cli.parser.parse_known_args(list(args) + ["playbook.yml"])
        slugs, files = list(options.vault_ids or []), list(options.vault_password_files or [])
    except (SystemExit, Exception):  # arguments ansible-playbook refuses: it says so itself
        pass
    return _sources(slugs, files) + env_sources()


def env_sources():
    """[(label, source)] of the vault passwords the environment gives ansible-playbook
    (ANSIBLE_VAULT_IDENTITY_LIST, ANSIBLE_VAULT_PASSWORD_FILE)."""
    slugs = [s.strip() for s in os.environ.get("ANSIBLE_VAULT_IDENTITY_LIST", "").split(",") if s.strip()]
    files = [os.environ["ANSIBLE_VAULT_PASSWORD_FILE"]] if os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") else []
    return _sources(slugs, files)


def _sources(slugs, files):
    """[(label, source)] of --vault-id slugs ([label@]source) and password files."""
    sources = []
    for slug in slugs:
        label, at, source = slug.partition("@")
        sources.append((label or DEFAULT_ID, source) if at else (DEFAULT_ID, slug))
    return sources + [(DEFAULT_ID, f) for f in files]


def inventory_files(inventory):
    """The files of an inventory that may hold vaulted values, as Ansible reads them: every
    file of an inventory directory; for an inventory file, the file and the group_vars and
    host_vars beside it. Dot files and directories are left out (.vault-password, .ssh)."""
    if os.path.isdir(inventory):
        base, found = Path(inventory), Path(inventory).rglob("*")
    elif os.path.isfile(inventory):
        base = Path(inventory).parent
        found = [Path(inventory)] + [p for d in ("group_vars", "host_vars") for p in (base / d).rglob("*")]
    else:  # a host list ("h1,h2,"): nothing vaulted
        return []
    files = []
    for path in sorted(set(found)):
        if path.suffix not in (".yml", ".yaml", ".json", "") or not path.is_file():
            continue
        if any(part.startswith(".") for part in path.relative_to(base).parts):
            continue
        files.append(path)
    return files


def vault_secrets(inventory, password_file=None, password=None, vault_ids=()):
    """Every vaulted value of an inventory (inline `!vault` values and vaulted files: a
    directory, or an inventory file with the group_vars and host_vars beside it),
    decrypted, to be masked wherever they would be printed or stored; the passwords too.
    Decrypted with every password the run has: `password_file` and `vault_ids` (given to
    ansible-playbook, [(label, source)]: vault_sources), the environment's, the inventory's
    own .vault-password, and `password` (asked for at the prompt). Values shorter than 8
    characters are left out (they would mask ordinary words)."""
    if not inventory or not os.path.exists(inventory):
        return []
    from kunlun_fleet import vault as kvault

    base = inventory if os.path.isdir(inventory) else os.path.dirname(os.path.abspath(inventory))
    sources = [(DEFAULT_ID, password_file)] if password_file else []
    sources += list(vault_ids) + env_sources() + [(DEFAULT_ID, kvault.paths(base)[0])]
    try:
        import yaml
        from ansible.parsing.dataloader import DataLoader
        from ansible.parsing.vault import VaultLib, VaultSecret, get_file_vault_secret
    except ImportError:
        return []
    secrets, seen = [], set()
    if password is not None:  # asked for at the prompt (--ask-vault-pass, --vault-id @prompt)
        secrets.append((DEFAULT_ID, VaultSecret(password.encode())))
    for label, source in sources:
        key = (label, os.path.abspath(source))
        if source in PROMPTS or key in seen or not os.path.exists(source):
            continue
        seen.add(key)
        try:
            secret = get_file_vault_secret(filename=source, vault_id=label, loader=DataLoader())
            secret.load()
        except Exception:  # an unreadable password file: ansible-playbook will say so itself
            continue
        secrets.append((label, secret))
    if not secrets:
        return []
    vlib = VaultLib(secrets)
    found = [secret.bytes.decode(errors="replace").strip() for _, secret in secrets]

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!vault", lambda loader, node: _Vaulted(loader.construct_scalar(node)))
    for path in inventory_files(inventory):
        try:
            text = path.read_text()
            if text.startswith("$ANSIBLE_VAULT"):
                _strings(yaml.safe_load(vlib.decrypt(text.encode()).decode()), found)
            elif "!vault" in text:
                _vaulted(yaml.load(text, Loader=Loader), vlib, found)
        except Exception:
            continue
    return sorted({s for s in found if len(s) >= 8}, key=len, reverse=True)


class _Vaulted(str):
    pass


def _vaulted(data, vlib, found):
    if isinstance(data, _Vaulted):
        try:
            found.append(vlib.decrypt(str(data).encode()).decode().strip())
        except Exception:  # under a password this run does not have: the next value
            pass
    elif isinstance(data, dict):
        for value in data.values():
            _vaulted(value, vlib, found)
    elif isinstance(data, list):
        for value in data:
            _vaulted(value, vlib, found)


def _strings(data, found):
    if isinstance(data, str):
        found.append(data.strip())
    elif isinstance(data, dict):
        for value in data.values():
            _strings(value, found)
    elif isinstance(data, list):
        for value in data:
            _strings(value, found)
