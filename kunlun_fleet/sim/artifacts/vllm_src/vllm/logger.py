# SPDX-License-Identifier: Apache-2.0
"""Logging in vLLM's format: `(APIServer pid=N) INFO 11-29 16:55:00 [file.py:123] message`.

As vllm 0.15.1 does it (`vllm/logger.py`, `_configure_vllm_root_logger`): the logger "vllm"
gets one stdout handler with `vllm.logging_utils.NewLineFormatter` at VLLM_LOGGING_LEVEL,
unless VLLM_LOGGING_CONFIG_PATH names a JSON file, which then replaces that configuration
whole (`logging.config.dictConfig`); VLLM_CONFIGURE_LOGGING=0 configures nothing, and with a
config path it is an error. The `(APIServer pid=N) ` prefix is not the formatter's: it is
written by stdout and stderr themselves once the server decorates them
(`vllm/utils/system_utils.py`, `decorate_logs`, called first by `run_server`)."""

import json
import logging
import logging.config
import os
import sys

_FORMAT = os.environ.get("VLLM_LOGGING_PREFIX", "") + "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


def _configure_logging() -> bool:
    return bool(int(os.environ.get("VLLM_CONFIGURE_LOGGING", "1")))


def _default_config() -> dict:
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    return {
        "formatters": {
            "vllm": {"class": "vllm.logging_utils.NewLineFormatter", "datefmt": _DATE_FORMAT, "format": _FORMAT},
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "level": level,
                "stream": os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stdout"),
            },
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
        "version": 1,
        "disable_existing_loggers": False,
    }


_configured = False


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    path = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    if not _configure_logging() and path:
        raise RuntimeError(
            "VLLM_CONFIGURE_LOGGING evaluated to false, but VLLM_LOGGING_CONFIG_PATH was given. "
            "VLLM_LOGGING_CONFIG_PATH implies VLLM_CONFIGURE_LOGGING. Please enable VLLM_CONFIGURE_LOGGING "
            "or unset VLLM_LOGGING_CONFIG_PATH."
        )
    config = _default_config() if _configure_logging() else {}
    if path:
        if not os.path.exists(path):
            raise RuntimeError("Could not load logging config. File does not exist: %s", path)
        with open(path, encoding="utf-8") as handle:
            custom = json.loads(handle.read())
        if not isinstance(custom, dict):
            raise ValueError("Invalid logging config. Expected dict, got %s.", type(custom).__name__)
        config = custom
    if config:
        logging.config.dictConfig(config)


def init_logger(name: str) -> logging.Logger:
    _configure_root()
    return logging.getLogger(name)


def _add_prefix(file, process_name: str, pid: int) -> None:
    """`vllm/utils/system_utils.py` `_add_prefix`: every line written starts with the prefix
    (the colour codes vllm puts around it unless NO_COLOR is set left out)."""
    prefix = "(%s pid=%d) " % (process_name, pid)
    file_write = file.write

    def write_with_prefix(s: str):
        if not s:
            return
        if file.start_new_line:
            file_write(prefix)
        idx = 0
        while (next_idx := s.find("\n", idx)) != -1:
            next_idx += 1
            file_write(s[idx:next_idx])
            if next_idx == len(s):
                file.start_new_line = True
                return
            file_write(prefix)
            idx = next_idx
        file_write(s[idx:])
        file.start_new_line = False

    file.start_new_line = True
    file.write = write_with_prefix


def decorate_logs(process_name: str) -> None:
    if not _configure_logging():
        return
    _add_prefix(sys.stdout, process_name, os.getpid())
    _add_prefix(sys.stderr, process_name, os.getpid())


def uvicorn_log(level: str, message: str) -> None:
    """uvicorn's own lines (`INFO:     Started server process [N]`), through the decorated stdout."""
    sys.stdout.write("%s %s\n" % ((level + ":").ljust(9), message))
    sys.stdout.flush()
