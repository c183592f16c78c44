"""A tiny random-weight Qwen3 model for the real engine (run with the real-engine venv's
Python: it needs torch and transformers). Two layers, hidden size 128, float16, the
vocabulary of the tokenizer files already in the directory (the sim model's byte-level
BPE, kunlun_fleet/sim/artifacts/model.py). Deterministic: a fixed seed. No hub access.

    python make_tiny_model.py MODEL_DIR MAX_POSITION_EMBEDDINGS
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402


def main(out_dir, max_positions):
    with open(os.path.join(out_dir, "tokenizer.json"), encoding="utf-8") as fh:
        tok = json.load(fh)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    size = max([len(tok["model"]["vocab"])] + [i + 1 for i in ids.values()])
    config = Qwen3Config(
        vocab_size=(size + 63) // 64 * 64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=max_positions,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        torch_dtype="float16",
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.float16)
    model.save_pretrained(out_dir, safe_serialization=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
