"""The contract suite: every point of contract.POINTS sent to the real vLLM 0.15.1 and to the
stand-in, their observations compared. A difference fails, naming both answers."""

import json
import re
from pathlib import Path

import pytest
import yaml

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


def test_the_api_keys_came_from_the_config_file_and_stay_out_of_the_log(servers):
    """serve passes the keys only through its --config file (api-keys.yaml: the fleet key and,
    during a rotation, the one it replaces); vllm 0.15.1 reads the file's `api-key` list as
    --api-key (utils/argparse_utils.py, load_config_file) and accepts each (the points
    `previous_key`, `wrong_key`). It logs its non-default arguments, keys included
    (entrypoints/utils.py, log_non_default_args): the role's logging configuration
    (VLLM_LOGGING_CONFIG_PATH) keeps that line out, and every other line as vllm's own."""
    for srv in servers.values():
        rendered = srv.rendered
        assert "--api-key" not in rendered.args and "VLLM_API_KEY" not in rendered.env
        assert rendered.args[:2] == ["--config", str(Path(rendered.variables["serve_config_dir"]) / "api-keys.yaml")]
        assert yaml.safe_load(rendered.files["api-keys.yaml"]) == {
            "api-key": [srv.api_key, engine.previous_key(srv.api_key)]
        }
        assert srv.api_key not in " ".join(rendered.argv)
        assert rendered.env["VLLM_LOGGING_CONFIG_PATH"].endswith("/vllm-logging.json")
        log = srv.log_path.read_text(errors="replace")
        assert srv.api_key not in log, "%s logged the key" % srv.name
        assert "non-default args" not in log, srv.name
        # uvicorn's own lines as before: vllm hands it the logging file too unless
        # --log-config-file says otherwise (the unit gives it empty: uvicorn's defaults).
        assert "Application startup complete." in log and '"GET /v1/models HTTP/1.1" 200' in log, srv.name
        # vllm's own lines, in its format, still there (the prefix - in colour, unless NO_COLOR
        # is set, which the stand-in leaves out - the level, date, file:line).
        line = (
            r"^(\x1b\[[0-9;]*m)?\(APIServer pid=\d+\)(\x1b\[[0-9;]*m)? INFO \d\d-\d\d \d\d:\d\d:\d\d \[\S+\.py:\d+\] "
        )
        assert re.search(line, log, re.M), (
            srv.name,
            log[:2000].replace(srv.api_key, "********"),
        )


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
