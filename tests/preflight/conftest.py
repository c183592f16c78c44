"""Run playbooks/preflight.yml against copies of the example inventory with one thing broken."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


class Inventory:
    """A writable copy of inventories/example."""

    def __init__(self, path):
        self.path = Path(path)

    def load(self, rel):
        return yaml.safe_load((self.path / rel).read_text()) or {}

    def save(self, rel, data):
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(data, sort_keys=False))

    def update(self, rel, **values):
        data = self.load(rel) if (self.path / rel).exists() else {}
        data.update(values)
        self.save(rel, data)

    def hosts(self):
        return self.load("hosts.yml")

    def local_connection(self):
        """Every host reached as the controller itself: host checks read this machine only."""
        self.update(
            "group_vars/all/connection.yml",
            ansible_connection="local",
            ansible_python_interpreter=str(ROOT / ".venv/bin/python"),
        )
        # The example's bundle path does not exist here; these tests are about the hosts.
        self.update("group_vars/all/stack.yml", kunlun_stack_bundle_dir="")


@pytest.fixture
def inventory(tmp_path):
    from kunlun_fleet import vault

    dest = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventories/example", dest)
    # The fleet's API key, vaulted with the password every test run has
    # (ANSIBLE_VAULT_PASSWORD_FILE, set in tests/conftest.py).
    vault.ensure_api_key(str(dest), os.environ["ANSIBLE_VAULT_PASSWORD_FILE"])
    return Inventory(dest)


@pytest.fixture
def run_preflight(tmp_path):
    def run(inventory, *extra):
        env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
            ANSIBLE_FORCE_COLOR="0",
        )
        proc = subprocess.run(
            [
                str(ROOT / ".venv/bin/ansible-playbook"),
                "-i",
                str(inventory.path),
                str(ROOT / "playbooks/preflight.yml"),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return proc.returncode, proc.stdout + proc.stderr

    return run
