"""torch_xmlir: Kunlunxin XPU runtime bridge for xpytorch."""

from torch_xmlir import _XMLIRC  # noqa: F401

__version__ = "3.3.1.0"
