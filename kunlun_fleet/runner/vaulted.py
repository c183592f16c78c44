"""The inventory's vaulted values, decrypted, for the masker (kunlun_fleet.runner.masking)."""

import os
from pathlib import Path


def vault_secrets(inventory, password_file=None, password=None):
    """Every vaulted value of an inventory directory (inline `!vault` values and vaulted
    files), decrypted, to be masked wherever they would be printed or stored. Values
    shorter than 8 characters are left out (they would mask ordinary words)."""
    if not inventory or not os.path.isdir(inventory):
        return []
    from kunlun_fleet import vault as kvault

    password_file = password_file or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") or kvault.paths(inventory)[0]
    if password is None and not os.path.exists(password_file):
        return []
    try:
        import yaml
        from ansible.parsing.dataloader import DataLoader
        from ansible.parsing.vault import VaultLib, VaultSecret, get_file_vault_secret

        if password is not None:  # asked for at the prompt (--ask-vault-pass)
            secret = VaultSecret(password.encode())
        else:
            secret = get_file_vault_secret(filename=password_file, vault_id="default", loader=DataLoader())
            secret.load()
        vlib = VaultLib([("default", secret)])
    except Exception:  # an unreadable password file: ansible-playbook will say so itself
        return []
    found = [secret.bytes.decode(errors="replace").strip()]

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!vault", lambda loader, node: _Vaulted(loader.construct_scalar(node)))
    for path in sorted(Path(inventory).rglob("*")):
        if path.suffix not in (".yml", ".yaml", ".json", "") or not path.is_file():
            continue
        if any(part.startswith(".") for part in path.relative_to(inventory).parts):
            continue
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
        found.append(vlib.decrypt(str(data).encode()).decode().strip())
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
