#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: serving_ready
short_description: Wait until an OpenAI-compatible vllm server lists the model and answers a real completion
description:
  - Polls C(GET {url}/v1/models) (with an C(Authorization) header C(Bearer <api_key>)) every I(interval) seconds until
    the list holds I(served_model_name), for at most I(timeout) seconds. While the model loads, vllm refuses
    connections; that is waited through.
  - Then makes one real completion (C(POST {url}/v1/completions), I(max_tokens) tokens, temperature 0) and
    checks that text came back. With I(stream) (the default) it measures the time to the first token and the
    decode rate from the streamed chunks and the usage the server reports.
  - Fails at once, without waiting out the budget, when the server refuses the key (401/403), when it lists
    other models than I(served_model_name) (a running vllm never changes its list), when I(failed_command)
    reports the service has failed, and when the completion returns an error or no text.
  - Every failure message names the URL, what was seen and the fix, followed by the last I(log_lines) lines
    of the service log read with I(log_command) or from I(log_file). The API key is never printed; it is
    masked in the log lines too.
  - Changes nothing. In check mode it makes a single probe of C(/v1/models), does not wait, makes no
    completion and never fails on what it sees (the service may not have been started in check mode);
    the probe is reported in C(ready), C(models) and C(probe_error).
  - Standard library only (urllib); Python 3.8+.
options:
  url:
    description: Base URL of the server, without C(/v1) (for example C(http://127.0.0.1:8000)).
    type: str
    required: true
  served_model_name:
    description: The name the server must list (its C(--served-model-name)).
    type: str
    required: true
  api_key:
    description: The server's API key (its C(--api-key)). Omit for a server without one.
    type: str
  timeout:
    description: How long to wait for the model to be listed, in seconds (loading takes minutes; the notes saw
      6 minutes fall short). The completion has its own I(request_timeout).
    type: int
    default: 900
  interval:
    description: Seconds between probes.
    type: float
    default: 5
  request_timeout:
    description: Seconds one HTTP request may take (a probe, or the whole completion).
    type: float
    default: 120
  prompt:
    description: The completion's prompt.
    type: str
    default: "Write one short sentence about the sea."
  max_tokens:
    description: Tokens to generate in the completion.
    type: int
    default: 32
  ignore_eos:
    description:
      - Generate all I(max_tokens) tokens even past an end-of-sequence (vllm's C(ignore_eos) sampling
        parameter), so the decode rate is measured over a fixed length.
    type: bool
    default: false
  stream:
    description: Stream the completion and measure C(ttft_s) and C(tokens_per_s) from the chunks.
    type: bool
    default: true
  failed_command:
    description:
      - A command that exits 0 when the service has failed for good, run between probes (for example
        C(systemctl is-failed --quiet kunlun-serve.service)). The wait then stops early with the log lines.
      - Run without a shell; quote arguments as on a command line.
    type: str
  log_command:
    description: A command whose output is the service log (for example
      C(journalctl -u kunlun-serve.service -n 50 --no-pager)). Run without a shell. Wins over I(log_file).
    type: str
  log_file:
    description: A log file of the service, read from its end.
    type: path
  log_lines:
    description: How many of the last log lines to show on failure.
    type: int
    default: 50
  text_chars:
    description: The returned C(completion_text) is cut to this many characters.
    type: int
    default: 200
  validate_certs:
    description: Verify the server certificate of an C(https) URL.
    type: bool
    default: true
  ca_file:
    description:
      - A CA certificate file (PEM) that alone verifies an C(https) server (the fleet CA's, on a serving host). Omitted
        or empty - the system's trust store.
    type: path
  use_proxy:
    description: Honour C(http_proxy)/C(https_proxy) of the environment. Off by default - the check is
      normally made on the serving host against itself, and a proxy would answer for a server that is down.
    type: bool
    default: false
notes:
  - Check mode - a single probe of C(/v1/models), no wait, no completion, no failure.
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Wait for the model and a real completion (15 minutes at most)
  serving_ready:
    url: "https://127.0.0.1:{{ kunlun_stack_serving_effective.port }}"
    ca_file: /etc/kunlun-fleet/ca.crt
    served_model_name: "{{ serve_served_model_name }}"
    api_key: "{{ serve_api_key }}"
    failed_command: systemctl is-failed --quiet kunlun-serve.service
    log_command: journalctl -u kunlun-serve.service -n 50 --no-pager
  register: serve_ready
  no_log: false

- name: Report the single-stream figures
  ansible.builtin.debug:
    msg: "{{ serve_ready.ttft_s }} s to the first token, {{ serve_ready.tokens_per_s }} tok/s"
"""

RETURN = r"""
ready:
  description: The model was listed and (out of check mode) a completion returned text.
  returned: always
  type: bool
waited_s:
  description: Seconds from the first probe until the model was listed (or until giving up).
  returned: always
  type: float
probes:
  description: How many times C(/v1/models) was asked.
  returned: always
  type: int
models:
  description: The model ids the server listed last.
  returned: always
  type: list
  elements: str
  sample: [Qwen3.8-27B-INT8-W8A8-Dynamic]
probe_error:
  description: Why the last probe did not list the model (connection refused, HTTP status, ...); null when it did.
  returned: always
  type: str
completion_text:
  description: The completion's text, cut to I(text_chars) characters. Null in check mode.
  returned: always
  type: str
completion_tokens:
  description: Tokens generated, from the usage the server reported (counted chunks when it sent none).
  returned: always
  type: int
ttft_s:
  description: Seconds from sending the streamed request to the first chunk with text. Null without I(stream).
  returned: always
  type: float
tokens_per_s:
  description: >-
    Decode rate of the completion. Streamed - (completion_tokens - 1) over the time from the first to the last
    token. Not streamed - completion_tokens over the whole request (prefill included).
  returned: always
  type: float
completion_s:
  description: Seconds the completion request took end to end.
  returned: always
  type: float
log:
  description: The last I(log_lines) lines of the service log (on failure only; the key masked).
  returned: failure
  type: list
  elements: str
"""

import json
import shlex
import ssl
import time

import http.client as http_client
import urllib.error as urllib_error
import urllib.request as urllib_request

from ansible.module_utils.basic import AnsibleModule

MASK = "********"


class NotReady(Exception):
    """The server answered, but not yet with the model; keep waiting."""


class Refused(Exception):
    """Waiting will not help (wrong key, other models, failed service, bad completion)."""

    def __init__(self, message, fix):
        Exception.__init__(self, message)
        self.message = message
        self.fix = fix


class Client(object):
    """The few HTTP calls the check needs, with the key in a header and nowhere else."""

    def __init__(self, url, api_key, request_timeout, validate_certs=True, use_proxy=False, ca_file=None):
        self.base = url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.api_key = api_key
        self.request_timeout = request_timeout
        handlers = []
        if not use_proxy:
            handlers.append(urllib_request.ProxyHandler({}))
        # A CA file that cannot be read is told at the first request (check mode reports it as
        # the probe's answer: the stage that installs the file may not have run yet).
        self.ca_problem = None
        if self.base.startswith("https:"):
            try:
                context = ssl.create_default_context(cafile=ca_file or None)
            except (OSError, ssl.SSLError) as exc:
                self.ca_problem = "ca_file %s cannot be read (%s)" % (ca_file, exc.strerror or exc)
                context = None
            if context is not None and not validate_certs:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if context is not None:
                handlers.append(urllib_request.HTTPSHandler(context=context))
        self.opener = urllib_request.build_opener(*handlers)

    def _request(self, method, path, body=None):
        if self.ca_problem:
            raise Refused(
                "%s, which verifies %s" % (self.ca_problem, self.base),
                "install the CA certificate there first (the serve stage puts the fleet CA's on every serving host, "
                "docs/gateway.md), or give ca_file the file that holds it",
            )
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        req = urllib_request.Request(self.base + path, data=data, headers=headers)
        req.get_method = lambda: method
        return self.opener.open(req, timeout=self.request_timeout)

    def models(self):
        """The listed model ids; raises NotReady (keep waiting) or Refused (stop)."""
        url = self.base + "/v1/models"
        try:
            resp = self._request("GET", "/v1/models")
            try:
                raw = resp.read()
            finally:
                resp.close()
        except urllib_error.HTTPError as exc:
            _refuse_auth(exc, "GET %s" % url)
            raise NotReady("HTTP %d %s" % (exc.code, _body_excerpt(exc))) from exc
        except (urllib_error.URLError, OSError, http_client.HTTPException) as exc:
            raise NotReady(_reason(exc)) from exc
        try:
            doc = json.loads(raw.decode("utf-8"))
            return [str(m.get("id")) for m in doc.get("data") or [] if isinstance(m, dict)]
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise NotReady("GET %s returned something that is not a model list: %r" % (url, raw[:200])) from None

    def completion(self, model, prompt, max_tokens, stream, clock, ignore_eos=False):
        """(text, completion_tokens, ttft_s, tokens_per_s, completion_s); raises Refused."""
        url = self.base + "/v1/completions"
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if ignore_eos:
            body["ignore_eos"] = True
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        start = clock()
        try:
            resp = self._request("POST", "/v1/completions", body)
        except urllib_error.HTTPError as exc:
            _refuse_auth(exc, "POST %s" % url)
            raise Refused(
                "POST %s answered HTTP %d: %s" % (url, exc.code, _body_excerpt(exc)),
                "the model is listed but cannot generate; read the service log below "
                "(an engine error, out of memory, a wrong model directory)",
            ) from exc
        except (urllib_error.URLError, OSError, http_client.HTTPException) as exc:
            raise Refused(
                "POST %s failed: %s" % (url, _reason(exc)),
                "the server listed the model and then stopped answering; read the service "
                "log below (it may have died while generating)",
            ) from exc
        try:
            if stream:
                return self._read_stream(resp, url, start, clock)
            raw = resp.read()
        except (OSError, ValueError, http_client.HTTPException) as exc:
            raise Refused(
                "POST %s broke off while reading the answer: %s" % (url, _reason(exc)),
                "read the service log below (the engine may have died while generating)",
            ) from exc
        finally:
            resp.close()
        end = clock()
        try:
            doc = json.loads(raw.decode("utf-8"))
            text = "".join(str(c.get("text") or "") for c in doc.get("choices") or [])
        except (ValueError, AttributeError, UnicodeDecodeError):
            raise Refused(
                "POST %s returned something that is not a completion: %r" % (url, raw[:200]),
                "check that the URL is vllm's OpenAI-compatible server",
            ) from None
        tokens = _usage_tokens(doc)
        rate = tokens / (end - start) if tokens and end > start else None
        return text, tokens, None, rate, end - start

    def _read_stream(self, resp, url, start, clock):
        text = []
        first = last = None
        chunks = 0
        usage_tokens = None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                doc = json.loads(payload.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                raise Refused(
                    "POST %s streamed a chunk that is not JSON: %r" % (url, payload[:200]),
                    "check that the URL is vllm's OpenAI-compatible server",
                ) from None
            if isinstance(doc.get("error"), dict):
                raise Refused(
                    "POST %s streamed an error: %s" % (url, doc["error"].get("message")),
                    "the engine failed while generating; read the service log below",
                )
            if doc.get("usage"):
                usage_tokens = _usage_tokens(doc)
            piece = "".join(str(c.get("text") or "") for c in doc.get("choices") or [])
            if piece:
                now = clock()
                if first is None:
                    first = now
                last = now
                chunks += 1
                text.append(piece)
        end = clock()
        tokens = usage_tokens if usage_tokens is not None else chunks
        ttft = first - start if first is not None else None
        rate = None
        if tokens and tokens > 1 and last is not None and last > first:
            rate = (tokens - 1) / (last - first)
        elif tokens and end > start:
            rate = tokens / (end - start)
        return "".join(text), tokens, ttft, rate, end - start


def _usage_tokens(doc):
    usage = doc.get("usage") or {}
    try:
        return int(usage.get("completion_tokens"))
    except (TypeError, ValueError):
        return None


def _body_excerpt(exc):
    try:
        raw = exc.read()[:300]
    except Exception:  # the body may be gone with the connection
        return str(exc.reason)
    try:
        return raw.decode("utf-8", "replace").strip() or str(exc.reason)
    except AttributeError:
        return str(exc.reason)


def _reason(exc):
    reason = getattr(exc, "reason", None) or exc
    return str(reason)


def _refuse_auth(exc, what):
    if exc.code in (401, 403):
        raise Refused(
            "%s answered HTTP %d %s: the server refuses the API key it was given"
            % (what, exc.code, "Unauthorized" if exc.code == 401 else "Forbidden"),
            "pass the key the service was started with (its --api-key; serve keeps it in the vault) as api_key",
        )


def read_log(module, log_command, log_file, lines, secret):
    """(source, last lines) of the service log, with the secret masked; never raises."""
    if lines <= 0 or not (log_command or log_file):
        return None, []
    if log_command:
        source = "`%s`" % log_command
        try:
            argv = shlex.split(log_command)
            rc, out, err = module.run_command(argv)
        except Exception as exc:  # a log we cannot read must not hide the real failure
            return source, ["(could not run the log command: %s)" % exc]
        text = out + (("\n" + err) if err and err.strip() else "")
        if rc != 0 and not text.strip():
            text = "(the log command exited %d with no output)" % rc
    else:
        source = log_file
        try:
            text = _tail_file(log_file, lines)
        except (IOError, OSError) as exc:
            return source, ["(could not read %s: %s)" % (log_file, exc)]
    found = text.splitlines()[-lines:]
    if secret:
        found = [line.replace(secret, MASK) for line in found]
    return source, found


def _tail_file(path, lines):
    """The end of a file, enough for `lines` lines, without reading a large log whole."""
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        block = 64 * 1024
        data = b""
        pos = size
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            handle.seek(pos)
            data = handle.read(step) + data
    return data.decode("utf-8", "replace")


def wait_ready(module, params, clock=time.monotonic, sleep=time.sleep):
    """Run the check; returns the result dict, or raises Refused with result attached."""
    client = Client(
        params["url"],
        params["api_key"],
        params["request_timeout"],
        params["validate_certs"],
        params["use_proxy"],
        params.get("ca_file"),
    )
    name = params["served_model_name"]
    result = dict(
        ready=False,
        waited_s=0.0,
        probes=0,
        models=[],
        probe_error=None,
        completion_text=None,
        completion_tokens=None,
        ttft_s=None,
        tokens_per_s=None,
        completion_s=None,
    )
    start = clock()
    deadline = start + params["timeout"]
    models_url = client.base + "/v1/models"
    failed_argv = shlex.split(params["failed_command"]) if params["failed_command"] else None
    while True:
        result["probes"] += 1
        try:
            models = client.models()
        except NotReady as exc:
            result["probe_error"] = str(exc)
            models = None
        except Refused as exc:
            result["probe_error"] = exc.message
            result["waited_s"] = round(clock() - start, 2)
            if module.check_mode:
                return result
            exc.result = result
            raise
        result["waited_s"] = round(clock() - start, 2)
        if models is not None:
            result["models"] = models
            if name in models:
                result["probe_error"] = None
                break
            result["probe_error"] = "listed %s, not %r" % (", ".join(models) or "no model", name)
            if not module.check_mode:
                exc = Refused(
                    "GET %s lists %s but not %r" % (models_url, models or "no model", name),
                    "set served_model_name to the service's --served-model-name (or fix the service's flag)",
                )
                exc.result = result
                raise exc
        if module.check_mode:
            return result
        if failed_argv:
            rc, _out, _err = module.run_command(failed_argv)
            if rc == 0:
                exc = Refused(
                    "the service has failed (`%s` exited 0) before %s listed %r; last answer: %s"
                    % (params["failed_command"], models_url, name, result["probe_error"]),
                    "read the service log below, fix the cause and restart the service",
                )
                exc.result = result
                raise exc
        now = clock()
        if now >= deadline:
            exc = Refused(
                "%s did not list %r within %d s (%d probes; last answer: %s)"
                % (models_url, name, params["timeout"], result["probes"], result["probe_error"]),
                "read the service log below; if it is still loading the model, raise timeout "
                "(loading takes minutes); if it stopped, fix the cause and restart the service",
            )
            exc.result = result
            raise exc
        sleep(max(0.0, min(params["interval"], deadline - now)))

    if module.check_mode:
        result["ready"] = True
        return result
    try:
        text, tokens, ttft, rate, took = client.completion(
            name, params["prompt"], params["max_tokens"], params["stream"], clock, params["ignore_eos"]
        )
    except Refused as exc:
        exc.result = result
        raise
    result.update(
        completion_tokens=tokens,
        ttft_s=_round(ttft),
        tokens_per_s=_round(rate, 2),
        completion_s=_round(took),
        completion_text=text[: params["text_chars"]],
    )
    if not text.strip():
        exc = Refused(
            "POST %s/v1/completions for %r returned no text (%s tokens reported)" % (client.base, name, tokens),
            "the model loads but does not generate; read the service log below (a wrong "
            "model directory, tokenizer or quantization)",
        )
        exc.result = result
        raise exc
    result["ready"] = True
    return result


def _round(value, digits=3):
    return None if value is None else round(value, digits)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            served_model_name=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            timeout=dict(type="int", default=900),
            interval=dict(type="float", default=5.0),
            request_timeout=dict(type="float", default=120.0),
            prompt=dict(type="str", default="Write one short sentence about the sea."),
            max_tokens=dict(type="int", default=32, no_log=False),  # a count, not a secret
            ignore_eos=dict(type="bool", default=False),
            stream=dict(type="bool", default=True),
            failed_command=dict(type="str"),
            log_command=dict(type="str"),
            log_file=dict(type="path"),
            log_lines=dict(type="int", default=50),
            text_chars=dict(type="int", default=200),
            validate_certs=dict(type="bool", default=True),
            ca_file=dict(type="path"),
            use_proxy=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not params["url"].startswith(("http://", "https://")):
        module.fail_json(
            msg="url %r is not an http:// or https:// URL. Fix: give the server's base URL, "
            "for example http://127.0.0.1:8000" % params["url"]
        )
    for key in ("timeout", "max_tokens", "request_timeout", "interval"):
        if params[key] <= 0 and not (key == "interval" and params[key] == 0):
            module.fail_json(
                msg="%s is %s; it must be positive. Fix: use the default (%s)"
                % (key, params[key], module.argument_spec[key]["default"])
            )
    try:
        result = wait_ready(module, params)
    except Refused as exc:
        source, lines = read_log(
            module, params["log_command"], params["log_file"], params["log_lines"], params["api_key"]
        )
        msg = "%s. Fix: %s." % (exc.message, exc.fix)
        if source:
            msg += "\nLast %d lines of %s:\n%s" % (len(lines), source, "\n".join(lines) or "(empty)")
        else:
            msg += " (give log_command or log_file to see the service log here)"
        result = getattr(exc, "result", {})
        result.pop("failed", None)
        if params["api_key"]:
            msg = msg.replace(params["api_key"], MASK)
        module.fail_json(msg=msg, log=lines, **result)
    if module.check_mode and not result["ready"]:
        module.warn(
            "check mode: one probe of %s/v1/models did not list %r (%s); not waited for"
            % (params["url"].rstrip("/"), params["served_model_name"], result["probe_error"])
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
