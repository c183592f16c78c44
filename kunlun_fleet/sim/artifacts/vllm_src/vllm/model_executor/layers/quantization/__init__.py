# SPDX-License-Identifier: Apache-2.0
"""Quantization methods known to vLLM 0.15.1."""

from typing import Literal, get_args

QuantizationMethods = Literal[
    "awq",
    "fp8",
    "ptpc_fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "bitblas",
    "gguf",
    "gptq_marlin_24",
    "gptq_marlin",
    "gptq_bitblas",
    "awq_marlin",
    "gptq",
    "compressed-tensors",
    "bitsandbytes",
    "experts_int8",
    "ipex",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "petit_nvfp4",
    "cpu_awq",
]
QUANTIZATION_METHODS: list = list(get_args(QuantizationMethods))

# Out-of-tree methods registered by platform plugins.
_CUSTOMIZED_METHOD_TO_QUANT_CONFIG: dict = {}


def register_quantization_config(quantization: str):
    def _wrapper(cls):
        if quantization in QUANTIZATION_METHODS:
            raise ValueError(f"The quantization method `{quantization}` is already exists.")
        QUANTIZATION_METHODS.append(quantization)
        _CUSTOMIZED_METHOD_TO_QUANT_CONFIG[quantization] = cls
        return cls

    return _wrapper


def get_quantization_config(quantization: str):
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"Invalid quantization method: {quantization}")
    return _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(quantization, quantization)


__all__ = ["QuantizationMethods", "QUANTIZATION_METHODS", "register_quantization_config", "get_quantization_config"]
