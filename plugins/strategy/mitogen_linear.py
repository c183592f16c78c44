# Ansible's linear strategy on Mitogen's connection layer (ansible.cfg: strategy =
# mitogen_linear). Mitogen keeps one Python interpreter per host for the whole run and
# sends each module once, instead of an SSH exec and a module upload per task: an
# unchanged site.yml re-run takes a fraction of the time (docs/performance.md has the
# figures). The package comes from requirements.txt; this file only makes the strategy
# loadable from the project, whatever the Python version's site-packages path.
#
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
name: mitogen_linear
short_description: Ansible's linear strategy on Mitogen's connection layer
description:
  - Runs each task on all hosts of the batch before the next task, as Ansible's C(linear) strategy, over
    Mitogen's connection layer - one Python interpreter per host for the whole run, each module sent once,
    instead of an SSH exec and a module upload per task.
  - Lists the installed collections once per run, before the workers are forked, where Mitogen would list them
    again in every worker that runs a collection's module; the paths it puts on the target's import path are
    the same.
  - Loads the filter and test plugins of the configured paths (ansible.builtin's and the project's
    plugins/filter) once per run, before the workers are forked, where each worker would load them again at
    its first template; the plugins found are the same.
  - Keeps the code Jinja compiles from each template and expression in a cache for the run (files in the
    run's local temporary directory, which ansible-core removes at exit), which every worker reads before
    it compiles; a worker compiles only what no process of the run compiled before. Results are the same,
    compile errors are never cached, and with an ansible-core whose templating differs from the one this
    was written for, or with template debugging on, nothing is cached.
  - Starts local connections (a task delegated to localhost) with the configured connection timeout (C(timeout),
    C(ANSIBLE_TIMEOUT)) when it is longer than the fixed 30 seconds Mitogen gives them, as its SSH connections
    take it; never with less.
  - Needs the C(mitogen) package (the project's requirements.txt pins it). Without it the plugin fails to load
    with an error naming the fix (C(make setup), or C(ANSIBLE_STRATEGY=linear)).
version_added: "0.1.0"
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

import hashlib
import marshal
import os
import sys
import threading
import types

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError as exc:  # pragma: no cover - exercised by tests/unit/test_strategy_plugin.py
    from ansible.errors import AnsibleError

    raise AnsibleError(
        "kunlun-fleet runs plays with Mitogen's linear strategy (ansible.cfg: strategy = mitogen_linear), "
        "and this Python cannot import it (%s). Fix: `make setup` (requirements.txt pins mitogen), "
        "or run without it: ANSIBLE_STRATEGY=linear." % exc
    ) from exc

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


def _collections_once():
    """Mitogen, in every worker that runs a collection's module (every fresh worker: one
    per host per task), lists every installed collection to put their paths on the
    target's import path, importing each package and parsing its meta/runtime.yml on the
    way: about 0.35 s of CPU per task and host with the ansible package's collections.
    The list cannot change during a run: it is made once here, before the workers are
    forked, and each worker reuses it (same paths, same effect; docs/performance.md)."""
    import ansible.collections.list
    import ansible_mitogen.planner

    if getattr(ansible_mitogen.planner, "_kunlun_fleet_collections_once", False):
        return
    paths = [p.decode("utf-8") for p in ansible.collections.list.list_collection_dirs()]

    def _load_collections(invocation):
        invocation._extra_sys_paths.update(paths)

    ansible_mitogen.planner._load_collections = _load_collections
    ansible_mitogen.planner._kunlun_fleet_collections_once = True


def _jinja_plugins_once():
    """ansible-core loads the filter and test plugins of its configured paths (every file of
    ansible.builtin's and plugins/filter) into a per-process cache at the first template that
    names a filter or a test. The parent's cache is empty until it templates one, so each
    worker, one per host per task, loaded them all again: a quarter of a worker's Python time
    (cProfile of playbooks/monitoring.yml's workers). Loaded here once, before the workers are
    forked, they inherit it: the same plugins, and an unchanged site.yml re-run on the 3-host
    sim fleet took 14 % less of the controller's CPU (docs/performance.md)."""
    import ansible.plugins.loader

    for jinja_loader in (ansible.plugins.loader.filter_loader, ansible.plugins.loader.test_loader):
        # all() fills the cache (Jinja2Loader._ensure_non_collection_wrappers) at its first item.
        next(iter(jinja_loader.all()), None)


def _local_connect_timeout_once():
    """Mitogen starts a local connection (delegate_to: localhost - the bundle's checks, the
    controller's files) with its own fixed 30 s connect timeout, where its SSH connection
    takes the configured one (ansible.cfg's timeout, ANSIBLE_TIMEOUT): a busy controller
    that needs longer to start the local interpreter failed the task as unreachable (a
    starved CI lane, the driver stage's bundle check, 2026-12-07). The local connection
    gets the configured timeout when it is longer; never less than Mitogen's own (a short
    timeout set for remote hosts, to find an unreachable one fast, does not make the
    controller's own interpreter "unreachable")."""
    import ansible_mitogen.connection
    import mitogen.parent

    methods = ansible_mitogen.connection.CONNECTION_METHOD
    original = methods["local"]
    if getattr(original, "_kunlun_fleet_timeout", False):
        return

    def _connect_local(spec):
        stack = original(spec)
        floor = float(mitogen.parent.Options.connect_timeout)
        try:
            configured = float(spec.timeout() or 0)
        except (TypeError, ValueError):
            configured = 0.0
        stack.setdefault("kwargs", {}).setdefault("connect_timeout", max(floor, configured))
        return stack

    _connect_local._kunlun_fleet_timeout = True
    methods["local"] = _connect_local


# The code cache's state: its directory once made, and the code a miss of
# compile_expression captures from the compile it makes (one worker thread at a time).
_CODE_CACHE = {"dir": None, "hits": 0, "misses": 0}
_CAPTURE = threading.local()


def _template_code_cache():
    """ansible-core 2.19 compiles a template's source to Python code every time it renders
    it: no cache survives a worker (one per host per task), so the same conditionals and
    arguments, and every role default they name, are parsed, generated and compiled again
    on every host at every task: about 30 % of a worker's Python time (cProfile of an
    unchanged site.yml re-run's workers; docs/performance.md). The generated code depends
    only on the source and the compile's settings, all in the key below (the plugins a
    filter names are the run's, so the cache lives for one run); each compile reads the
    code of an earlier one from the run's local temporary directory before compiling.
    Nothing is patched if ansible-core's templating is not the one this was written for."""
    if _CODE_CACHE["dir"] is not None:
        return
    try:
        import jinja2
        from jinja2.environment import TemplateExpression
        from ansible import constants as C
        from ansible.module_utils.ansible_release import __version__ as ansible_version
        from ansible._internal._templating import _jinja_bits as bits

        env_class = bits.AnsibleEnvironment
        compile_template = env_class.compile
        compile_expression = env_class.compile_expression
        context_class = bits._TemplateCompileContext
        config = bits._TemplateConfig
        fields = bits._TEMPLATE_OVERRIDE_FIELD_NAMES
        directory = os.path.join(C.DEFAULT_LOCAL_TMP, "kunlun-fleet-jinja-code")
        os.makedirs(directory, exist_ok=True)
    except Exception:  # noqa: BLE001 - any difference in ansible-core: no cache, plain compiles
        _CODE_CACHE["dir"] = ""
        return
    versions = repr((ansible_version, jinja2.__version__, sys.version)).encode()

    def key(env, kind, source, extra):
        compile_context = context_class.current(optional=True)
        digest = hashlib.sha256(versions)
        settings = (
            kind,
            extra,
            bool(compile_context and compile_context.escape_backslashes),
            tuple(getattr(env, name) for name in fields),
            bool(config.allow_embedded_templates),
            type(env).__module__,
            type(env).__qualname__,
            env.optimized,
            env.is_async,
            repr(env.autoescape),
            sorted(env.extensions),
        )
        digest.update(repr(settings).encode())
        digest.update(b"\0")
        digest.update(str.encode(source, "utf-8", "surrogatepass"))
        return os.path.join(directory, digest.hexdigest())

    def load(path):
        try:
            with open(path, "rb") as fh:
                code = marshal.load(fh)
        except (OSError, EOFError, ValueError, TypeError):
            _CODE_CACHE["misses"] += 1
            return None
        _CODE_CACHE["hits"] += 1
        return code

    def store(path, code):
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            with open(tmp, "wb") as fh:
                marshal.dump(code, fh)
            os.replace(tmp, path)
        except OSError:  # a full or removed directory: the next compile compiles again
            pass

    def cacheable(env, source):
        return isinstance(source, str) and not env._debuggable_template_source

    def cached_compile(self, source, name=None, filename=None, raw=False, defer_init=False):
        if raw or not cacheable(self, source):
            code = compile_template(self, source, name, filename, raw, defer_init)
            captured = getattr(_CAPTURE, "codes", None)
            if captured is not None and not raw and isinstance(code, types.CodeType):
                captured.append(code)
            return code
        path = key(self, "template", source, (name, filename, defer_init))
        code = load(path)
        if code is None:
            code = compile_template(self, source, name, filename, raw, defer_init)
            store(path, code)
        return code

    def cached_compile_expression(self, source, undefined_to_none=True):
        if not cacheable(self, source):
            return compile_expression(self, source, undefined_to_none)
        path = key(self, "expression", source, ())
        code = load(path)
        if code is None:
            # jinja2 parses the expression into a template tree and compiles that: the code
            # it compiles is caught on the way (cached_compile above) and kept.
            outer, _CAPTURE.codes = getattr(_CAPTURE, "codes", None), []
            try:
                expression = compile_expression(self, source, undefined_to_none)
                captured = _CAPTURE.codes
            finally:
                _CAPTURE.codes = outer
            if len(captured) == 1:
                store(path, captured[0])
            return expression
        template = self.template_class.from_code(self, code, self.make_globals(None), None)
        return TemplateExpression(template, undefined_to_none)

    env_class.compile = cached_compile
    env_class.compile_expression = cached_compile_expression
    _CODE_CACHE["dir"] = directory


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):
    def run(self, iterator, play_context):
        _collections_once()
        _jinja_plugins_once()
        _template_code_cache()
        _local_connect_timeout_once()
        return super().run(iterator, play_context)
