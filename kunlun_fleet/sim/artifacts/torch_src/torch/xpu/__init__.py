"""torch.xpu: Intel GPU backend (not Kunlunxin). Always empty on this build: the Kunlunxin
XPUs are torch.cuda (CUDA-compatible mode). Anything past the availability queries fails
as a torch built without Intel XPU support does."""


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def _lazy_init():
    raise AssertionError("Torch not compiled with XPU enabled")


def current_device() -> int:
    _lazy_init()


def get_device_properties(device=None):
    _lazy_init()
