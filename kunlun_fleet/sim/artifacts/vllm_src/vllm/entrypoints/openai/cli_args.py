# SPDX-License-Identifier: Apache-2.0
"""Command line arguments of vLLM's OpenAI-compatible server (the flags of vllm 0.15.1).

The table of flags lives in `_flag_table.py`; this module turns it into an argparse
parser that behaves like vllm's FlexibleArgumentParser: `--max_model_len` is accepted
as `--max-model-len`, `--flag=value` works, unknown flags are an argparse error (exit 2),
deprecated flags log a warning.
"""

import argparse
import json
import re
import sys

from vllm.entrypoints.openai._flag_table import FLAGS
from vllm.logger import init_logger

logger = init_logger(__name__)

# Defaults that differ from "None" for the flags the server reads.
DEFAULTS = {
    "model": "Qwen/Qwen3-0.6B",
    "host": None,
    "port": 8000,
    "uvicorn_log_level": "info",
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "dtype": "auto",
    "gpu_memory_utilization": 0.9,
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_dtype": "auto",
    "kv_cache_dtype": "auto",
    "tokenizer_mode": "auto",
    "response_role": "assistant",
    "seed": 0,
    "enable_log_requests": False,
    "disable_log_requests": True,
    "allowed_origins": ["*"],
    "allowed_methods": ["*"],
    "allowed_headers": ["*"],
    "middleware": [],
    "tool_parser_plugin": "",
    "reasoning_parser": "",
    "enable_log_deltas": True,
}

# Flags whose integers may be written like 1k, 32K, 256k, 1M (vllm's human_readable_int).
HUMAN_INT = {"--max-model-len", "--max-num-batched-tokens"}

# Registered parsers in vllm 0.15.1 (vllm/tool_parsers/__init__.py, vllm/reasoning/__init__.py).
TOOL_PARSERS = [
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v32",
    "ernie45",
    "glm45",
    "glm47",
    "granite-20b-fc",
    "granite",
    "hermes",
    "hunyuan_a13b",
    "internlm",
    "jamba",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "llama4_pythonic",
    "longcat",
    "minimax_m2",
    "minimax",
    "mistral",
    "olmo3",
    "openai",
    "phi4_mini_json",
    "pythonic",
    "qwen3_coder",
    "qwen3_xml",
    "seed_oss",
    "step3",
    "step3p5",
    "xlam",
    "gigachat3",
    "functiongemma",
]
REASONING_PARSERS = [
    "deepseek_r1",
    "deepseek_v3",
    "ernie45",
    "glm45",
    "openai_gptoss",
    "granite",
    "holo2",
    "hunyuan_a13b",
    "kimi_k2",
    "minimax_m2",
    "minimax_m2_append_think",
    "mistral",
    "olmo3",
    "qwen3",
    "seed_oss",
    "step3",
    "step3p5",
]


def human_readable_int(value: str) -> int:
    """Parse 25600, 25.6k, 32k, 1M, 256K (lower case: decimal, upper case: binary)."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
                f"{number}{suffix.lower()} instead?"
            )
        return int(number) * binary[suffix]
    return int(value)


def _str_to_json_or_str(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


class FlexibleArgumentParser(argparse.ArgumentParser):
    """argparse with vllm's conveniences: underscores in flag names, deprecated flags."""

    _deprecated = set()

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        if args is None:
            args = sys.argv[1:]
        if "--config" in args:
            args = self._pull_args_from_config(list(args))
        processed = []
        for arg in args:
            if arg.startswith("--") and len(arg) > 2:
                if "=" in arg:
                    key, value = arg.split("=", 1)
                    key = re.sub(r"(?<=--)[^\.]*", lambda m: m.group(0).replace("_", "-"), key)
                    processed.append(f"{key}={value}")
                else:
                    processed.append(re.sub(r"(?<=--)[^\.]*", lambda m: m.group(0).replace("_", "-"), arg))
            else:
                processed.append(arg)
        namespace = super().parse_args(processed, namespace)
        for flag in sorted(self._deprecated):
            dest = flag[2:].replace("-", "_")
            if any(a == flag or a.startswith(flag + "=") or a == "--no-" + flag[2:] for a in processed):
                logger.warning("argument '%s' is deprecated", dest)
        return namespace

    def _pull_args_from_config(self, args):
        """vllm/utils/argparse_utils.py, `_pull_args_from_config`: the file's flags go first,
        so a flag on the command line wins over the file's (the api_server entry point has no
        sub-command: args[0] is a flag)."""
        assert args.count("--config") <= 1, "More than one config file specified!"
        index = args.index("--config")
        if index == len(args) - 1:
            raise ValueError("No config file specified! Please check your command-line arguments.")
        config_args = self.load_config_file(args[index + 1])
        if args[0].startswith("-"):
            return config_args + args[0:index] + args[index + 2 :]
        return [args[0]] + config_args + args[1:index] + args[index + 2 :]

    def load_config_file(self, file_path):
        """`load_config_file`: a .yaml/.yml file of flat keys; true booleans become the bare
        flag, false ones nothing; a list the flag then each item; anything else flag and value."""
        import yaml

        extension = file_path.split(".")[-1]
        if extension not in ("yaml", "yml"):
            raise ValueError(f"Config file must be of a yaml/yml type. {extension} supplied")
        try:
            with open(file_path) as config_file:
                config = yaml.safe_load(config_file)
        except Exception:
            logger.error("Unable to read the config file at %s. Check path correctness", file_path)
            raise
        processed = []
        for key, value in config.items():
            if isinstance(value, bool):
                if value:
                    processed.append("--" + key)
            elif isinstance(value, list):
                if value:
                    processed.append("--" + key)
                    processed.extend(str(item) for item in value)
            else:
                processed.extend(["--" + key, str(value)])
        return processed


def make_arg_parser(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    parser.add_argument(
        "model_tag", type=str, nargs="?", help="The model tag to serve (optional if specified in config)"
    )
    for flag in sorted(FLAGS):
        kind, choices, aliases, extra = FLAGS[flag]
        if not flag.startswith("--"):
            continue
        dest = flag[2:].replace("-", "_")
        names = [flag] + [a for a in aliases if a != flag]
        kw = {"dest": dest, "default": DEFAULTS.get(dest)}
        if kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif kind == "store_true":
            kw["action"] = "store_true"
            kw["default"] = bool(kw["default"])
        elif kind == "int":
            kw["type"] = human_readable_int if flag in HUMAN_INT else int
        elif kind == "float":
            kw["type"] = float
        elif kind == "choice":
            kw["choices"] = list(choices)
        elif kind == "list":
            if flag == "--middleware":
                kw["action"] = "append"
            elif flag in ("--allowed-origins", "--allowed-methods", "--allowed-headers"):
                kw["type"] = json.loads
            else:
                kw["nargs"] = "+"
        elif kind == "json":
            kw["type"] = _str_to_json_or_str
        if "nargs" in extra and kind not in ("bool", "store_true"):
            kw["nargs"] = extra["nargs"].strip("'\"")
        if flag == "--tool-call-parser":
            kw["metavar"] = "{" + ",".join(TOOL_PARSERS) + "} or name registered in --tool-parser-plugin"
        action = parser.add_argument(*names, **kw)
        if extra.get("deprecated"):
            FlexibleArgumentParser._deprecated.add(flag)
        del action
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """Quick checks that raise before loading (vllm's validate_parsed_serve_args)."""
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if getattr(args, "enable_log_outputs", False) and not args.enable_log_requests:
        raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")


def validate_api_server_args(args: argparse.Namespace) -> None:
    if args.enable_auto_tool_choice and args.tool_call_parser not in TOOL_PARSERS:
        raise KeyError(f"invalid tool call parser: {args.tool_call_parser} (chose from {{ {','.join(TOOL_PARSERS)} }})")
    if args.reasoning_parser and args.reasoning_parser not in REASONING_PARSERS:
        raise KeyError(
            f"invalid reasoning parser: {args.reasoning_parser} (chose from {{ {','.join(REASONING_PARSERS)} }})"
        )
