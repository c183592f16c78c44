"""Kunlun platform: XPUs are driven through xpytorch's CUDA-compatible mode."""


class KunlunPlatform:
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    dist_backend = "nccl"  # XCCL behind the nccl name
    device_control_env_var = "XPU_VISIBLE_DEVICES"
    supported_quantization = ["compressed-tensors", "fp8", "awq", "gptq"]

    @classmethod
    def device_count(cls) -> int:
        from torch_xmlir import _XMLIRC
        return _XMLIRC._xpu_get_devices_number()
