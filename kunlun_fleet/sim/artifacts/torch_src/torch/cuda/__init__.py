"""torch.cuda on xpytorch: the Kunlunxin XPUs, counted by torch_xmlir."""
_initialized = False
_device_name = "P800 OAM"


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
