"""vLLM-Kunlun: Kunlunxin XPU platform plugin for vLLM 0.15.1."""

import builtins
import importlib
import sys

__version__ = "0.15.1.dev0"
__commit__ = "4885de2"

# vLLM modules replaced by this plugin's (the public tree's import hook maps more of them).
MODULE_MAPPINGS = {
    "vllm.v1.sample.ops.topk_topp_sampler": "vllm_kunlun.v1.sample.ops.topk_topp_sampler",
}
_OLD_IMPORT = None


def _custom_import(module_name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and module_name in MODULE_MAPPINGS and module_name not in sys.modules:
        target = MODULE_MAPPINGS[module_name]
        module = importlib.import_module(target)
        sys.modules[module_name] = module
        sys.modules[target] = module
    return _OLD_IMPORT(module_name, globals, locals, fromlist, level)


def import_hook():
    """Every later import of a mapped vLLM module gets this plugin's module instead."""
    global _OLD_IMPORT
    if _OLD_IMPORT is None:
        _OLD_IMPORT = builtins.__import__
        builtins.__import__ = _custom_import


def register():
    """vllm.platform_plugins entry point: the platform class to use (and the import hook)."""
    import_hook()
    return "vllm_kunlun.platforms.kunlun.KunlunPlatform"


def register_model():
    """vllm.general_plugins entry point: the Kunlun kernels of vLLM's layers."""
    from vllm_kunlun.ops import register_ops

    register_ops()
