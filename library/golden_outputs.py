#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: golden_outputs
short_description: Record a server's greedy outputs for a fixed prompt set, or compare another server's with them
description:
  - The golden-output check of a stack upgrade (docs/upgrades.md) - record the outputs of the host that stays on
    the current stack (the baseline), then compare the outputs of the host on the new stack (the canary) with
    that record, token id for token id.
  - For every prompt, one at a time (a batch of one, so batching cannot change the numerics), one
    C(POST {url}/v1/completions) with greedy decoding and a fixed length - C(temperature 0),
    C(repetition_penalty 1), C(max_tokens) I(max_tokens), C(ignore_eos true) - and the token-level output of
    vLLM's OpenAI-compatible server - C(logprobs 0) with C(return_tokens_as_token_ids true), which makes
    C(choices[0].logprobs.tokens) the generated tokens as C(token_id:<id>) strings (vLLM 0.15.1,
    C(entrypoints/openai/completion/serving.py), C(OpenAIServingCompletion._create_completion_logprobs)).
    Token ids are compared, never text (a text can re-tokenize differently).
  - I(mode=record) returns the outputs (register it; it is the I(baseline) of a compare). A prompt that comes
    back shorter than I(max_tokens) fails the record (a golden output has a fixed length).
  - I(mode=compare) generates the same prompts with the same I(max_tokens) (both taken from the I(baseline))
    and returns the verdict - per prompt, the index of the first token that differs; C(passed) when every
    prompt is identical or, with I(tolerance), when every first divergence is at index
    I(tolerance.min_agreeing_tokens) or later. Prompts and tokens are counted from 0 (a divergence at token 5 -
    tokens 0 to 4 agree). A failed verdict is a result, not a module failure - the
    canary gate (module_utils/canary.py) reads C(passed) and C(verdict); a play that should stop uses
    C(failed_when).
  - Fails, naming the URL and the fix, when the server refuses the key or the model, does not answer, or
    answers without token ids (a server that ignores C(logprobs) or C(return_tokens_as_token_ids)).
  - Changes nothing on the server. Check mode runs as a normal run - the completions only read.
  - Standard library and ansible-core's C(open_url) only; Python 3.8+.
options:
  url:
    description: Base URL of the serving host, without C(/v1) (for example C(http://10.20.1.11:8000)).
    type: str
    required: true
  api_key:
    description: The server's API key (its C(--api-key) or C(VLLM_API_KEY)). Omit for a server without one.
    type: str
  model:
    description: The served model name (the server's C(--served-model-name)).
    type: str
    required: true
  prompts:
    description:
      - The prompts (I(mode=record)). Omitted - the module's built-in set of 8 short prompts of different
        kinds (facts, arithmetic, code, translation, a story, Chinese), returned in C(prompts).
      - In I(mode=compare) the baseline's prompts are used; a different list given here fails.
    type: list
    elements: str
  max_tokens:
    description:
      - Tokens generated per prompt (I(mode=record)). Omitted - 32.
      - In I(mode=compare) the baseline's value is used; a different value given here fails.
    type: int
  mode:
    description: C(record) returns the outputs; C(compare) compares them with I(baseline).
    type: str
    choices: [record, compare]
    default: record
  baseline:
    description: The registered result of a I(mode=record) run on the baseline host. Required with I(mode=compare).
    type: dict
  tolerance:
    description:
      - For stacks known to change numerics - how much of each output must agree. Omitted - exact (every token).
    type: dict
    suboptions:
      min_agreeing_tokens:
        description:
          - The first divergence of every prompt must be at this token index or later (that many leading tokens
            equal). 0 - exact.
        type: int
        default: 0
  timeout:
    description: Seconds one completion may take.
    type: float
    default: 120
  validate_certs:
    description: Verify the server certificate of an C(https) URL.
    type: bool
    default: true
  ca_file:
    description:
      - A CA certificate file (PEM) that alone verifies an C(https) server (the fleet CA's, on the controller). Omitted
        or empty - the system's trust store.
    type: path
  use_proxy:
    description: Honour C(http_proxy)/C(https_proxy) of the environment.
    type: bool
    default: false
notes:
  - Check mode - runs as normal (it only reads).
  - The server must be otherwise idle for the figures of a canary, not for this check - a request waits its
    turn, and each prompt runs alone.
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Record the golden outputs on the baseline host
  golden_outputs:
    url: "https://{{ baseline_host }}:8000"
    ca_file: "{{ kunlun_stack_worker_ca_controller }}"
    api_key: "{{ vault_kunlun_api_key }}"
    model: Qwen3.8-27B-INT8-W8A8-Dynamic
  register: golden_baseline

- name: Compare the canary's with them (the first 16 tokens of every prompt must agree)
  golden_outputs:
    url: "https://{{ canary_host }}:8000"
    ca_file: "{{ kunlun_stack_worker_ca_controller }}"
    api_key: "{{ vault_kunlun_api_key }}"
    model: Qwen3.8-27B-INT8-W8A8-Dynamic
    mode: compare
    baseline: "{{ golden_baseline }}"
    tolerance:
      min_agreeing_tokens: 16
  register: golden_canary
  failed_when: not golden_canary.passed
"""

RETURN = r"""
url:
  description: The server asked.
  returned: always
  type: str
model:
  description: The model name asked for.
  returned: always
  type: str
prompts:
  description: The prompts, in order.
  returned: always
  type: list
  elements: str
max_tokens:
  description: Tokens generated per prompt.
  returned: always
  type: int
outputs:
  description: The server's output per prompt, in the order of C(prompts) (in I(mode=compare), the canary's).
  returned: always
  type: list
  elements: dict
  contains:
    token_ids:
      description: The generated token ids.
      type: list
      elements: int
    text:
      description: The generated text.
      type: str
    token_logprobs:
      description: The log-probability of each generated token.
      type: list
      elements: float
    finish_reason:
      description: C(length) for a full-length output.
      type: str
digest:
  description: SHA-256 of the token ids of all outputs (equal digests - equal outputs).
  returned: always
  type: str
passed:
  description: The verdict (I(mode=compare)).
  returned: compare
  type: bool
verdict:
  description: One line - equal, within the tolerance, or the first failing prompt with its divergence and both
    continuations.
  returned: compare
  type: str
  sample: "outputs differ: prompt 3 ('def fibonacci(n):') diverges at token 5 of 32, after '    if n' (baseline
    ' <= 1:', canary ' < 2:')"
failing:
  description: The indexes of the prompts that fail (diverge before the tolerance allows).
  returned: compare
  type: list
  elements: int
divergences:
  description: Per prompt - C(index), C(diverges_at) (the first differing token index; null when identical),
    C(passed), C(baseline_tokens) and C(canary_tokens) (lengths), C(context) (the end of the text both share),
    C(baseline_excerpt) and C(canary_excerpt) (the texts from where they differ), C(texts_equal),
    C(baseline_logprob) and C(canary_logprob) (the two tokens' log-probabilities there) and, when the canary
    stopped early, C(canary_stopped) (its finish_reason).
  returned: compare
  type: list
  elements: dict
tolerance:
  description: The tolerance applied, C(min_agreeing_tokens) (0 - exact).
  returned: compare
  type: dict
baseline_digest:
  description: The baseline's C(digest).
  returned: compare
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.golden import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPTS,
    Failed,
    check_record,
    compare,
    completion_body,
    digest,
    first_divergence,
    generate,
    parse_answer,
)

# The check itself is module_utils/golden.py (canary_measure runs it too); its names stay
# importable from this module.
__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PROMPTS",
    "Failed",
    "check_baseline",
    "check_record",
    "compare",
    "completion_body",
    "digest",
    "first_divergence",
    "generate",
    "main",
    "parse_answer",
    "run",
]


# ----------------------------------------------------------------------------- the module
def check_baseline(baseline):
    """(prompts, max_tokens, outputs) of a record; Failed when it is not one."""
    fix = "Fix: pass the registered result of a golden_outputs task with mode record (baseline: '{{ result }}')"
    if not isinstance(baseline, dict):
        raise Failed("baseline is not a golden_outputs record. " + fix)
    if baseline.get("failed"):
        raise Failed("the baseline record failed (%s). %s" % (str(baseline.get("msg"))[:200], fix))
    kinds = (("prompts", list), ("outputs", list), ("max_tokens", int))
    missing = [key for key, kind in kinds if not isinstance(baseline.get(key), kind)]
    if missing:
        raise Failed("baseline has no %s: it is not a golden_outputs record. %s" % (" or ".join(missing), fix))
    prompts, outputs, max_tokens = baseline["prompts"], baseline["outputs"], baseline["max_tokens"]
    if len(prompts) != len(outputs) or not prompts:
        raise Failed("baseline has %d prompts and %d outputs. %s" % (len(prompts), len(outputs), fix))
    for index, out in enumerate(outputs):
        ids = out.get("token_ids") if isinstance(out, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise Failed("baseline output %d has no list of token ids. %s" % (index, fix))
    return [str(p) for p in prompts], max_tokens, outputs


def run(module, post=None):
    """The module's work; returns the result or raises Failed."""
    p = module.params
    mode = p["mode"]
    result = dict(changed=False, url=p["url"], model=p["model"])
    if mode == "compare":
        if p["baseline"] is None:
            raise Failed("mode compare needs baseline. Fix: pass the registered result of a mode record run")
        prompts, max_tokens, base_outputs = check_baseline(p["baseline"])
        if p["prompts"] is not None and list(p["prompts"]) != prompts:
            raise Failed(
                "prompts differ from the baseline's (%d given, %d recorded): a compare generates the baseline's "
                "prompts. Fix: leave prompts out in mode compare" % (len(p["prompts"]), len(prompts))
            )
        if p["max_tokens"] is not None and p["max_tokens"] != max_tokens:
            raise Failed(
                "max_tokens %d differs from the baseline's %d: a compare generates as many tokens as the record. "
                "Fix: leave max_tokens out in mode compare" % (p["max_tokens"], max_tokens)
            )
    else:
        if p["baseline"] is not None:
            raise Failed("baseline is given but mode is record. Fix: mode compare to compare with it")
        prompts = list(p["prompts"]) if p["prompts"] is not None else list(DEFAULT_PROMPTS)
        max_tokens = p["max_tokens"] if p["max_tokens"] is not None else DEFAULT_MAX_TOKENS
    k = int((p["tolerance"] or {}).get("min_agreeing_tokens") or 0)
    if k < 0 or k > max_tokens:
        raise Failed(
            "tolerance.min_agreeing_tokens is %d; it must be between 0 (exact) and max_tokens (%d)" % (k, max_tokens)
        )

    outputs = generate(dict(p, ca_path=p.get("ca_file") or None), prompts, max_tokens, post)
    result.update(prompts=prompts, max_tokens=max_tokens, outputs=outputs, digest=digest(outputs))
    if mode == "record":
        check_record(outputs, max_tokens)
        return result
    verdict = compare(base_outputs, outputs, max_tokens, k, prompts)
    result.update(verdict)
    result.update(tolerance={"min_agreeing_tokens": k}, baseline_digest=digest(base_outputs))
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            prompts=dict(type="list", elements="str"),
            max_tokens=dict(type="int", no_log=False),  # a count, not a secret
            mode=dict(type="str", choices=["record", "compare"], default="record"),
            baseline=dict(type="dict"),
            tolerance=dict(
                type="dict",
                # a count of tokens, not a secret
                options=dict(min_agreeing_tokens=dict(type="int", default=0, no_log=False)),
            ),
            timeout=dict(type="float", default=120.0),
            validate_certs=dict(type="bool", default=True),
            ca_file=dict(type="path"),
            use_proxy=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p["url"].startswith(("http://", "https://")):
        module.fail_json(
            msg="url %r is not an http:// or https:// URL. Fix: give the serving host's base URL, for example "
            "http://10.20.1.11:8000" % p["url"]
        )
    if p["max_tokens"] is not None and p["max_tokens"] < 1:
        module.fail_json(msg="max_tokens is %d; it must be 1 or more. Fix: leave it out (32)" % p["max_tokens"])
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout is %s; it must be positive. Fix: leave the default (120)" % p["timeout"])
    if p["prompts"] is not None and (not p["prompts"] or not all(str(x).strip() for x in p["prompts"])):
        module.fail_json(msg="prompts is empty or holds an empty prompt. Fix: leave it out for the built-in set")
    try:
        result = run(module)
    except Failed as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
