# Ansible's linear strategy on Mitogen's connection layer (ansible.cfg: strategy =
# mitogen_linear). Mitogen keeps one Python interpreter per host for the whole run and
# sends each module once, instead of an SSH exec and a module upload per task: an
# unchanged site.yml re-run takes a fraction of the time (docs/performance.md has the
# figures). The package comes from requirements.txt; this file only makes the strategy
# loadable from the project, whatever the Python version's site-packages path.
from __future__ import annotations

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


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):
    pass
