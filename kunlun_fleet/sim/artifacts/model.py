"""Small stand-in for the Qwen3.8-27B W8A8 INT8 model directory.

Real config.json (the fields the stack reads), a real byte-level BPE tokenizer.json (the
pipeline of Qwen's tokenizers, over a small vocabulary: transformers' AutoTokenizer loads
it as the model type's tokenizer, so a benchmark client counts tokens as the server does),
a tokenizer_config.json with a ChatML template, and two tiny safetensors shards with valid
headers and an index. Deterministic: same bytes on every build.
"""

import hashlib
import json
import os
import importlib.util
import struct

# The word list the stand-in server generates from: the tokenizer knows all of them.
_PACING = os.path.join(os.path.dirname(__file__), "vllm_src", "vllm", "engine", "pacing.py")
_spec = importlib.util.spec_from_file_location("_kunlun_pacing", _PACING)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
WORDS = _mod.WORDS
# Byte-level BPE (vllm_src/vllm/engine/bpe.py: the trainer here, the server's counter there).
_BPE = os.path.join(os.path.dirname(__file__), "vllm_src", "vllm", "engine", "bpe.py")
_bpe_spec = importlib.util.spec_from_file_location("_kunlun_bpe", _BPE)
_bpe = importlib.util.module_from_spec(_bpe_spec)
_bpe_spec.loader.exec_module(_bpe)

NUM_LAYERS = 64
FULL_ATTENTION_INTERVAL = 4  # every 4th layer full attention: 48 linear + 16 full

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
EXTRA_WORDS = (
    "a an and are as at be by can do for from has have how i in is it me my no "
    "not of on or so that this to was we what when where which who why will with "
    "you your hello hi please say tell write explain list one two three yes "
    "question answer story poem code python user assistant system tool"
).split()


def config(pins: dict) -> dict:
    model = pins["kunlun_stack_model"]
    layer_types = [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(NUM_LAYERS)
    ]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": model["model_type"],
        "dtype": model["dtype"],
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": NUM_LAYERS,
        "layer_types": layer_types,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": model["max_position_embeddings"],
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "vocab_size": 248320,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": 248044,
        "eos_token_id": 248046,
        "mtp_num_hidden_layers": 1,
        "quantization_config": {
            "quant_method": model["quant_method"],
            "format": "int-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*mtp.*", "re:.*linear_attn.in_proj_a.*", "re:.*linear_attn.in_proj_b.*"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "channel",
                        "dynamic": False,
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "token",
                        "dynamic": True,
                    },
                    "output_activations": None,
                }
            },
            "kv_cache_scheme": None,
        },
        "transformers_version": "5.2.0",
    }


def tokenizer_json() -> dict:
    """Byte-level BPE whose merges make every word the stand-in server says one token
    (with and without its leading space, lower case and capitalized); any other text is
    still encodable, byte by byte, as with a real Qwen tokenizer."""
    words = sorted(set(WORDS) | set(EXTRA_WORDS))
    forms = [f for w in words for f in (w, " " + w, w.capitalize(), " " + w.capitalize())]
    return _bpe.tokenizer_json(forms, SPECIAL_TOKENS)


CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 262144,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {},
    }


def _tensor_bytes(name: str, size: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{name}:{counter}".encode()).digest()
        counter += 1
    return out[:size]


def safetensors(tensors: list) -> bytes:
    """tensors: [(name, dtype, shape)] -> bytes of a valid .safetensors file."""
    sizes = {"I8": 1, "F16": 2, "BF16": 2, "F32": 4}
    header = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, dtype, shape in tensors:
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += _tensor_bytes(name, n)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def shards() -> dict:
    """Two shards: layer 0 (linear attention) and layer 3 (full attention), W8A8 style."""

    def linear(prefix, rows, cols):
        return [(f"{prefix}.weight", "I8", [rows, cols]), (f"{prefix}.weight_scale", "F16", [rows, 1])]

    one = (
        linear("model.layers.0.linear_attn.in_proj_qkvz", 32, 16)
        + linear("model.layers.0.mlp.down_proj", 16, 32)
        + [("model.embed_tokens.weight", "F16", [64, 16]), ("model.norm.weight", "F16", [16])]
    )
    two = (
        linear("model.layers.3.self_attn.q_proj", 32, 16)
        + linear("model.layers.3.self_attn.o_proj", 16, 32)
        + [("lm_head.weight", "F16", [64, 16])]
    )
    return {"model-00001-of-00002.safetensors": one, "model-00002-of-00002.safetensors": two}


def build_model_dir(out_dir: str, pins: dict) -> list:
    """Write the model directory; return the file names written (relative, sorted)."""
    os.makedirs(out_dir, exist_ok=True)
    files = {}

    def dump(obj):
        return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()

    files["config.json"] = dump(config(pins))
    files["tokenizer.json"] = dump(tokenizer_json())
    files["tokenizer_config.json"] = dump(tokenizer_config())
    files["generation_config.json"] = dump(
        {
            "bos_token_id": 248044,
            "eos_token_id": [248046, 248044],
            "pad_token_id": 248044,
            "do_sample": True,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "5.2.0",
        }
    )
    weight_map, total = {}, 0
    for fname, tensors in shards().items():
        blob = safetensors(tensors)
        files[fname] = blob
        for name, _, _ in tensors:
            weight_map[name] = fname
        total += len(blob)
    files["model.safetensors.index.json"] = dump(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    )
    for name, blob in files.items():
        with open(os.path.join(out_dir, name), "wb") as fh:
            fh.write(blob)
    return sorted(files)


def sha256_manifest(model_dir: str) -> str:
    """sha256sum lines for the files of model_dir, paths relative to model_dir, sorted."""
    lines = []
    for name in sorted(os.listdir(model_dir)):
        with open(os.path.join(model_dir, name), "rb") as fh:
            lines.append(f"{hashlib.sha256(fh.read()).hexdigest()}  {name}\n")
    return "".join(lines)
