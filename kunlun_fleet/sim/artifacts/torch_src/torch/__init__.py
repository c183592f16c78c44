"""PyTorch 2.5.1, Kunlunxin xpytorch build (CUDA-compatible mode: XPUs appear as `cuda`)."""

from torch.version import __version__  # noqa: F401
from torch import cuda, xpu  # noqa: F401
from torch import _tensor
from torch._tensor import Tensor  # noqa: F401


class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize
        self.is_floating_point = name.startswith(("float", "bfloat"))

    def __repr__(self):
        return f"torch.{self.name}"


float16 = half = dtype("float16", 2)
bfloat16 = dtype("bfloat16", 2)
float32 = float = dtype("float32", 4)
int8 = dtype("int8", 1)
int32 = dtype("int32", 4)
int64 = long = dtype("int64", 8)


class device:
    def __init__(self, type_, index=None):
        if ":" in str(type_):
            type_, index = str(type_).split(":", 1)
            index = int(index)
        self.type, self.index = str(type_), index

    def __repr__(self):
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))


def get_default_dtype():
    return float32


def arange(start, end=None, step=1, *, dtype=None, device=None):
    """Integers [start, end) on `device` ("cpu", "cuda", "cuda:N"). A cuda device needs a
    visible accelerator: none gives RuntimeError("No CUDA GPUs are available"), an index
    past the count RuntimeError("CUDA error: invalid device ordinal"), as the real one."""
    if end is None:
        start, end = 0, start
    return Tensor(range(int(start), int(end), int(step)), dtype or int64, _tensor._place(device))
