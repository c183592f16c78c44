# SPDX-License-Identifier: Apache-2.0
"""The `vllm` command: `vllm serve <model> [options]`, `vllm --version`."""

import sys

from vllm.version import __version__ as VLLM_VERSION

USAGE = """usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...

vLLM CLI

positional arguments:
  {chat,complete,serve,bench,collect-env,run-batch}
    serve               Launch a local OpenAI-compatible API server to serve LLM
                        completions via HTTP.

options:
  -h, --help            show this help message and exit
  -v, --version         show program's version number and exit
"""
COMMANDS = ("chat", "complete", "serve", "bench", "collect-env", "run-batch")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-v", "--version"):
        print(VLLM_VERSION)
        return
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return
    if argv[0] not in COMMANDS:
        sys.stderr.write(USAGE.split("\n\n")[0] + "\n")
        sys.stderr.write(
            f"vllm: error: argument subparser: invalid choice: '{argv[0]}' "
            f"(choose from {', '.join(repr(c) for c in COMMANDS)})\n"
        )
        sys.exit(2)
    if argv[0] != "serve":
        sys.stderr.write(f"vllm {argv[0]}: not available in this build\n")
        sys.exit(1)
    from vllm.entrypoints.openai.api_server import run
    from vllm.entrypoints.openai.cli_args import FlexibleArgumentParser, make_arg_parser

    rest = argv[1:]
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]"))
    args = parser.parse_args(rest)
    run(args)


if __name__ == "__main__":
    main()
