"""torch._dynamo.eval_frame (PyTorch 2.5.1)."""

import functools

_PATCHED_BY = None  # replaced by platform builds that ship their own eval_frame


def reset():
    return None


class OptimizeContext:
    def __init__(self, callback, backend="inductor"):
        self.callback = callback
        self.backend = backend

    def __call__(self, fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            return fn(*args, **kwargs)

        return inner


def optimize(backend="inductor", nopython=False, dynamic=None):
    return OptimizeContext(None, backend)
