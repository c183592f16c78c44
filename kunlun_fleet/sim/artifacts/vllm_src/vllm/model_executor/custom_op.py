# SPDX-License-Identifier: Apache-2.0
"""Custom ops and the out-of-tree registry platform plugins fill (CustomOp.register_oot)."""


class CustomOp:
    op_registry_oot: dict = {}

    def forward_oot(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward_oot(*args, **kwargs)

    @classmethod
    def register_oot(cls, _decorated_op_cls=None, name=None):
        def decorator(op_cls):
            reg_name = name if name is not None else op_cls.__name__
            CustomOp.op_registry_oot[reg_name] = op_cls
            return op_cls

        if _decorated_op_cls is None:
            return decorator
        return decorator(_decorated_op_cls)


def dummy_forward() -> int:
    """One call of every out-of-tree op, as the profile run's dummy forward pass reaches
    them; an op whose kernel cannot take the call raises here. Returns the count run."""
    for op_cls in list(CustomOp.op_registry_oot.values()):
        op_cls()()
    return len(CustomOp.op_registry_oot)
