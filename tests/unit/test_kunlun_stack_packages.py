"""kunlun_stack's packages task: the package lists are refreshed when they offer no
candidate for a missing package. `apt-cache show` exits 0 for a name apt knows only from
dpkg's status (a fresh host whose lists were cleaned: the gateway's python3-venv), so the
check reads each package's candidate in `apt-cache policy` (fake apt-cache below, printing
what apt prints in each case)."""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = yaml.safe_load((ROOT / "roles/kunlun_stack/tasks/packages.yml").read_text())
# What runs only when a package is missing (packages.yml includes it then).
INSTALL = yaml.safe_load((ROOT / "roles/kunlun_stack/tasks/packages_install.yml").read_text())
CHECK = next(t for t in INSTALL if t["name"].startswith("Packages | Whether the package lists offer"))
SCRIPT = CHECK["vars"]["kunlun_stack_packages_offered"]

# apt-cache policy's own output forms: a candidate, none (known only from dpkg's status or
# from another package's dependencies), and nothing at all for a name apt never heard of.
FAKE = r"""#!/bin/sh
[ "$1" = policy ] || exit 2
case "$2" in
  haproxy) printf 'haproxy:\n  Installed: (none)\n  Candidate: 2.6.12-1+deb12u2\n  Version table:\n' ;;
  python3-venv) printf 'python3-venv:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n' ;;
  *) echo "N: Unable to locate package $2" >&2 ;;
esac
exit 0
"""


def offered(tmp_path, *packages):
    (tmp_path / "apt-cache").write_text(FAKE)
    (tmp_path / "apt-cache").chmod(0o755)
    env = dict(os.environ, PATH="%s:%s" % (tmp_path, os.environ["PATH"]))
    return subprocess.run(["sh", "-c", SCRIPT, "sh", *packages], env=env, capture_output=True, text=True).returncode


def test_a_candidate_for_every_missing_package_needs_no_refresh(tmp_path):
    assert offered(tmp_path, "haproxy") == 0


def test_no_candidate_or_an_unknown_name_asks_for_a_refresh(tmp_path):
    assert offered(tmp_path, "python3-venv") == 1
    assert offered(tmp_path, "haproxy", "python3-venv") == 1
    assert offered(tmp_path, "haproxy", "no-such-package") == 1


def test_the_refresh_runs_when_the_check_fails():
    refresh = next(t for t in INSTALL if t["name"].startswith("Packages | Refresh the package lists"))
    assert "kunlun_stack_packages_known.rc != 0" in refresh["when"]
    assert CHECK["register"] == "kunlun_stack_packages_known"


def test_the_install_path_is_included_only_when_a_package_is_missing():
    include = next(t for t in TASKS if "ansible.builtin.include_tasks" in t)
    assert include["ansible.builtin.include_tasks"] == "packages_install.yml"
    assert include["when"] == "kunlun_stack_packages_missing | length > 0"
    assert [t["name"] for t in INSTALL][-1] == "Packages | Install the missing packages"
