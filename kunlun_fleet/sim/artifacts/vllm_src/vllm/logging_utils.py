# SPDX-License-Identifier: Apache-2.0
"""vllm 0.15.1's log formatter (`vllm/logging_utils/formatter.py`, `NewLineFormatter`): the
source file's name as `fileinfo` (vllm shortens a relative path instead at DEBUG), and each
further line of a multi-line message starts with the first line's prefix. A logging
configuration (VLLM_LOGGING_CONFIG_PATH) names it by this path."""

import logging
import os


class NewLineFormatter(logging.Formatter):
    def format(self, record):
        record.fileinfo = os.path.basename(record.pathname)
        msg = super().format(record)
        if record.message != "":
            parts = msg.split(record.message)
            msg = msg.replace("\n", "\r\n" + parts[0])
        return msg


ColoredFormatter = NewLineFormatter  # vllm's adds ANSI colours, on a terminal only
