# SPDX-License-Identifier: Apache-2.0
"""What vLLM checks about the model and the devices before it loads weights.

Each failure raises the exception type and message the real stack raises in that case
(huggingface_hub / transformers / vllm config validation), so the service log reads the
same.
"""

import glob
import json
import os
import re
import struct
import zlib

from vllm.logger import init_logger

logger = init_logger("vllm.engine.model_check")


class HFValidationError(ValueError):
    """huggingface_hub.errors.HFValidationError"""

    __module__ = "huggingface_hub.errors"


class LocalEntryNotFoundError(OSError):
    __module__ = "huggingface_hub.errors"


REPO_ID_RE = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")

KNOWN_MODEL_TYPES = {
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen2",
    "qwen2_moe",
    "llama",
    "mistral",
    "mixtral",
    "deepseek_v2",
    "deepseek_v3",
    "gemma2",
    "gemma3",
}
# Activation dtypes each quantization method supports on this platform.
QUANT_DTYPES = {
    "compressed-tensors": ["float16"],
    "fp8": ["float16", "bfloat16"],
    "awq": ["float16"],
    "gptq": ["float16"],
}
TORCH_DTYPE = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}


def resolve_model(model: str) -> str:
    """Local directory, or what the hub lookup would say (the hub is never reached here)."""
    if os.path.isdir(model):
        return os.path.abspath(model)
    offline = os.environ.get("HF_HUB_OFFLINE", "0").upper() in ("1", "ON", "YES", "TRUE")
    if not REPO_ID_RE.match(model) or "--" in model or ".." in model:
        if model.count("/") > 1 or model.startswith("/"):
            raise HFValidationError(
                "Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
                f"'{model}'. Use `repo_type` argument if needed."
            )
        raise HFValidationError(
            "Repo id must use alphanumeric chars or '-', '_', '.', '--' and '..' are "
            f"forbidden, '-' and '.' cannot start or end the name, max length is 96: '{model}'."
        )
    if offline:
        raise LocalEntryNotFoundError(
            "Cannot find the requested files in the disk cache and outgoing traffic has been "
            "disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' "
            "to False."
        )
    raise OSError(
        "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't "
        "find them in the cached files.\nCheck your internet connection or see how to run "
        "the library in offline mode at "
        "'https://huggingface.co/docs/transformers/installation#offline-mode'."
    )


def load_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            "Invalid repository ID or local directory specified:"
            " '{model}'.\nPlease verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized "
            "configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a "
            "'config.json'.\n"
            "   - For Mistral models: ensure the presence of a "
            "'params.json'.\n".format(model=model_dir)
        )
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OSError(f"It looks like the config file at '{path}' is not a valid JSON file.") from exc
    if not isinstance(config, dict):
        raise OSError(f"It looks like the config file at '{path}' is not a valid JSON file.")
    model_type = config.get("model_type")
    if model_type not in KNOWN_MODEL_TYPES:
        raise ValueError(
            f"The checkpoint you are trying to load has model type `{model_type}` but "
            "Transformers does not recognize this architecture. This could be because of an "
            "issue with the checkpoint, or because your version of Transformers is out of date."
        )
    return config


def text_config(config: dict) -> dict:
    return config.get("text_config") or config


def check_config(args, config: dict) -> int:
    """dtype, quantization and length checks; returns the max_model_len to serve."""
    tc = text_config(config)
    quant = config.get("quantization_config") or tc.get("quantization_config") or {}
    quant_method = quant.get("quant_method")
    if quant_method == "compressed_tensors":
        quant_method = "compressed-tensors"
    if args.quantization and quant_method and args.quantization != quant_method:
        raise ValueError(
            "Quantization method specified in the model config "
            f"({quant_method}) does not match the quantization "
            f"method specified in the `quantization` argument "
            f"({args.quantization})."
        )
    method = args.quantization or quant_method
    config_dtype = config.get("dtype") or config.get("torch_dtype") or tc.get("dtype") or "float16"
    dtype = config_dtype if args.dtype == "auto" else TORCH_DTYPE.get(args.dtype, args.dtype)
    if method in QUANT_DTYPES and dtype not in QUANT_DTYPES[method]:
        supported = ", ".join(f"torch.{d}" for d in QUANT_DTYPES[method])
        raise ValueError(
            f"torch.{dtype} is not supported for quantization method {method}. Supported dtypes: [{supported}]"
        )
    derived = tc.get("max_position_embeddings")
    rope = tc.get("rope_scaling")
    params = tc.get("rope_parameters")
    if not rope and isinstance(params, dict) and params.get("rope_type") not in (None, "default"):
        rope = params
    factor = 1.0
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("yarn", "dynamic", "linear", "longrope"):
        factor = float(rope.get("factor", 1.0))
    if derived is None:
        derived = 2048
    derived_scaled = int(derived * factor)
    max_len = args.max_model_len
    if max_len is None or max_len == -1:
        max_len = derived_scaled
    elif max_len > derived_scaled and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") != "1":
        raise ValueError(
            f"User-specified max_model_len ({max_len}) is greater "
            f"than the derived max_model_len (max_position_embeddings="
            f"{derived_scaled} or model_max_length=None in model's config.json). "
            "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses "
            "relative position encoding (RoPE), positions exceeding derived_max_model_len lead "
            "to nan. If the model uses absolute position encoding, positions exceeding "
            "derived_max_model_len will cause a CUDA array out-of-bounds error."
        )
    if max_len > derived:
        # YaRN beyond the native window: the KV cache for one full-length request no longer
        # fits in what gpu_memory_utilization leaves (16 full-attention layers, 64 KiB/token).
        needed = max_len * 64 * 1024 / 2**30
        available = kv_cache_gib(args)
        if needed > available:
            raise ValueError(
                f"To serve at least one request with the models's max seq len ({max_len}), "
                f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV "
                f"cache memory ({available:.2f} GiB). Based on the available memory, the "
                f"estimated maximum model length is {int(available * 2**30 / 65536)}. Try "
                "increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine."
            )
    return int(max_len)


def kv_cache_gib(args) -> float:
    """KV cache left on one card: 96 GiB x utilisation - weights shard - activations."""
    tp = max(args.tensor_parallel_size or 1, 1)
    return max(96.0 * args.gpu_memory_utilization - 31.0 / tp - 8.5, 0.0) / 1.6


def visible_devices() -> list:
    """Device nodes this process may use: /dev/xpuN, restricted by XPU_VISIBLE_DEVICES."""
    dev_dir = os.environ.get("KUNLUN_SIM_DEV_DIR", "/dev")
    present = sorted(
        int(m.group(1))
        for p in glob.glob(os.path.join(dev_dir, "xpu*"))
        for m in [re.fullmatch(r"xpu(\d+)", os.path.basename(p))]
        if m
    )
    visible = os.environ.get("XPU_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return present
    wanted = []
    for part in visible.split(","):
        part = part.strip()
        if part.isdigit():
            wanted.append(int(part))
    return [d for d in wanted if d in present]


def unusable_devices() -> list:
    """[(index, node, error)] of visible nodes that cannot be opened: a node with no driver
    behind it answers ENXIO, as a device the kunlun driver failed to bring up does."""
    dev_dir = os.environ.get("KUNLUN_SIM_DEV_DIR", "/dev")
    bad = []
    for index in visible_devices():
        node = os.path.join(dev_dir, "xpu%d" % index)
        try:
            os.close(os.open(node, os.O_RDWR | getattr(os, "O_CLOEXEC", 0)))
        except OSError as exc:
            bad.append((index, node, "[Errno %d] %s" % (exc.errno, exc.strerror)))
    return bad


def check_devices(args, platform=None) -> int:
    """Devices the engine can use against the world size. With the platform plugin loaded
    the count is the platform's (torch_xmlir's), else the visible nodes that open."""
    if platform is not None:
        count = platform.device_count()
        bad = platform.unusable_devices() if hasattr(platform, "unusable_devices") else []
    else:
        bad = unusable_devices()
        count = len(visible_devices()) - len(bad)
    world = (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)
    for index, node, error in bad:
        logger.error("XPU %d (%s) failed to initialize: %s", index, node, error)
    if count < world:
        raise ValueError(
            f"World size ({world}) is larger than the number of "
            f"available GPUs ({count}) in this node. If this is "
            "intentional and you are using:\n"
            "- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' appropriately."
        )
    return count


def read_safetensors(model_dir: str) -> list:
    """Parse every *.safetensors header (8-byte length + JSON), like the loader does."""
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise RuntimeError(f"Cannot find any model weights with `{model_dir}`")
    out = []
    for path in files:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise RuntimeError(f"Error while deserializing header: HeaderTooSmall ({path})")
            (n,) = struct.unpack("<Q", raw)
            size = os.path.getsize(path)
            if n > size - 8:
                raise RuntimeError(f"Error while deserializing header: InvalidHeaderDeserialization ({path})")
            try:
                header = json.loads(fh.read(n))
            except ValueError as exc:
                raise RuntimeError(f"Error while deserializing header: InvalidHeaderDeserialization ({path})") from exc
        end = max([v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] or [0])
        if 8 + n + end != size:
            raise RuntimeError(f"Error while deserializing header: MetadataIncompleteBuffer ({path})")
        out.append((path, len(header) - ("__metadata__" in header)))
    return out


class Tokenizer:
    """Counts tokens with the model's tokenizer.json: a byte-level BPE exactly as the
    `tokenizers` library does (vllm.engine.bpe), a word-level vocabulary by its words."""

    SPECIAL = re.compile(r"<\|[a-z_]+\|>")

    def __init__(self, model_dir: str):
        self.word_level = False
        self.vocab = {}
        self.bpe = None
        self.bpe_vocab = {}
        path = os.path.join(model_dir, "tokenizer.json")
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            model = data.get("model") or {}
            if model.get("type") == "WordLevel":
                self.word_level = True
                self.vocab = model.get("vocab") or {}
            elif model.get("type") == "BPE":
                from vllm.engine.bpe import Encoder

                self.bpe = Encoder(data)
                self.bpe_vocab = model.get("vocab") or {}
        except (OSError, ValueError, KeyError):
            pass

    def token_id(self, piece: str) -> int:
        """The id of one generated piece (a word, with its leading space after the first):
        the sim model's byte-level BPE has every such piece as one token (its id in the
        vocabulary, so the ids decode to the text); a word-level vocabulary, the word's.
        A tokenizer that does not know the piece: a stable id from its CRC-32 (not
        decodable; no model directory of the product's is like that)."""
        if self.bpe is not None:
            from vllm.engine.bpe import to_byte_level

            found = self.bpe_vocab.get(to_byte_level(piece))
            if isinstance(found, int):
                return found
        elif self.word_level:
            found = self.vocab.get(piece.strip())
            if isinstance(found, int):
                return found
        return zlib.crc32(piece.encode("utf-8")) % 150000

    def count(self, text: str) -> int:
        if self.bpe is not None:
            return self.bpe.count(text)
        specials = len(self.SPECIAL.findall(text))
        text = self.SPECIAL.sub(" ", text)
        if self.word_level:
            return specials + len(re.findall(r"\w+|[^\w\s]+", text))
        return specials + (len(text.encode("utf-8")) + 3) // 4

    def encode(self, text: str):
        """(ids, token strings) of `text` (/tokenize): the byte-level BPE's (bpe.Encoder); a
        word-level vocabulary's words; otherwise none."""
        if self.bpe is not None:
            return self.bpe.encode(text)
        if self.word_level:
            words = [w for w in re.findall(r"\w+|[^\w\s]+", text) if isinstance(self.vocab.get(w), int)]
            return [self.vocab[w] for w in words], words
        return [], []

    def decode(self, ids) -> str:
        """The text of token ids (/detokenize): the byte-level BPE's (bpe.Encoder); a
        word-level vocabulary's words joined by spaces."""
        if self.bpe is not None:
            return self.bpe.decode(ids)
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[i] for i in ids if i in words)

    def chat(self, messages, add_generation_prompt=True) -> str:
        parts = []
        for m in messages or []:
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content or ''}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)
