"""Process groups (PyTorch 2.5.1)."""

_default_backend = "gloo"


def is_nccl_available() -> bool:
    return False


def get_backend(group=None) -> str:
    return _default_backend


def _check_single_tensor(param, param_name) -> None:
    if param is None:
        raise TypeError(f"Invalid function argument. Expected parameter `{param_name}` to be of type torch.Tensor.")
