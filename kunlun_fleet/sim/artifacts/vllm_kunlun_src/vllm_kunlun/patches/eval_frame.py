"""torch._dynamo.eval_frame for xpytorch 2.5.1 (shipped by vLLM-Kunlun).

Replaces PyTorch's file: the XPU graph mode needs frames compiled only once per code
object, and no guard failures recompiling under CUDA-compatible mode.
"""

import functools

_PATCHED_BY = "vllm_kunlun 0.15.1.dev0 (4885de2)"


def reset():
    return None


class OptimizeContext:
    def __init__(self, callback, backend="inductor"):
        self.callback = callback
        self.backend = backend
        self.compiled = {}

    def __call__(self, fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            return fn(*args, **kwargs)

        return inner


def optimize(backend="inductor", nopython=False, dynamic=None):
    return OptimizeContext(None, backend)
