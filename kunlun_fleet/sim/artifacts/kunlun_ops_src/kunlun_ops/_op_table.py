"""Operators of kunlun_ops 0.1.58 and the keyword parameters each one takes.

The stand-in's table: names and keywords are the stand-in's own model of this release
(the vendor's library is not public). What matters below the line is the relation
between this table and the operator calls each vllm-kunlun commit makes
(`vllm_kunlun/ops/_calls.py` in its source): commit 4885de2 calls a subset of it; commit
2fda97b (0.25.1-dev) was written for a later kunlun_ops and, against this release, hits a
causal_conv1d keyword mismatch, 11 missing operators and 3 other keyword mismatches, as
the deployment notes found.
"""

OPS = {
    # Gated DeltaNet (linear attention) short convolution, prefill and decode
    "causal_conv1d_fn": (
        "x",
        "out",
        "dim",
        "cu_seqlen",
        "weight",
        "width",
        "conv_states",
        "num_cache_lines",
        "state_width",
        "query_start_loc_cpu",
        "query_start_loc",
        "batch_size",
        "bias",
        "cache_indices_cpu",
        "cache_indices_xpu",
        "has_initial_state_cpu",
        "has_initial_state_xpu",
        "act",
        "state_seq_stride",
    ),
    "causal_conv1d_update": (
        "x",
        "conv_state",
        "weight",
        "bias",
        "act",
        "cache_seqlens",
        "conv_state_indices_cpu",
        "conv_state_indices_xpu",
        "state_seq_stride",
    ),
    # Gated DeltaNet recurrence
    "chunk_gated_delta_rule": (
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "initial_state",
        "output_final_state",
        "cu_seqlens",
        "head_first",
    ),
    "fused_recurrent_gated_delta_rule": (
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "initial_state",
        "inplace_final_state",
        "cu_seqlens",
        "ssm_state_indices",
        "use_qk_l2norm_in_kernel",
    ),
    "l2norm_fwd": ("x", "eps", "output_dtype"),
    # norms and activations
    "rms_norm": ("x", "weight", "eps", "out"),
    "fused_add_rms_norm": ("x", "residual", "weight", "eps"),
    "gemma_rms_norm": ("x", "weight", "eps", "out"),
    "silu_and_mul": ("x", "out"),
    "sigmoid_gate_mul": ("x", "gate", "out"),
    # W8A8 int8 (compressed-tensors, dynamic per-token activations)
    "dynamic_per_token_quant_int8": ("x", "out", "scale", "azp"),
    "w8a8_int8_dynamic": ("x", "weight", "weight_scale", "bias", "out_dtype", "out"),
    # full attention
    "rotary_embedding": ("positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"),
    "reshape_and_cache": ("key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype"),
    "paged_attention": (
        "out",
        "query",
        "key_cache",
        "value_cache",
        "block_tables",
        "seq_lens",
        "max_seq_len",
        "scale",
        "alibi_slopes",
        "kv_cache_dtype",
    ),
    "flash_attention_varlen": (
        "q",
        "k",
        "v",
        "out",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
        "softmax_scale",
        "causal",
    ),
    # sampling
    "top_k_top_p_sampling": ("logits", "top_k", "top_p", "generators"),
}
