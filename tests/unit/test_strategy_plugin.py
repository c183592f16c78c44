"""The project's strategy plugin: Mitogen's linear strategy, or a clear error naming the fix."""

import os
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


def probe(code, *args, env=None):
    """Run ``code`` in a fresh interpreter (the plugin patches process-wide state) from the
    project's root; its stdout, after it exits 0."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


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


def _tasks(node):
    """Every task of a tasks file, blocks opened."""
    for task in node or []:
        for key in ("block", "rescue", "always"):
            if key in task:
                yield from _tasks(task[key])
        yield task


def test_copies_of_bundle_files_go_over_plain_ssh():
    """Mitogen moves big files several times slower than sftp (docs/performance.md, "Bulk
    copies"): every copy of a bundle file takes the bulk connection."""
    import yaml

    found = []
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            copy = task.get("ansible.builtin.copy")
            if isinstance(copy, dict) and "kunlun_stack_bundle_dir" in str(copy.get("src", "")):
                found.append(path.relative_to(ROOT))
                connection = (task.get("vars") or {}).get("ansible_connection")
                assert connection == "{{ kunlun_stack_bulk_connection }}", (path, task["name"])
    # The base image archive, the vendor wheels, the model, the driver installer, the .debs.
    assert len(found) == 5, found


def test_the_bulk_connection_is_not_redirected_to_mitogen():
    """Mitogen rewrites the short names (ssh, local, ...) to its own transports; the fully
    qualified name stays OpenSSH's plugin, which is what the bulk copies rely on."""
    from ansible_mitogen.strategy import REDIRECTED_CONNECTION_PLUGINS

    defaults = yaml_load(ROOT / "roles/kunlun_stack/defaults/main.yml")
    assert defaults["kunlun_stack_bulk_connection"] == "ansible.builtin.ssh"
    assert "ssh" in REDIRECTED_CONNECTION_PLUGINS
    assert defaults["kunlun_stack_bulk_connection"] not in REDIRECTED_CONNECTION_PLUGINS


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())


def test_collections_are_listed_once_per_run_with_mitogens_result():
    """The plugin replaces Mitogen's per-worker listing of every collection with one list
    made before the workers fork; the paths a module invocation gets are the same."""
    code = (
        "import importlib.util, inspect\n"
        "from ansible.plugins.loader import init_plugin_loader\n"
        "init_plugin_loader()\n"
        "import ansible_mitogen.planner as planner, ansible.collections.list as cl\n"
        "original = inspect.getsource(planner._load_collections)\n"
        "spec = importlib.util.spec_from_file_location('mitogen_linear', %r)\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "mod._collections_once()\n"
        "class Invocation: _extra_sys_paths = set()\n"
        "inv = Invocation(); planner._load_collections(inv)\n"
        "expected = {p.decode() for p in cl.list_collection_dirs()}\n"
        "print(int('list_collection_dirs' in original and '_extra_sys_paths.add' in original),"
        " int(inv._extra_sys_paths == expected), len(expected),"
        " int(planner._load_collections.__module__ == 'mitogen_linear'))\n"
    ) % str(PLUGIN)
    same_idea, same_paths, count, replaced = probe(code).split()
    # Mitogen still lists every collection per worker (else this patch has no reason)
    assert same_idea == "1", "Mitogen's _load_collections changed: revisit plugins/strategy/mitogen_linear.py"
    assert same_paths == "1" and int(count) >= 3 and replaced == "1"


def test_filter_and_test_plugins_are_loaded_before_the_workers_fork():
    """The plugin loads the Jinja plugins of the configured paths once, in the process that
    forks the workers: after it, a worker finds them in the cache it inherits (ansible.builtin's
    and the project's plugins/filter), where it would otherwise load every file again."""
    code = (
        "import importlib.util, os\n"
        "from ansible.plugins.loader import init_plugin_loader, filter_loader, test_loader, PluginLoader\n"
        "init_plugin_loader()\n"
        "cached = lambda loader: len(loader._cached_non_collection_wrappers)\n"
        "before = (cached(filter_loader), cached(test_loader))\n"
        "spec = importlib.util.spec_from_file_location('mitogen_linear', %r)\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "mod._jinja_plugins_once()\n"
        "filters, tests = filter_loader._cached_non_collection_wrappers, test_loader._cached_non_collection_wrappers\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    # the worker's first lookup: served from the inherited cache, nothing loaded again\n"
        "    loaded = []\n"
        "    PluginLoader.all = lambda *a, **k: loaded.append(1) or iter(())\n"
        "    found = filter_loader.get_with_context('packages_missing').object is not None\n"
        "    os._exit(0 if found and not loaded and 'ansible.builtin.to_json' in filters else 3)\n"
        "print(before[0], before[1], int('packages_missing' in filters), int('ansible.builtin.match' in tests),"
        " os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    ) % str(PLUGIN)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    empty_filters, empty_tests, ours, builtin_test, worker = probe(code, env=env).split()
    # Empty until then: ansible-core loads them lazily (else this preload has no reason).
    assert (empty_filters, empty_tests) == ("0", "0")
    assert ours == "1" and builtin_test == "1"
    assert worker == "0"


# Templates and expressions whose compiled code differs by the compile's settings: a role
# default naming another, filters, a loop, a `#jinja2:` override header, backslashes escaped
# or not (the same source, two codes), and conditionals.
CODE_CACHE_PROBE = r"""
import importlib.util, json, os, sys
from ansible.errors import AnsibleError
from ansible.template import Templar, trust_as_template
from ansible.parsing.dataloader import DataLoader

VARS = {"a": 3, "b": trust_as_template("{{ a * 2 }}")}
TEMPLATES = [
    "{{ b | int + 1 }}",
    "{{ [1, 2, 3] | map('string') | join(',') }}",
    "{% for i in range(a) %}{{ i }}{% endfor %}",
    "#jinja2:variable_start_string:'[[',variable_end_string:']]'\n[[ a ]] {{ a }}",
]
CONDITIONALS = ["a == 3", "b | int > 5", "'x' in 'xyz'"]
def render():
    t = Templar(loader=DataLoader(), variables=VARS)
    out = [t.template(trust_as_template(s)) for s in TEMPLATES]
    out += [t.evaluate_conditional(trust_as_template(c)) for c in CONDITIONALS]
    out.append(t.template(trust_as_template("{{ 'a\\nb' }}"), escape_backslashes=False))
    out.append(t.template(trust_as_template("{{ 'a\\nb' }}")))
    try:
        t.template(trust_as_template("{{ a + }}"))
    except AnsibleError as exc:
        out.append(type(exc).__name__)
    return out

plain = render()
spec = importlib.util.spec_from_file_location("mitogen_linear", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
mod._template_code_cache()
cache = mod._CODE_CACHE
first = render(); after_first = dict(cache)
files = len(os.listdir(cache["dir"]))
pid = os.fork()
if pid == 0:  # a worker: the run's earlier compiles are read, none made again
    before = dict(cache)
    ok = render() == plain and cache["misses"] == before["misses"] + 1  # the syntax error only
    os._exit(0 if ok else 3)
worker = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps({"plain": plain, "first": first, "after_first": after_first, "files": files,
                  "patched": cache["dir"] != "", "worker": worker}))
"""


def test_a_worker_reads_the_code_of_templates_the_run_compiled_before(tmp_path):
    """The plugin keeps each template's and expression's compiled code for the run: a
    worker forked after another process compiled a template reads its code instead of
    compiling it again, the results are the same as ansible-core's own compiles (backslashes
    escaped or not, a `#jinja2:` override, conditionals), and a compile error is raised
    each time, never cached."""
    import json

    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path))
    got = json.loads(probe(CODE_CACHE_PROBE, str(PLUGIN), env=env).strip().splitlines()[-1])
    assert got["patched"], "ansible-core's templating changed: revisit plugins/strategy/mitogen_linear.py"
    assert got["plain"][:6] == [7, "1,2,3", "012", "3 {{ a }}", True, True]
    assert got["plain"][-3:] == ["a\nb", "a\\nb", "AnsibleTemplateSyntaxError"]
    assert got["first"] == got["plain"]
    # Ten sources (b's template among them), each compiled once in the run and written; the
    # syntax error compiled and not written; b's template read back at its second use.
    assert got["files"] == 10, got
    assert got["after_first"]["misses"] == 11 and got["after_first"]["hits"] >= 1, got
    assert got["worker"] == 0


def test_a_local_connection_waits_the_configured_timeout():
    """Mitogen gives a local connection (delegate_to: localhost) a fixed 30 s to start its
    interpreter and ignores the configured timeout, which its SSH connection takes; the plugin
    passes the configured one when it is longer (a starved CI lane's bundle check timed out at
    30 s), and never less than Mitogen's 30 s (a test's 3 s for remote hosts made the local
    interpreter "unreachable" on a starved lane)."""
    code = (
        "import importlib.util, mitogen.parent\n"
        "import ansible_mitogen.connection as conn\n"
        "class Spec:\n"
        "    def __init__(self, t): self.t = t\n"
        "    timeout = lambda self: self.t\n"
        "    python_path = lambda self: ['/usr/bin/python3']\n"
        "before = conn.CONNECTION_METHOD['local'](Spec(120))\n"
        "spec = importlib.util.spec_from_file_location('mitogen_linear', %r)\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "mod._local_connect_timeout_once(); mod._local_connect_timeout_once()\n"
        "after = [conn.CONNECTION_METHOD['local'](Spec(t)) for t in (120, 3, None)]\n"
        "print(int('connect_timeout' in before['kwargs']), mitogen.parent.Options.connect_timeout,"
        " ','.join('%%g' %% a['kwargs']['connect_timeout'] for a in after), after[0]['method'],"
        " int(after[0]['kwargs']['python_path'] == ['/usr/bin/python3']))\n"
    ) % str(PLUGIN)
    had_timeout, mitogen_default, timeouts, method, same_python = probe(code).split()
    # Mitogen's own local connection still has no timeout of its own (else this has no reason).
    assert had_timeout == "0" and float(mitogen_default) == 30.0
    assert timeouts == "120,30,30" and method == "local" and same_python == "1"
