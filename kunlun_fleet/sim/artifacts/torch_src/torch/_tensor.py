"""torch.Tensor (PyTorch 2.5.1): only what is read of it here (a tensor made on a device
and copied back to the host). The values live in a Python list."""


def _place(where):
    """The torch.device a tensor goes to; a cuda device must be one torch.cuda sees."""
    import torch

    dev = where if isinstance(where, torch.device) else torch.device(str(where or "cpu"))
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        return torch.device("cuda", torch.cuda._checked_index(dev.index))
    raise RuntimeError(f"PyTorch is not linked with support for {dev.type} devices")


class Tensor:
    def __init__(self, values, dtype, device):
        self._values = list(values)
        self.dtype = dtype
        self.device = device

    @property
    def shape(self):
        return (len(self._values),)

    def numel(self):
        return len(self._values)

    def __len__(self):
        return len(self._values)

    def tolist(self):
        return list(self._values)

    def to(self, device):
        return Tensor(self._values, self.dtype, _place(device))

    def cpu(self):
        return self.to("cpu")

    def __repr__(self):
        extra = "" if self.device.type == "cpu" else f", device='{self.device}'"
        return f"tensor({self._values}{extra})"
