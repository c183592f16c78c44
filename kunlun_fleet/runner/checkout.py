"""The checkout whose playbooks run, and the environment every ansible command gets there."""

import configparser
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def root():
    """The checkout whose playbooks run: this one, or KUNLUN_FLEET_ROOT (tests point it at
    a tree of their own)."""
    return Path(os.environ.get("KUNLUN_FLEET_ROOT") or ROOT).resolve()


def ansible_env(inventory=None, base=None, env=None):
    """The environment of every ansible command: the checkout's ansible.cfg and, when the
    inventory is a directory with a vault password file, that file (the fleet's API key); for
    an inventory file, the password file beside it (where its group_vars are)."""
    from kunlun_fleet import vault

    env = dict(os.environ if env is None else env, ANSIBLE_CONFIG=str(Path(base or root()) / "ansible.cfg"))
    if inventory and os.path.isfile(inventory):
        inventory = os.path.dirname(os.path.abspath(inventory))
    return vault.vault_env(inventory, env) if inventory and os.path.isdir(inventory) else env


def _venv_bin():
    """ansible-playbook of the venv the CLI runs from, ahead of anything else on PATH."""
    return str(Path(sys.executable).parent)


def _cfg(base, section, key, default):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(str(Path(base) / "ansible.cfg"))
    return parser.get(section, key, fallback=default)
