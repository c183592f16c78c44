"""The contract suite: every point of contract.POINTS sent to the real vLLM 0.15.1 and to the
stand-in, their observations compared. A difference fails, naming both answers."""

import json

import pytest

import contract
import engine

pytestmark = pytest.mark.slow


def _param(p):
    marks = []
    if p.standin_differs:
        marks.append(pytest.mark.xfail(strict=True, reason="stand-in differs: " + p.standin_differs))
    return pytest.param(p, id=p.observe.__name__, marks=marks)


@pytest.mark.parametrize("point", [_param(p) for p in contract.POINTS])
def test_point(point, clients):
    real = point.observe(clients["real"])
    if point.expect is not None:
        assert point.expect(real), "the real engine no longer answers as the contract says (%s): %s" % (
            point.name,
            json.dumps(real, sort_keys=True)[:3000],
        )
    standin = point.observe(clients["standin"])
    assert standin == real, "%s\n  real vLLM 0.15.1: %s\n  stand-in:         %s" % (
        point.name,
        json.dumps(real, sort_keys=True)[:3000],
        json.dumps(standin, sort_keys=True)[:3000],
    )


def test_the_api_key_came_from_the_env_file(servers):
    """serve passes the key only through api-key.env (VLLM_API_KEY); vllm 0.15.1 honours it
    without --api-key (entrypoints/openai/api_server.py, build_app:
    `args.api_key or [envs.VLLM_API_KEY]`). The 401 points above show it is enforced."""
    for srv in servers.values():
        assert "--api-key" not in srv.rendered.args
        assert srv.rendered.env["VLLM_API_KEY"] == srv.api_key
        assert srv.api_key not in " ".join(srv.rendered.argv)


def test_only_the_listed_substitutions_differ(servers):
    """The real engine's argv and environment are the stand-in's (a P800 host's) but for
    engine.SUBSTITUTIONS."""
    real, standin = servers["real"].rendered, servers["standin"].rendered

    def flags(args):
        out, i = {}, 0
        while i < len(args):
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[args[i]], i = args[i + 1], i + 2
            else:
                out[args[i]], i = True, i + 1
        return out

    a, b = flags(real.args), flags(standin.args)
    differ = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert differ == {"--tensor-parallel-size", "--quantization", "--port", "--model"}, differ
    assert a["--tensor-parallel-size"] == "1" and "--quantization" not in a
    assert b["--tensor-parallel-size"] == "8" and b["--quantization"] == "compressed-tensors"
    envs = {k for k in set(real.env) | set(standin.env) if real.env.get(k) != standin.env.get(k)}
    assert envs == {"VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_CI_ENV", "VLLM_CPU_NUM_OF_RESERVED_CPU"}, envs
    substituted = {name for name, _, applies, _ in engine.SUBSTITUTIONS if applies == "real"}
    assert substituted == {
        "kunlun_stack_serving_overrides.tensor_parallel_size",
        "kunlun_stack_serving_overrides.quantization",
        "kunlun_stack_serving_env_overrides.VLLM_CPU_KVCACHE_SPACE",
        "kunlun_stack_serving_env_overrides.VLLM_CPU_CI_ENV",
        "kunlun_stack_serving_env_overrides.VLLM_CPU_NUM_OF_RESERVED_CPU",
    }
