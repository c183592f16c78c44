# SPDX-License-Identifier: Apache-2.0
"""Device memory of one card while serving: when does the SSM state run out?

A model of the deployment notes' observation, not of any deployment rule:

* one P800 has 96 GiB of HBM (xpu-smi: 98304 MiB);
* the KV cache takes what --gpu-memory-utilization gives it: at 0.9 it was 86.24 GiB per
  card, i.e. KV(u) = u x 96 GiB - 0.16 GiB;
* what is left outside the KV cache holds this card's shard of the weights (31 GiB / TP),
  the runtime's own reserve (XRE context, XCCL buffers, activation workspace) and the
  state of the Gated DeltaNet (linear attention) layers of every RUNNING sequence, which
  is allocated as sequences are scheduled;
* at 0.9 the SSM state ran out of memory with 256 concurrent requests; at 0.75, 256 run.

Per sequence and card, the state is the recurrent state (linear layers x value heads / TP
x key dim x value dim, in --mamba-ssm-cache-dtype) plus the short-convolution state
((2 x key heads x key dim + value heads x value dim) / TP x (conv kernel - 1), in the model
dtype). For the Qwen3.5 27B config at TP 8 that is 9.00 MiB + 0.35 MiB in float16; float32
doubles the recurrent part. The runtime reserve is calibrated on the observation: with
3637 MiB, 255 sequences fit at 0.9 and the 256th does not. The same figures give, at 0.75,
room for about 1830 sequences in float16 (about 930 in float32).
"""

import math

CARD_MIB = 98304  # xpu-smi "Memory Usage Total" of a P800
KV_OFFSET_MIB = 0.16 * 1024  # KV(0.9) = 0.9 x 96 GiB - 0.16 GiB = 86.24 GiB (the notes)
WEIGHTS_MIB = 31 * 1024  # the INT8 checkpoint, split over the TP ranks
RUNTIME_RESERVE_MIB = 3637  # calibrated: the 256th sequence does not fit at 0.9
DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}


def kv_cache_mib(gpu_memory_utilization: float) -> float:
    return max(gpu_memory_utilization * CARD_MIB - KV_OFFSET_MIB, 0.0)


def ssm_dtype(args, config: dict) -> str:
    dtype = args.mamba_ssm_cache_dtype or "auto"
    if dtype == "auto":
        tc = config.get("text_config") or config
        dtype = (
            tc.get("mamba_ssm_dtype")
            or config.get("mamba_ssm_dtype")
            or tc.get("dtype")
            or config.get("dtype")
            or "float16"
        )
    return dtype


def ssm_state_mib_per_seq(config: dict, tp: int, state_dtype: str) -> float:
    tc = config.get("text_config") or config
    types = tc.get("layer_types") or []
    layers = sum(1 for t in types if t == "linear_attention") if types else 48
    hv = tc.get("linear_num_value_heads", 48)
    hk = tc.get("linear_num_key_heads", 16)
    dk = tc.get("linear_key_head_dim", 128)
    dv = tc.get("linear_value_head_dim", 128)
    kernel = tc.get("linear_conv_kernel_dim", 4)
    model_bytes = DTYPE_BYTES.get(tc.get("dtype") or config.get("dtype") or "float16", 2)
    recurrent = layers * (hv / tp) * dk * dv * DTYPE_BYTES.get(state_dtype, 2)
    conv = layers * ((2 * hk * dk + hv * dv) / tp) * (kernel - 1) * model_bytes
    return (recurrent + conv) / 2**20


class MemoryModel:
    def __init__(self, args, config: dict):
        self.tp = max(args.tensor_parallel_size or 1, 1)
        self.utilization = float(args.gpu_memory_utilization)
        self.state_dtype = ssm_dtype(args, config)
        self.kv_mib = kv_cache_mib(self.utilization)
        self.fixed_mib = WEIGHTS_MIB / self.tp + RUNTIME_RESERVE_MIB
        self.per_seq_mib = ssm_state_mib_per_seq(config, self.tp, self.state_dtype)

    def used_mib(self, running: int) -> float:
        return self.kv_mib + self.fixed_mib + running * self.per_seq_mib

    def max_running(self) -> int:
        """Running sequences whose SSM state still fits (may be 0)."""
        room = CARD_MIB - self.kv_mib - self.fixed_mib
        return max(int(math.floor(room / self.per_seq_mib)), 0) if room > 0 else 0

    def oom_message(self, running: int) -> str:
        """torch's out-of-memory text for the allocation of the next sequence's state."""
        before = self.used_mib(running - 1)
        free = max(CARD_MIB - before, 0.0)
        return (
            "XPU out of memory. Tried to allocate %.2f MiB. XPU 0 has a total capacity of "
            "%.2f GiB of which %.2f MiB is free. Of the allocated memory %.2f GiB is "
            "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
            % (self.per_seq_mib, CARD_MIB / 1024, free, before / 1024)
        )

    def describe(self) -> str:
        return (
            "KV cache %.2f GiB, weights + runtime %.2f GiB, SSM state %.2f MiB per "
            "sequence (%s): room for %d running sequences per card"
            % (self.kv_mib / 1024, self.fixed_mib / 1024, self.per_seq_mib, self.state_dtype, self.max_running())
        )
