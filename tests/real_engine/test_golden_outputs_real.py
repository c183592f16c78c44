"""The golden-output check (library/golden_outputs.py) against real vLLM 0.15.1 servers, run
as Ansible runs it (ansible-playbook on localhost, the project's library): recorded from the
lane's real server, compared with the same server (the same weights: PASS) and with a second
real server whose tiny model has other weights (make_tiny_model.py's model with another
seed: FAIL, naming the divergence). The registered record goes through Ansible's templating
as the baseline, as an upgrade play passes it.

One extra real server (about 20 s of start on two cores, its model made in about 10 s);
the lane's own pair (conftest.servers) serves the rest. Also: the stand-in's token ids decode
to its text with the real engine's tokenizer (/detokenize), the sim model's tokenizer in
both. The token-level answer's shape is compared in the contract (contract.py, token_ids and
the points after it)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import contract
import engine
from standin_helpers import free_port
from test_product import results, run_play

pytestmark = pytest.mark.slow

OTHER_SEED = 1
# make_tiny_model.py's model, with torch's seed other than its fixed 0: other random weights.
SEEDED = """
import sys
sys.path.insert(0, sys.argv[1])
import make_tiny_model
seed = make_tiny_model.torch.manual_seed
make_tiny_model.torch.manual_seed = lambda _fixed: seed(int(sys.argv[4]))
make_tiny_model.main(sys.argv[2], int(sys.argv[3]))
"""


def make_other_model(model_dir: Path, like: Path, seed: int):
    """The lane's tiny model (its tokenizer files, its config) with weights from another seed."""
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(like / name, model_dir / name)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONNOUSERSITE": "1",
    }
    max_positions = json.loads((like / "config.json").read_text())["max_position_embeddings"]
    proc = subprocess.run(
        [
            str(engine.ENGINE_PYTHON),
            "-c",
            SEEDED,
            str(Path(__file__).parent),
            str(model_dir),
            str(max_positions),
            str(seed),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def other_weights(servers, tmp_path_factory):
    """A second real vLLM 0.15.1, rendered from the serve role as the lane's, whose model has
    other weights (the same architecture and tokenizer)."""
    real = servers["real"]
    tmp = tmp_path_factory.mktemp("other-weights")
    (tmp / "conf").mkdir()
    rendered = engine.Rendered("real", free_port(), tmp / "data", real.api_key, conf_dir=tmp / "conf")
    make_other_model(rendered.model_dir, real.rendered.model_dir, OTHER_SEED)
    weights = "model.safetensors"
    assert (rendered.model_dir / weights).read_bytes() != (real.rendered.model_dir / weights).read_bytes()
    srv = engine.Server(
        "real vLLM 0.15.1 (seed %d)" % OTHER_SEED,
        rendered,
        engine.ENGINE_PYTHON,
        tmp / "real-other.log",
        api_key=real.api_key,
    )
    try:
        srv.wait_ready(900)
        yield srv
    finally:
        srv.stop()


def golden_task(name, srv, register, **extra):
    args = {
        "url": srv.base,
        "ca_file": engine.CA_FILE,
        "api_key": srv.api_key,
        "model": srv.rendered.served_name,
        "timeout": 300,
    }
    args.update(extra)
    return {"name": name, "golden_outputs": args, "register": register}


@pytest.fixture(scope="module")
def play(servers, other_weights, tmp_path_factory):
    """One ansible-playbook run: record on the lane's real server, compare the same server
    with it, compare the other weights' server with it."""
    tmp = tmp_path_factory.mktemp("golden-play")
    real = servers["real"]
    plays = [
        {
            "name": "golden outputs",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                golden_task("record", real, "golden"),
                golden_task("same weights", real, "same", mode="compare", baseline="{{ golden }}"),
                golden_task("other weights", other_weights, "other", mode="compare", baseline="{{ golden }}"),
            ],
        }
    ]
    doc, proc = run_play(tmp, plays)
    found = results(doc)
    assert set(found) == {"record", "same weights", "other weights"}, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, result in found.items():
        assert not result.get("failed"), "%s: %s" % (name, result.get("msg"))
    return found


def test_a_record_from_the_real_engine(play):
    record = play["record"]
    assert record["prompts"] and len(record["outputs"]) == len(record["prompts"]) == 8
    for out in record["outputs"]:
        assert len(out["token_ids"]) == record["max_tokens"] == 32
        assert all(isinstance(i, int) for i in out["token_ids"]) and out["finish_reason"] == "length"
    assert record["changed"] is False


def test_the_same_weights_pass(play):
    same = play["same weights"]
    assert same["passed"] is True, same["verdict"]
    assert same["verdict"] == "outputs equal: 8 prompts, 32 tokens each, token for token"
    assert same["digest"] == same["baseline_digest"] == play["record"]["digest"]
    assert same["failing"] == []


def test_other_weights_fail_naming_the_divergence(play):
    other = play["other weights"]
    assert other["passed"] is False
    assert other["digest"] != play["record"]["digest"]
    assert other["failing"], other["verdict"]
    first = other["divergences"][other["failing"][0]]
    assert first["diverges_at"] is not None and first["diverges_at"] < 32
    prompt = play["record"]["prompts"][first["index"]]
    assert re.match(
        r"outputs differ: prompt %d \(%s\) diverges at token %d of 32\b"
        % (first["index"], re.escape(repr(prompt if len(prompt) <= 40 else prompt[:40] + "...")), first["diverges_at"]),
        other["verdict"],
    ), other["verdict"]
    if not first["texts_equal"]:
        assert "(baseline %r, canary %r)" % (first["baseline_excerpt"], first["canary_excerpt"]) in other["verdict"]


def test_the_standins_token_ids_are_its_text_for_the_real_tokenizer(servers, clients):
    """The stand-in's ids, detokenized by the real engine (the same tokenizer files), give the
    stand-in's text."""
    standin, real = clients["standin"], clients["real"]
    body = {
        "model": standin.served,
        "prompt": "Write one short sentence about the sea.",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    choice = standin.post("/v1/completions", body).json()["choices"][0]
    ids = [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]
    assert len(ids) == 12
    reply = real.post("/detokenize", {"model": real.served, "tokens": ids})
    assert reply.status == 200, reply.body[:300]
    assert reply.json()["prompt"] == choice["text"]
    contract.wait_idle(real)
