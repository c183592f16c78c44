# SPDX-License-Identifier: Apache-2.0
"""Logging in vLLM's format: `(APIServer pid=N) INFO 11-29 16:55:00 [file.py:123] message`."""

import logging
import os
import sys

_FORMAT = "%(vllm_prefix)s%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


class _Formatter(logging.Formatter):
    def format(self, record):
        record.fileinfo = os.path.basename(record.pathname)
        record.vllm_prefix = "(APIServer pid=%d) " % os.getpid()
        return super().format(record)


_configured = False


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    log = logging.getLogger("vllm")
    log.addHandler(handler)
    log.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    log.propagate = False


def init_logger(name: str) -> logging.Logger:
    _configure_root()
    return logging.getLogger(name)


def uvicorn_log(level: str, message: str) -> None:
    """uvicorn's own lines (`INFO:     Started server process [N]`), same prefix."""
    sys.stdout.write("(APIServer pid=%d) %s %s\n" % (os.getpid(), (level + ":").ljust(9), message))
    sys.stdout.flush()
