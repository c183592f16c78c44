"""The project's strategy plugin: Mitogen's linear strategy, or a clear error naming the fix."""

import subprocess
import sys
from pathlib import Path

import configparser

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "strategy" / "mitogen_linear.py"


def load(python_path_first=None):
    """Import the plugin file in a fresh interpreter; a directory first on sys.path can hide
    the mitogen package (a stand-in that raises ImportError)."""
    code = (
        "import sys, importlib.util\n"
        "%s"
        "spec = importlib.util.spec_from_file_location('mitogen_linear', %r)\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "print(mod.StrategyModule.__mro__[1].__module__, mod.StrategyModule.__mro__[2].__module__)\n"
    ) % ("sys.path.insert(0, %r)\n" % str(python_path_first) if python_path_first else "", str(PLUGIN))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_ansible_cfg_runs_plays_with_the_plugin():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg["defaults"]["strategy"] == "mitogen_linear"
    assert (ROOT / cfg["defaults"]["strategy_plugins"] / "mitogen_linear.py") == PLUGIN


def test_plugin_is_mitogen_over_ansibles_linear():
    proc = load()
    assert proc.returncode == 0, proc.stderr
    mixin, base = proc.stdout.split()
    assert mixin == "ansible_mitogen.strategy"
    assert base.endswith("strategy.linear"), base


def test_without_mitogen_the_error_names_the_fix(tmp_path):
    # A package of that name that cannot be imported: what a Python without mitogen sees.
    (tmp_path / "ansible_mitogen").mkdir()
    (tmp_path / "ansible_mitogen" / "__init__.py").write_text("raise ImportError('No module named ansible_mitogen')\n")
    proc = load(tmp_path)
    assert proc.returncode != 0
    assert "make setup" in proc.stderr and "ANSIBLE_STRATEGY=linear" in proc.stderr, proc.stderr[-2000:]
