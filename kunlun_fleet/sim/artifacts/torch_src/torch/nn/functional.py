"""torch.nn.functional (PyTorch 2.5.1)."""


def silu(input, inplace=False):
    return input


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    raise NotImplementedError("scaled_dot_product_attention: no kernel for this device")
