"""Triton availability (PyTorch 2.5.1)."""

import functools


@functools.lru_cache(None)
def has_triton_package() -> bool:
    try:
        import triton  # noqa: F401

        return triton is not None
    except ImportError:
        return False


@functools.lru_cache(None)
def has_triton() -> bool:
    return has_triton_package() and _device_supports_triton()


def _device_supports_triton() -> bool:
    return True
