# SPDX-License-Identifier: Apache-2.0
"""vLLM: a high-throughput and memory-efficient inference and serving engine for LLMs."""

from vllm.version import __version__, __version_tuple__

__all__ = ["__version__", "__version_tuple__"]
