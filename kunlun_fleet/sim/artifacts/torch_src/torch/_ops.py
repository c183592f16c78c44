"""Operator registry (PyTorch 2.5.1)."""


class OpOverloadPacket:
    def __init__(self, qualified_name):
        self._qualified_name = qualified_name

    def __getattr__(self, key):
        raise AttributeError(f"'{self._qualified_name}' has no overload '{key}'")


class _Ops:
    def __init__(self):
        self.loaded_libraries = set()

    def load_library(self, path):
        self.loaded_libraries.add(path)


ops = _Ops()
