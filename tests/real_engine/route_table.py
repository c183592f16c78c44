"""The route table of vLLM 0.15.1's OpenAI-compatible server, read from the real program.

Run with the real-engine venv's Python, the server's own arguments and environment:
`python route_table.py OUT.json -- --model ... --port ...`. It builds the FastAPI app as the
server does (`vllm.entrypoints.openai.api_server.build_app(args)`, after the same argument
parser and checks: which routes exist depends on flags and environment, e.g.
VLLM_SERVER_DEV_MODE) and writes every route to OUT.json: path, methods, whether FastAPI
lists it in /openapi.json, whether it refuses a body that is not JSON (the
`validate_json_request` dependency), and the middleware around the app, outermost first.
No engine is started. vllm logs to stdout, hence the file.
"""

import json
import sys


def routes(app):
    """Every route of the app, routers included (FastAPI >= 0.16x keeps an included router
    as one lazy entry; its effective routes are what the app serves)."""
    for route in app.routes:
        if hasattr(route, "effective_route_contexts"):
            yield from route.effective_route_contexts()
        else:
            yield route


def json_body(route):
    for dep in getattr(route, "dependencies", None) or []:
        if getattr(dep.dependency, "__name__", "") == "validate_json_request":
            return True
    return False


def main(argv):
    out, sep, args = argv[0], argv[1], argv[2:]
    assert sep == "--", argv
    from vllm.entrypoints.openai import api_server
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
    validate_parsed_serve_args(parsed)
    app = api_server.build_app(parsed)
    table = []
    for route in routes(app):
        methods = sorted(getattr(route, "methods", None) or [])
        table.append(
            {
                "path": route.path,
                "methods": methods,
                # A Mount (prometheus' /metrics app) serves every path under it.
                "mount": not methods,
                "name": getattr(route, "name", None),
                "in_schema": bool(getattr(route, "include_in_schema", False)),
                "json_body": json_body(route),
            }
        )
    # Outermost first: add_middleware inserts at 0, and Starlette wraps the list's first outermost.
    middleware = [m.cls.__module__ + "." + m.cls.__name__ for m in app.user_middleware]
    with open(out, "w") as fh:
        json.dump({"routes": table, "middleware": middleware}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
