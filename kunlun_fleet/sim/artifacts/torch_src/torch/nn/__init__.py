from torch.nn import functional  # noqa: F401
