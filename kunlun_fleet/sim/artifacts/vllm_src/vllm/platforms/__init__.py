# SPDX-License-Identifier: Apache-2.0
"""The current platform, resolved the way vLLM resolves it (vllm/platforms/__init__.py):
each `vllm.platform_plugins` entry point is called; the one that returns a class name is
activated and that class is imported. Importing it loads the platform's stack (for
vllm-kunlun: torch, its `_kunlun` extension, kunlun_ops, torch_xmlir); an import error
there stops vLLM at start with that error.

With no platform plugin installed (this simulator run from its source tree with a plain
Python, as the gateway's test workers and the serving tests do) there is no accelerator
stack to load: `current_platform()` returns None and the simulator serves on its own.
The serving image always has vllm-kunlun installed.
"""

import importlib

from vllm.logger import init_logger
from vllm.plugins import PLATFORM_PLUGINS_GROUP, load_plugins_by_group

logger = init_logger(__name__)

_current = ()


def resolve_current_platform_cls_qualname():
    activated = []
    qualname = None
    for name, func in load_plugins_by_group(PLATFORM_PLUGINS_GROUP).items():
        try:
            assert callable(func)
            cls_name = func()
            if cls_name is not None:
                activated.append(name)
                qualname = cls_name
        except Exception:
            logger.exception("Failed to resolve platform plugin %s", name)
    if len(activated) >= 2:
        raise RuntimeError("Only one platform plugin can be activated, but got: %s" % activated)
    if len(activated) == 1:
        logger.info("Platform plugin %s is activated", activated[0])
        return activated[0], qualname
    return None, None


def resolve_obj_by_qualname(qualname: str):
    module_name, obj_name = qualname.rsplit(".", 1)
    module = importlib.import_module(module_name)
    return getattr(module, obj_name)


def current_platform():
    """The platform class, or None without a platform plugin (resolved once)."""
    global _current
    if _current == ():
        name, qualname = resolve_current_platform_cls_qualname()
        _current = None
        if qualname:
            _current = resolve_obj_by_qualname(qualname)
            logger.info("Automatically detected platform %s.", name)
    return _current
