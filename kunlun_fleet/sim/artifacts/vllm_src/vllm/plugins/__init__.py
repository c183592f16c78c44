# SPDX-License-Identifier: Apache-2.0
"""Plugins found through entry points, as vLLM loads them (vllm/plugins/__init__.py)."""

import importlib.metadata

from vllm.logger import init_logger

logger = init_logger(__name__)

PLATFORM_PLUGINS_GROUP = "vllm.platform_plugins"
GENERAL_PLUGINS_GROUP = "vllm.general_plugins"

_general_loaded = False


def load_plugins_by_group(group: str) -> dict:
    """{name: loaded function} of the installed distributions' entry points in `group`.
    A plugin that cannot be loaded (its module fails to import) is logged and skipped,
    like vLLM does."""
    discovered = importlib.metadata.entry_points(group=group)
    if not discovered:
        logger.debug("No plugins for group %s found.", group)
        return {}
    logger.info("Available plugins for group %s:", group)
    for plugin in discovered:
        logger.info("- %s -> %s", plugin.name, plugin.value)
    plugins = {}
    for plugin in discovered:
        try:
            plugins[plugin.name] = plugin.load()
        except Exception:
            logger.exception("Failed to load plugin %s", plugin.name)
    return plugins


def load_general_plugins() -> None:
    """Run every `vllm.general_plugins` function once per process (engine start). An
    exception in one propagates: the engine does not start."""
    global _general_loaded
    if _general_loaded:
        return
    _general_loaded = True
    for func in load_plugins_by_group(GENERAL_PLUGINS_GROUP).values():
        func()
