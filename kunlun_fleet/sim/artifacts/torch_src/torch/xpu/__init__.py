"""torch.xpu: Intel GPU backend (not Kunlunxin). Always empty on this build."""


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0
