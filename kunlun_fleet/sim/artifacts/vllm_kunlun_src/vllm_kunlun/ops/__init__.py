"""Kunlun kernels of vLLM's layers, registered as out-of-tree custom ops.

`register_ops()` (run by the `vllm.general_plugins` entry point) registers one custom op
per kunlun_ops call this commit makes (`_calls.CALLS`). vLLM runs every registered op once
in its profile run at engine start, so a call that the installed kunlun_ops cannot take
fails there, with Python's own error: `AttributeError: module 'kunlun_ops' has no
attribute ...` or `TypeError: ...() got an unexpected keyword argument ...`.
"""

from vllm_kunlun.ops._calls import CALLS


def _make_forward(op_name, kwargs):
    def forward_oot(*_args, **_kw):
        import kunlun_ops

        fn = getattr(kunlun_ops, op_name)
        return fn(**{k: None for k in kwargs})

    forward_oot.__name__ = "forward_oot_" + op_name
    return forward_oot


def register_ops():
    from vllm.model_executor.custom_op import CustomOp

    for op_name, kwargs in CALLS:
        cls = type("Kunlun_" + op_name, (CustomOp,), {"forward_oot": _make_forward(op_name, kwargs)})
        CustomOp.register_oot(name="kunlun." + op_name)(cls)
    return len(CALLS)
