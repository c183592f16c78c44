"""The module_util_file lookup: the path of one of the project's module_utils files, in the
playbook project's layout and in the collection's, through Ansible as a role calls it."""

import os
import subprocess
from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError

from plugins.lookup import module_util_file

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_layout():
    assert module_util_file.find("xpu_smi.py") == str(ROOT / "module_utils" / "xpu_smi.py")


def test_the_collection_layout(tmp_path):
    """plugins/lookup/ and plugins/module_utils/ side by side, no top-level module_utils."""
    lookup_dir = tmp_path / "ansible_collections/kunlun/fleet/plugins/lookup"
    utils = tmp_path / "ansible_collections/kunlun/fleet/plugins/module_utils"
    lookup_dir.mkdir(parents=True)
    utils.mkdir()
    (utils / "xpu_smi.py").write_text("# parser\n")
    assert module_util_file.find("xpu_smi.py", here=str(lookup_dir)) == str(utils / "xpu_smi.py")


@pytest.mark.parametrize("name", ["../library/xpu_info.py", "xpu_smi", "no_such_util.py"])
def test_anything_but_a_module_utils_file_is_refused(name):
    with pytest.raises(AnsibleLookupError, match="module_util_file"):
        module_util_file.find(name)


def test_through_ansible_with_the_projects_config():
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible"),
            "localhost",
            "-m",
            "ansible.builtin.debug",
            "-a",
            "msg={{ lookup('module_util_file', 'xpu_smi.py') }}",
        ],
        cwd=ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_DEPRECATION_WARNINGS="False"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(ROOT / "module_utils" / "xpu_smi.py") in proc.stdout
