# SPDX-License-Identifier: Apache-2.0
try:
    from ._version import __version__, __version_tuple__
except Exception:  # pragma: no cover
    __version__ = "dev"
    __version_tuple__ = (0, 0, __version__)
