"""kunlun_ops: Kunlunxin XPU operators for PyTorch (attention, GEMM, norms, conv1d, GDN).

Stand-in: every operator of this release is a Python function with the release's keyword
parameters (`_op_table.OPS`), so a caller written for another release fails the way it
fails against the vendor's library: `AttributeError: module 'kunlun_ops' has no attribute
'X'` for an operator this release does not have, `TypeError: X() got an unexpected keyword
argument 'Y'` for a keyword it does not take. The kernels themselves do nothing.
"""

from kunlun_ops._op_table import OPS as _OPS

__version__ = "@VERSION@"


def _make(name, params):
    """A function `name(p1=None, p2=None, ...)`: Python's own argument binding does the
    checking, so a wrong keyword raises Python's own TypeError."""
    src = "def %s(%s):\n    return _launch(%r)\n" % (name, ", ".join("%s=None" % p for p in params), name)
    scope = {"_launch": _launch}
    exec(compile(src, "<kunlun_ops>", "exec"), scope)
    fn = scope[name]
    fn.__module__ = __name__
    fn.__qualname__ = name
    return fn


def _launch(name):
    """Kernel launch (no-op in the stand-in)."""
    return None


for _name, _params in _OPS.items():
    globals()[_name] = _make(_name, _params)
del _name, _params


def list_ops():
    """Names of the operators of this release."""
    return sorted(_OPS)
