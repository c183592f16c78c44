"""library/golden_outputs.py: the comparison (pure functions), the parsing of vLLM 0.15.1's
token-level answer (as the real engine gave it), and the module against two stand-in vllm
servers on 127.0.0.1 (kunlun_fleet/sim/artifacts/vllm_src, started as tests/bench does):
a record repeats itself, another server with the same "weights" compares equal, a record
with a token changed gives the right divergence and message, a tolerance lets a late
divergence pass, and the failures name the fix. The stand-in's token ids decode to its
text with the model's own tokenizer.json."""

import copy
import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

import golden_outputs as go
from module_docs import documented_spec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))

import benchkit  # noqa: E402
from standin_helpers import free_port  # noqa: E402

from kunlun_fleet.sim.artifacts import model as sim_model  # noqa: E402

# vLLM 0.15.1's answer (the CPU build, the real-engine lane's tiny random Qwen3 with the sim
# model's tokenizer) to {"prompt": "hello world", "max_tokens": 6, "temperature": 0,
# "ignore_eos": true, "logprobs": 0, "return_tokens_as_token_ids": true}, as it came.
REAL_ANSWER = {
    "id": "cmpl-a40782536aeefd08",
    "object": "text_completion",
    "created": 1796403130,
    "model": "Qwen3.8-27B-INT8-W8A8-Dynamic",
    "choices": [
        {
            "index": 0,
            "text": "deterministic\ufffdWh\ufffdortservice",
            "logprobs": {
                "text_offset": [0, 12, 24, 36, 48, 60],
                "token_logprobs": [
                    -6.31073522567749,
                    -6.257823467254639,
                    -6.327432632446289,
                    -6.266520977020264,
                    -6.341560363769531,
                    -6.234841346740723,
                ],
                "tokens": [
                    "token_id:687",
                    "token_id:134",
                    "token_id:274",
                    "token_id:171",
                    "token_id:448",
                    "token_id:561",
                ],
                "top_logprobs": [
                    {"token_id:687": -6.31073522567749},
                    {"token_id:134": -6.257823467254639},
                    {"token_id:274": -6.327432632446289},
                    {"token_id:171": -6.266520977020264},
                    {"token_id:448": -6.341560363769531},
                    {"token_id:561": -6.234841346740723},
                ],
            },
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
        }
    ],
    "service_tier": None,
    "system_fingerprint": None,
    "usage": {"prompt_tokens": 5, "total_tokens": 11, "completion_tokens": 6, "prompt_tokens_details": None},
    "kv_transfer_params": None,
}


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


def run(args, check_mode=False):
    """main() with the given arguments: (failed, result)."""
    module_args = dict(args)
    if check_mode:
        module_args["_ansible_check_mode"] = True

    def exit_json(self, **kwargs):
        raise ExitJson(kwargs)

    def fail_json(self, **kwargs):
        kwargs["failed"] = True
        raise FailJson(kwargs)

    with (
        patch_module_args(module_args),
        mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json),
    ):
        with pytest.raises((ExitJson, FailJson)) as exc:
            go.main()
    return exc.type is FailJson, exc.value.args[0]


def output(ids, text="", logprobs=None):
    return {"token_ids": list(ids), "text": text, "token_logprobs": logprobs or [], "finish_reason": "length"}


# --------------------------------------------------------------------------- pure functions


def test_documentation_matches_the_argument_spec(monkeypatch):
    doc, spec = documented_spec(monkeypatch, go)
    assert spec["mode"]["choices"] == doc["options"]["mode"]["choices"] == ["record", "compare"]
    assert spec["api_key"]["no_log"] is True
    assert doc["options"]["tolerance"]["suboptions"]["min_agreeing_tokens"]["default"] == 0
    assert spec["tolerance"]["options"]["min_agreeing_tokens"]["default"] == 0
    assert len(go.DEFAULT_PROMPTS) == 8 and go.DEFAULT_MAX_TOKENS == 32


@pytest.mark.parametrize(
    "a,b,at",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [9, 2, 3], 0),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3], 2),
        ([], [], None),
    ],
)
def test_first_divergence(a, b, at):
    assert go.first_divergence(a, b) == at


def test_equal_outputs_pass():
    outs = [output([1, 2, 3, 4], "a b c d"), output([5, 6, 7, 8], "e f g h")]
    verdict = go.compare(outs, copy.deepcopy(outs), 4, prompts=["p0", "p1"])
    assert verdict["passed"] is True and verdict["failing"] == []
    assert verdict["verdict"] == "outputs equal: 2 prompts, 4 tokens each, token for token"
    assert [d["diverges_at"] for d in verdict["divergences"]] == [None, None]


def test_a_changed_token_names_the_prompt_the_index_and_both_continuations():
    base = [output(range(10), "the model answers with tokens from a fixed list"), output([7] * 10, "x" * 10)]
    canary = copy.deepcopy(base)
    canary[0] = output([0, 1, 2, 3, 4, 99, 98, 97, 96, 95], "the model answers with tokens queue latency rate")
    verdict = go.compare(base, canary, 10, prompts=["Write one short sentence about the sea.", "p1"])
    assert verdict["passed"] is False and verdict["failing"] == [0]
    first = verdict["divergences"][0]
    assert first["diverges_at"] == 5 and first["baseline_tokens"] == first["canary_tokens"] == 10
    assert first["baseline_excerpt"] == "from a fixed list"
    assert first["canary_excerpt"] == "queue latency rate"
    assert verdict["verdict"] == (
        "outputs differ: prompt 0 ('Write one short sentence about the sea.') diverges at token 5 of 10, "
        "after 'the model answers with tokens ' (baseline 'from a fixed list', canary 'queue latency rate')"
    )
    assert verdict["divergences"][1]["diverges_at"] is None


def test_more_failing_prompts_are_counted_and_long_texts_cut():
    base = [output([1, 2, 3], "a" * 100), output([1, 2, 3], "b"), output([1, 2, 3], "c")]
    canary = [output([1, 2, 4], "a" * 60 + "z" * 60), output([1, 2, 3], "b"), output([9, 2, 3], "d")]
    verdict = go.compare(base, canary, 3, prompts=["a long prompt " * 10, "p1", "p2"])
    assert verdict["failing"] == [0, 2]
    assert verdict["verdict"] == (
        "outputs differ: prompt 0 ('a long prompt a long prompt a long promp...') diverges at token 2 of 3, "
        "after '...%s' (baseline '%s', canary '%s...'); 1 more prompt fails: 2 (token 0)"
        % ("a" * 32, "a" * 40, "z" * 40)
    )


def test_a_tolerance_lets_a_late_divergence_pass_and_an_early_one_fail():
    base = [output(range(32), "x"), output(range(32), "y")]
    canary = copy.deepcopy(base)
    canary[1]["token_ids"][20] = 999
    canary[1]["text"] = "y2"
    assert go.compare(base, canary, 32)["passed"] is False
    within = go.compare(base, canary, 32, min_agreeing_tokens=16)
    assert within["passed"] is True and within["failing"] == []
    assert within["verdict"] == (
        "outputs agree within the tolerance: 1 of 2 prompts diverge, the earliest at token 20 of 32 "
        "(prompt 1; needs >= 16); the other 1 equal token for token"
    )
    beyond = go.compare(base, canary, 32, min_agreeing_tokens=21, prompts=["p0", "p1"])
    assert beyond["passed"] is False and beyond["failing"] == [1]
    assert beyond["verdict"].startswith("outputs differ: prompt 1 ('p1') diverges at token 20 of 32")
    assert beyond["verdict"].endswith("; the tolerance needs 21 agreeing tokens")
    # Exactly K agreeing tokens is enough.
    assert go.compare(base, canary, 32, min_agreeing_tokens=20)["passed"] is True


def test_a_canary_that_stops_early_and_equal_texts_with_other_ids():
    base = [output([1, 2, 3, 4], "a b c d")]
    short = [dict(output([1, 2], "a b"), finish_reason="stop")]
    verdict = go.compare(base, short, 4, prompts=["p"])
    assert verdict["verdict"] == (
        "outputs differ: prompt 0 ('p') diverges at token 2 of 4 (the canary stopped after 2 tokens, "
        "finish_reason stop)"
    )
    retokenized = [output([1, 2, 30, 4], "a b c d")]
    assert go.compare(base, retokenized, 4, prompts=["p"])["verdict"] == (
        "outputs differ: prompt 0 ('p') diverges at token 2 of 4 (the texts are equal: the token ids differ, "
        "the same text tokenized differently)"
    )


def test_the_logprobs_at_the_divergence_are_kept():
    base = [output([1, 2, 3], "a b c", [-0.1, -0.69, -0.2])]
    canary = [output([1, 5, 3], "a e c", [-0.1, -0.70, -0.2])]
    entry = go.compare(base, canary, 3)["divergences"][0]
    assert entry["baseline_logprob"] == -0.69 and entry["canary_logprob"] == -0.70


def test_the_real_engines_answer_parses():
    got = go.parse_answer(REAL_ANSWER, "POST x")
    assert got["token_ids"] == [687, 134, 274, 171, 448, 561]
    assert got["text"] == "deterministic\ufffdWh\ufffdortservice"
    assert got["token_logprobs"][0] == -6.31073522567749 and got["finish_reason"] == "length"


def test_the_request_asks_for_greedy_fixed_length_token_ids():
    assert go.completion_body("m", "p", 32) == {
        "model": "m",
        "prompt": "p",
        "max_tokens": 32,
        "temperature": 0,
        "repetition_penalty": 1.0,
        "ignore_eos": True,
        "n": 1,
        "stream": False,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }


def test_answers_without_token_ids_fail_with_the_reason():
    no_logprobs = copy.deepcopy(REAL_ANSWER)
    no_logprobs["choices"][0]["logprobs"] = None
    with pytest.raises(go.Failed, match=r"without token-level output \(choices\[0\]\.logprobs is null\)"):
        go.parse_answer(no_logprobs, "POST x")
    as_text = copy.deepcopy(REAL_ANSWER)
    as_text["choices"][0]["logprobs"]["tokens"][2] = "Wh"
    with pytest.raises(go.Failed, match="answered tokens as text \\('Wh'\\).*ignores return_tokens_as_token_ids"):
        go.parse_answer(as_text, "POST x")
    short = copy.deepcopy(REAL_ANSWER)
    short["usage"]["completion_tokens"] = 7
    with pytest.raises(go.Failed, match="reported 7 completion tokens but returned 6 token ids"):
        go.parse_answer(short, "POST x")
    with pytest.raises(go.Failed, match="answered without choices"):
        go.parse_answer({"object": "error"}, "POST x")


# --------------------------------------------------------------------------- against stand-ins


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """Two stand-in servers with the product's flags and the same model (the same "weights")."""
    tmp = tmp_path_factory.mktemp("golden")
    servers = benchkit.start_servers(tmp, 2)
    for srv in servers:
        srv.model_dir = benchkit.model_dir(tmp / "models")
    yield servers
    for srv in servers:
        srv.stop()


def args(srv, **over):
    a = {"url": srv.base, "api_key": benchkit.API_KEY, "model": benchkit.SERVED, "timeout": 30}
    a.update(over)
    return a


@pytest.fixture(scope="module")
def record(standins):
    failed, result = run(args(standins[0]))
    assert not failed, result
    return result


def test_a_record_has_every_default_prompt_at_full_length(record):
    assert record["prompts"] == go.DEFAULT_PROMPTS and record["max_tokens"] == 32
    assert len(record["outputs"]) == 8 and record["changed"] is False
    for out in record["outputs"]:
        assert len(out["token_ids"]) == 32 and out["finish_reason"] == "length"
        assert len(out["token_logprobs"]) == 32 and all(-4.0 <= lp < 0 for lp in out["token_logprobs"])
    assert record["digest"] == go.digest(record["outputs"])


def test_recording_twice_from_the_same_server_is_identical(standins, record):
    failed, again = run(args(standins[0]), check_mode=True)
    assert not failed, again
    assert again["outputs"] == record["outputs"] and again["digest"] == record["digest"]


def test_the_standins_token_ids_decode_to_its_text(standins, record):
    """With the model directory's tokenizer.json (byte-level BPE): the ids are the text's."""
    vocab = json.loads((standins[0].model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    by_id = {i: tok for tok, i in vocab.items()}
    to_byte = {ch: b for b, ch in sim_model._bpe.BYTE_CHARS.items()}
    for out in record["outputs"]:
        raw = bytes(to_byte[ch] for i in out["token_ids"] for ch in by_id[i])
        assert raw.decode("utf-8") == out["text"]


def test_another_server_with_the_same_weights_compares_equal(standins, record):
    failed, result = run(args(standins[1], mode="compare", baseline=record))
    assert not failed, result
    assert result["passed"] is True and result["failing"] == []
    assert result["verdict"] == "outputs equal: 8 prompts, 32 tokens each, token for token"
    assert result["digest"] == result["baseline_digest"] == record["digest"]
    assert result["tolerance"] == {"min_agreeing_tokens": 0}


def altered(record, prompt, token):
    """The record with prompt `prompt`'s output changed from token `token` on (ids and text)."""
    changed = copy.deepcopy(record)
    out = changed["outputs"][prompt]
    words = out["text"].split(" ")
    out["token_ids"][token:] = [i + 1 for i in out["token_ids"][token:]]
    out["text"] = " ".join(words[:token] + ["zebra"] * (len(words) - token))
    return changed


def test_a_record_with_a_changed_token_fails_at_that_token(standins, record):
    baseline = altered(record, 3, 5)
    failed, result = run(args(standins[1], mode="compare", baseline=baseline))
    assert not failed, result
    assert result["passed"] is False and result["failing"] == [3]
    entry = result["divergences"][3]
    assert entry["diverges_at"] == 5 and entry["baseline_excerpt"].startswith("zebra zebra")
    canary_text = result["outputs"][3]["text"]
    context = " ".join(canary_text.split(" ")[:5]) + " "
    shown = context if len(context) <= 32 else "..." + context[-32:]
    assert result["verdict"] == (
        "outputs differ: prompt 3 ('def fibonacci(n):') diverges at token 5 of 32, after %r (baseline %r, canary %r)"
        % (shown, entry["baseline_excerpt"], entry["canary_excerpt"])
    )
    assert canary_text[len(context) :].startswith(entry["canary_excerpt"].rstrip("."))


def test_a_tolerance_passes_a_divergence_after_k_tokens(standins, record):
    baseline = altered(record, 6, 20)
    failed, result = run(args(standins[1], mode="compare", baseline=baseline, tolerance={"min_agreeing_tokens": 16}))
    assert not failed and result["passed"] is True, result
    assert result["verdict"].startswith("outputs agree within the tolerance: 1 of 8 prompts diverge, the earliest at")
    failed, result = run(args(standins[1], mode="compare", baseline=baseline, tolerance={"min_agreeing_tokens": 24}))
    assert not failed and result["passed"] is False and result["failing"] == [6]


def test_custom_prompts_and_length(standins):
    failed, result = run(args(standins[0], prompts=["hello world", "tell me a story"], max_tokens=5))
    assert not failed, result
    assert [len(o["token_ids"]) for o in result["outputs"]] == [5, 5]
    failed, again = run(args(standins[1], mode="compare", baseline=result))
    assert not failed and again["passed"] is True and again["prompts"] == ["hello world", "tell me a story"]


@pytest.mark.parametrize(
    "over,words",
    [
        ({"api_key": "wrong-key"}, "answered HTTP 401: Unauthorized. Fix: pass the key the server was started with"),
        (
            {"model": "no-such-model"},
            "answered HTTP 404: The model `no-such-model` does not exist. Fix: set model to the server's "
            "--served-model-name",
        ),
        ({"max_tokens": 0}, "max_tokens is 0; it must be 1 or more"),
        ({"prompts": []}, "prompts is empty or holds an empty prompt"),
        ({"url": "127.0.0.1:8000"}, "url '127.0.0.1:8000' is not an http:// or https:// URL"),
        ({"baseline": {"outputs": []}}, "baseline is given but mode is record"),
        ({"mode": "compare"}, "mode compare needs baseline"),
        ({"mode": "compare", "baseline": {"x": 1}}, "baseline has no prompts or outputs or max_tokens"),
        ({"tolerance": {"min_agreeing_tokens": 33}}, "tolerance.min_agreeing_tokens is 33; it must be between 0"),
    ],
)
def test_refusals_name_the_fix(standins, over, words):
    failed, result = run(args(standins[0], **over))
    assert failed, result
    assert words in result["msg"], result["msg"]
    assert "wrong-key" not in json.dumps(result)


def test_a_compare_takes_the_baselines_prompts_and_length(standins, record):
    failed, result = run(args(standins[1], mode="compare", baseline=record, prompts=["other"]))
    assert failed and "prompts differ from the baseline's (1 given, 8 recorded)" in result["msg"]
    failed, result = run(args(standins[1], mode="compare", baseline=record, max_tokens=16))
    assert failed and "max_tokens 16 differs from the baseline's 32" in result["msg"]
    failed, result = run(args(standins[1], mode="compare", baseline=dict(record, failed=True, msg="boom")))
    assert failed and "the baseline record failed (boom)" in result["msg"]


def test_a_server_that_does_not_answer(tmp_path):
    failed, result = run(
        {"url": "http://127.0.0.1:%d" % free_port(), "model": benchkit.SERVED, "timeout": 5, "max_tokens": 2}
    )
    assert failed and "POST http://127.0.0.1:" in result["msg"]
    assert "/v1/completions (prompt 0) got no answer" in result["msg"] and "Fix: start the server" in result["msg"]


def test_a_server_without_token_ids_is_refused(tmp_path):
    """A stand-in from before this change answered logprobs null; so would any server that
    ignores the parameter. Simulated here by answering the parsing with such a document."""

    def post(url, body, params, where, index):
        doc = copy.deepcopy(REAL_ANSWER)
        doc["choices"][0]["logprobs"] = None
        return doc

    params = {"url": "http://127.0.0.1:1", "model": "m"}
    with pytest.raises(go.Failed, match="the server ignores the logprobs parameter"):
        go.generate(params, ["p"], 6, post=post)


def test_the_standin_answers_logprobs_as_vllm_does(standins):
    """The stand-in's token-level answer in the real engine's shape (REAL_ANSWER): tokens as
    token_id:N, one top log-probability per token for logprobs 0, text_offset the running
    length of the token strings; streamed, the running length of the text."""
    import urllib.request

    body = go.completion_body(benchkit.SERVED, "hello world", 6)
    req = urllib.request.Request(
        standins[0].base + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + benchkit.API_KEY, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc = json.loads(resp.read())
    lp = doc["choices"][0]["logprobs"]
    assert sorted(lp) == sorted(REAL_ANSWER["choices"][0]["logprobs"])
    assert sorted(doc["choices"][0]) == sorted(REAL_ANSWER["choices"][0])
    assert all(t.startswith("token_id:") for t in lp["tokens"]) and len(lp["tokens"]) == 6
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"], strict=True)]
    expected, at = [], 0
    for t in lp["tokens"]:
        expected.append(at)
        at += len(t)
    assert lp["text_offset"] == expected
