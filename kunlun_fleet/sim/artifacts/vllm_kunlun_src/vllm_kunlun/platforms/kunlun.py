"""Kunlun platform: XPUs are driven through xpytorch's CUDA-compatible mode.

Importing this module loads what the platform runs on, as the real plugin does: torch
(xpytorch 2.5.1), the plugin's compiled extension `vllm_kunlun._kunlun`, kunlun_ops and
torch_xmlir. A missing piece fails here, with Python's import error.
"""

import torch  # noqa: F401  (xpytorch: XPUs appear as cuda)
import kunlun_ops  # noqa: F401
from torch_xmlir import _XMLIRC

from vllm_kunlun import _kunlun  # noqa: F401  (the C extension built by setup.py)


class KunlunPlatform:
    device_name = "cuda"
    device_type = "cuda"
    # The public 0.15.1-era class sets no dispatch_key: it inherits vLLM's Platform
    # default (vllm/platforms/interface.py), "CPU".
    dispatch_key = "CPU"
    ray_device_key = "GPU"
    dist_backend = "nccl"  # XCCL behind the nccl name
    device_control_env_var = "XPU_VISIBLE_DEVICES"
    supported_quantization = ["compressed-tensors", "fp8", "awq", "gptq"]

    @classmethod
    def device_count(cls) -> int:
        return _XMLIRC._xpu_get_devices_number()

    @classmethod
    def unusable_devices(cls) -> list:
        """[(index, node path, error)] of visible devices the runtime could not open."""
        return _XMLIRC._xpu_get_failed_devices()

    @classmethod
    def is_cuda(cls) -> bool:
        return False

    @classmethod
    def is_cuda_alike(cls) -> bool:
        return True

    @classmethod
    def describe(cls) -> str:
        return "torch %s, kunlun_ops %s, vllm_kunlun._kunlun %s" % (
            torch.__version__,
            kunlun_ops.__version__,
            "/".join(_kunlun.version()),
        )
