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
  - Needs the C(mitogen) package (the project's requirements.txt pins it). Without it the plugin fails to load
    with an error naming the fix (C(make setup), or C(ANSIBLE_STRATEGY=linear)).
version_added: "0.1.0"
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

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


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):
    def run(self, iterator, play_context):
        _collections_once()
        _jinja_plugins_once()
        return super().run(iterator, play_context)
