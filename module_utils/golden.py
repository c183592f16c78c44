# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The golden-output check of a stack upgrade (docs/upgrades.md), shared by the modules that
run it: library/golden_outputs.py (record on one host, compare on another) and
library/canary_measure.py (both hosts side by side, inside the canary gate).

Each prompt goes alone (a batch of one) as a completion with greedy decoding and a fixed
length, asking vLLM's OpenAI-compatible server for token ids (completion_body); the answers
are compared token id for token id (compare), never as text. Standard library and
ansible-core's open_url only.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import json
import re

from urllib.error import HTTPError

from ansible.module_utils.urls import open_url

__metaclass__ = type

DEFAULT_MAX_TOKENS = 32
# Short and of different kinds, so that a numerics change shows in some of them: a fact, a
# plain sentence, arithmetic, code, a list, translation, a story opening, and Chinese
# (multi-byte text, the fleet's users' language).
DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write one short sentence about the sea.",
    "Q: What is 17 multiplied by 3?\nA:",
    "def fibonacci(n):",
    "List three prime numbers:",
    "Translate to French: Good morning, how are you?",
    "Once upon a time, in a small village by the mountains,",
    "请用一句话介绍长城。",
]
TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
EXCERPT_CHARS = 40
CONTEXT_CHARS = 32


class Failed(Exception):
    """The outputs could not be obtained; the message names what and the fix."""


# ----------------------------------------------------------------------------- comparison
def first_divergence(baseline_ids, canary_ids):
    """The index of the first token that differs; the shorter length when one is a prefix
    of the other; None when identical."""
    for index, (a, b) in enumerate(zip(baseline_ids, canary_ids)):
        if a != b:
            return index
    if len(baseline_ids) != len(canary_ids):
        return min(len(baseline_ids), len(canary_ids))
    return None


def _common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _excerpt(text, chars=EXCERPT_CHARS):
    return text if len(text) <= chars else text[:chars] + "..."


def _short_prompt(prompt, chars=40):
    return repr(prompt if len(prompt) <= chars else prompt[:chars] + "...")


def compare(baseline_outputs, canary_outputs, max_tokens, min_agreeing_tokens=0, prompts=None):
    """The verdict on two lists of outputs (dicts with token_ids, text and, optionally,
    token_logprobs and finish_reason), prompt by prompt in the same order. Returns
    {passed, verdict, failing, divergences}."""
    k = int(min_agreeing_tokens or 0)
    prompts = prompts or [None] * len(baseline_outputs)
    divergences, failing = [], []
    for index, (base, canary) in enumerate(zip(baseline_outputs, canary_outputs)):
        b_ids, c_ids = list(base.get("token_ids") or []), list(canary.get("token_ids") or [])
        at = first_divergence(b_ids, c_ids)
        ok = at is None or (k > 0 and at >= k)
        entry = {
            "index": index,
            "diverges_at": at,
            "passed": ok,
            "baseline_tokens": len(b_ids),
            "canary_tokens": len(c_ids),
            "baseline_excerpt": None,
            "canary_excerpt": None,
            "context": None,
            "texts_equal": None,
            "baseline_logprob": None,
            "canary_logprob": None,
        }
        if at is not None:
            b_text, c_text = str(base.get("text") or ""), str(canary.get("text") or "")
            same = _common_prefix(b_text, c_text)
            context = b_text[:same]
            entry.update(
                baseline_excerpt=_excerpt(b_text[same:]),
                canary_excerpt=_excerpt(c_text[same:]),
                context=("..." + context[-CONTEXT_CHARS:]) if len(context) > CONTEXT_CHARS else context,
                texts_equal=b_text == c_text,
                baseline_logprob=_at(base.get("token_logprobs"), at),
                canary_logprob=_at(canary.get("token_logprobs"), at),
            )
            if canary.get("finish_reason") and len(c_ids) < len(b_ids) and at == len(c_ids):
                entry["canary_stopped"] = canary.get("finish_reason")
        divergences.append(entry)
        if not ok:
            failing.append(index)
    if len(canary_outputs) != len(baseline_outputs):
        # The caller checks this; a shorter list never passes.
        failing.append(min(len(canary_outputs), len(baseline_outputs)))
    passed = not failing
    return {
        "passed": passed,
        "verdict": _verdict(divergences, failing, prompts, max_tokens, k, len(baseline_outputs)),
        "failing": failing,
        "divergences": divergences,
    }


def _at(values, index):
    try:
        return values[index]
    except (TypeError, IndexError, KeyError):
        return None


def describe(entry, prompt, max_tokens):
    """One prompt's divergence in words."""
    text = "prompt %d%s diverges at token %d of %d" % (
        entry["index"],
        " (%s)" % _short_prompt(prompt) if prompt is not None else "",
        entry["diverges_at"],
        max_tokens,
    )
    if entry.get("canary_stopped"):
        return text + " (the canary stopped after %d tokens, finish_reason %s)" % (
            entry["canary_tokens"],
            entry["canary_stopped"],
        )
    if entry["texts_equal"]:
        return text + " (the texts are equal: the token ids differ, the same text tokenized differently)"
    if entry["context"]:
        text += ", after %r" % entry["context"]
    return text + " (baseline %r, canary %r)" % (entry["baseline_excerpt"], entry["canary_excerpt"])


def _verdict(divergences, failing, prompts, max_tokens, k, count):
    diverged = [d for d in divergences if d["diverges_at"] is not None]
    if failing:
        first = failing[0]
        if first >= len(divergences):
            return "outputs differ: the canary returned %d outputs for %d prompts" % (len(divergences), count)
        message = "outputs differ: " + describe(divergences[first], prompts[first], max_tokens)
        if k:
            message += "; the tolerance needs %d agreeing tokens" % k
        rest = [divergences[i] for i in failing[1:] if i < len(divergences)]
        if rest:
            message += "; %d more prompt%s fail%s: %s" % (
                len(rest),
                "s" if len(rest) > 1 else "",
                "" if len(rest) > 1 else "s",
                ", ".join("%d (token %d)" % (d["index"], d["diverges_at"]) for d in rest),
            )
        return message
    if not diverged:
        return "outputs equal: %d prompts, %d tokens each, token for token" % (count, max_tokens)
    earliest = min(diverged, key=lambda d: d["diverges_at"])
    return (
        "outputs agree within the tolerance: %d of %d prompts diverge, the earliest at token %d of %d "
        "(prompt %d; needs >= %d); the other %d equal token for token"
        % (len(diverged), count, earliest["diverges_at"], max_tokens, earliest["index"], k, count - len(diverged))
    )


def digest(outputs):
    ids = [list(o.get("token_ids") or []) for o in outputs]
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------- the server
def completion_body(model, prompt, max_tokens):
    """The request: greedy, fixed length, token ids in the answer."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "repetition_penalty": 1.0,
        "ignore_eos": True,
        "n": 1,
        "stream": False,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }


def parse_answer(doc, where):
    """{token_ids, text, token_logprobs, finish_reason} from a completion; Failed otherwise."""
    try:
        choice = doc["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise Failed(
            "%s answered without choices: %s. Fix: url must be vLLM's OpenAI-compatible server"
            % (where, json.dumps(doc)[:200])
        ) from None
    logprobs = choice.get("logprobs")
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list):
        raise Failed(
            "%s answered without token-level output (choices[0].logprobs is %s): the server ignores the "
            "logprobs parameter. Fix: the server must be vLLM's OpenAI-compatible server (logprobs and "
            "return_tokens_as_token_ids, vLLM 0.5 or later)" % (where, json.dumps(logprobs)[:100])
        )
    ids = []
    for token in tokens:
        m = TOKEN_ID.match(str(token))
        if not m:
            raise Failed(
                "%s answered tokens as text (%r), not as token_id:<id>: the server ignores "
                "return_tokens_as_token_ids. Fix: a vLLM that supports it (0.5 or later)" % (where, token)
            )
        ids.append(int(m.group(1)))
    usage = doc.get("usage") or {}
    reported = usage.get("completion_tokens")
    if isinstance(reported, int) and reported != len(ids):
        raise Failed(
            "%s reported %d completion tokens but returned %d token ids. Fix: look at the server (an "
            "incomplete answer)" % (where, reported, len(ids))
        )
    token_logprobs = logprobs.get("token_logprobs")
    return {
        "token_ids": ids,
        "text": str(choice.get("text") or ""),
        "token_logprobs": list(token_logprobs) if isinstance(token_logprobs, list) else [],
        "finish_reason": choice.get("finish_reason"),
    }


def generate(params, prompts, max_tokens, post=None):
    """The outputs for every prompt, one request each, in order; raises Failed. params: url,
    model, api_key, timeout, validate_certs, use_proxy and, optionally, ca_path (a CA file
    for an https url)."""
    base = params["url"].rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    where = "POST %s/v1/completions" % base
    post = post or _post
    outputs = []
    for index, prompt in enumerate(prompts):
        body = completion_body(params["model"], prompt, max_tokens)
        doc = post(base + "/v1/completions", body, params, where, index)
        outputs.append(parse_answer(doc, "%s (prompt %d)" % (where, index)))
    return outputs


def _post(url, body, params, where, index):
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if params.get("api_key"):
        headers["Authorization"] = "Bearer %s" % params["api_key"]
    try:
        resp = open_url(
            url,
            data=json.dumps(body).encode("utf-8"),
            headers=headers,
            method="POST",
            timeout=params["timeout"],
            validate_certs=params["validate_certs"],
            use_proxy=params["use_proxy"],
            ca_path=params.get("ca_path"),
            use_netrc=False,
        )
        try:
            raw = resp.read()
        finally:
            resp.close()
    except HTTPError as exc:
        raise Failed(_http_error(exc, where, index, params)) from None
    except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, no route: no answer
        reason = getattr(exc, "reason", None) or exc
        raise Failed(
            "%s (prompt %d) got no answer: %s. Fix: start the server, or wait until it is ready (the "
            "serving_ready module), and check url; a completion slower than %s s needs a larger timeout"
            % (where, index, reason, params["timeout"])
        ) from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise Failed(
            "%s (prompt %d) answered something that is not JSON: %r. Fix: url must be vLLM's OpenAI-compatible "
            "server" % (where, index, raw[:200])
        ) from None


def _http_error(exc, where, index, params):
    try:
        body = exc.read().decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - the body may be gone with the connection
        body = ""
    message = body.strip()[:300]
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"]).split("\n\n", 1)[0][:300]
        elif isinstance(err, str) and err:
            message = err  # vLLM's 401: {"error": "Unauthorized"}
    except (ValueError, AttributeError):
        pass
    message = message.rstrip(". ")
    if exc.code in (401, 403):
        fix = "pass the key the server was started with (the vault's vault_kunlun_api_key) as api_key"
    elif exc.code == 404:
        fix = "set model to the server's --served-model-name (GET /v1/models lists it)"
    elif exc.code == 400:
        fix = "the server refused the request; a prompt plus max_tokens over its --max-model-len needs fewer tokens"
    else:
        fix = "read the server's log (an engine error)"
    return "%s (prompt %d) answered HTTP %d: %s. Fix: %s" % (where, index, exc.code, message or exc.reason, fix)


def check_record(outputs, max_tokens):
    """Raises Failed when an output of a record is shorter than max_tokens (a golden output
    has a fixed length)."""
    for index, out in enumerate(outputs):
        if len(out["token_ids"]) != max_tokens:
            raise Failed(
                "prompt %d came back with %d tokens of %d (finish_reason %s): the server did not honour "
                "ignore_eos. Fix: a vLLM server (ignore_eos is its sampling parameter), or fewer max_tokens "
                "than its --max-model-len allows" % (index, len(out["token_ids"]), max_tokens, out["finish_reason"])
            )
