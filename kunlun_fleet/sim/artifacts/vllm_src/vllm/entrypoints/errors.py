# SPDX-License-Identifier: Apache-2.0
"""The error answers of vllm 0.15.1's API server (its ErrorResponse, FastAPI's validation
errors as vllm's handler answers them), shared by the server and its routes."""

import json


def dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400, param=None):
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def invalid(message: str, parameter: str, value):
    """vllm 0.15.1's VLLMValidationError as its create_error_response answers it
    (vllm/exceptions.py, entrypoints/openai/engine/serving.py): the parameter is the
    error's param, and the message ends with it and the value."""
    return error_body(f"{message} (parameter={parameter}, value={value})", param=parameter)


def validation_error(details, extra=None):
    """A request FastAPI's validation refuses, as vllm 0.15.1's handler of
    RequestValidationError answers it (entrypoints/openai/api_server.py, build_app): type
    "Bad Request", the message pydantic's account of the errors (`N validation errors:`,
    one per line; vllm adds the endpoint's source location after it, which is left out).
    `extra`: the errors' list appended after a space, as the handler does when the errors
    are plain strings (a dependency's refusal)."""
    head = "%d validation error%s:" % (len(details), "" if len(details) == 1 else "s")
    message = head + "".join("\n  %s" % (d if isinstance(d, str) else repr(d)) for d in details)
    if extra is not None:
        message += " " + extra
    return error_body(message, "Bad Request")


def request_invalid(kind: str, loc: tuple, msg: str, value, ctx=None):
    """One validation error (validation_error) of pydantic's kind `kind` at `loc`."""
    detail = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        detail["ctx"] = ctx
    return validation_error([detail])


def http_exception(status: int, detail: str):
    """An HTTPException a route raises, as build_app's http_exception_handler answers it:
    type the status's phrase."""
    return error_body(detail, PHRASES.get(status, "Error"), status)


PHRASES = {
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class VLLMValidationError(ValueError):
    """vllm.exceptions.VLLMValidationError as pydantic's account of an error shows it (its repr)."""


class HTTPError(Exception):
    def __init__(self, status, body):
        super().__init__(status)
        self.status, self.body = status, body
