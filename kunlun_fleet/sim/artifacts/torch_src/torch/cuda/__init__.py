"""torch.cuda on xpytorch: the Kunlunxin XPUs, counted by torch_xmlir (CUDA-compatible
mode: device i is the i-th XPU that XPU_VISIBLE_DEVICES lets the runtime open)."""

_initialized = False
_device_name = "P800 OAM"
# 96 GiB of HBM per P800 (xpu-smi: 98304 MiB; torch's out-of-memory message: "a total
# capacity of 96.00 GiB").
_total_memory = 98304 * 1024 * 1024


def _lazy_init():
    global _initialized
    if _initialized:
        return
    _check_capability()
    _initialized = True


def _check_capability():
    raise RuntimeError("CUDA capability check is not available on this device")


def device_count() -> int:
    from torch_xmlir import _XMLIRC

    return _XMLIRC._xpu_get_devices_number()


def is_available() -> bool:
    return device_count() > 0


def current_device() -> int:
    _lazy_init()
    return 0


def get_device_name(device=None) -> str:
    return _device_name


def get_device_capability(device=None):
    return (9, 0)


def synchronize(device=None) -> None:
    _lazy_init()


class _CudaDeviceProperties:
    def __init__(self, name, total_memory, major, minor):
        self.name, self.total_memory, self.major, self.minor = name, total_memory, major, minor

    def __repr__(self):
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB)"
        )


def _device_index(device=None) -> int:
    """The index of `device`: None (the current one, 0), an int, "cuda:N" or a torch.device."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None and ":" in str(device):
        index = int(str(device).split(":", 1)[1])
    return 0 if index is None else int(index)


def _checked_index(index=None) -> int:
    """`index` (None: 0) when torch.cuda sees that device, else the real runtime's error."""
    count = device_count()
    if count == 0:
        raise RuntimeError("No CUDA GPUs are available")
    index = 0 if index is None else int(index)
    if index < 0 or index >= count:
        raise RuntimeError("CUDA error: invalid device ordinal")
    return index


def get_device_properties(device=None) -> _CudaDeviceProperties:
    index, count = _device_index(device), device_count()
    if count == 0:
        raise RuntimeError("No CUDA GPUs are available")
    if index < 0 or index >= count:
        raise AssertionError("Invalid device id")
    major, minor = get_device_capability(index)
    return _CudaDeviceProperties(_device_name, _total_memory, major, minor)
