"""vLLM-Kunlun: Kunlunxin XPU platform plugin for vLLM 0.15.1."""

__version__ = "0.15.1.dev0"
__commit__ = "4885de2"


def register():
    """vllm.platform_plugins entry point: the platform class to use."""
    return "vllm_kunlun.platforms.kunlun.KunlunPlatform"


def register_model():
    """vllm.general_plugins entry point: the Kunlun kernels of vLLM's layers."""
    from vllm_kunlun.ops import register_ops

    register_ops()
