"""library/model_peer_plan.py, model_fetch.py and model_share.py through AnsibleModule:
arguments, check mode (nothing fetched, nothing started), messages."""

from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

import model_fetch
import model_peer_plan
import model_share


class Done(Exception):
    pass


def run_main(module, args, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)

    def out(self, **kw):
        raise Done(kw)

    with (
        patch_module_args(args),
        mock.patch.multiple(basic.AnsibleModule, exit_json=out, fail_json=lambda s, **kw: out(s, failed=True, **kw)),
    ):
        with pytest.raises(Done) as exc:
            module.main()
    return exc.value.args[0]


HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
ADDRESSES = {"kf-node-1": "172.31.250.11", "kf-node-2": "172.31.250.12", "kf-node-3": "172.31.250.13"}


def test_plan_module_same_answer_in_check_mode():
    args = {"hosts": HOSTS, "addresses": ADDRESSES, "missing": {"kf-node-1": 0, "kf-node-2": 7, "kf-node-3": 2}}
    real, check = run_main(model_peer_plan, args), run_main(model_peer_plan, args, check_mode=True)
    assert real == check and real["changed"] is False
    assert real["assignments"]["kf-node-3"]["source_address"] == "172.31.250.11"
    assert real["assignments"]["kf-node-2"]["fallbacks"] == []


def test_plan_module_refuses_a_host_without_a_result_and_a_zero_bound():
    r = run_main(model_peer_plan, {"hosts": HOSTS, "addresses": ADDRESSES, "missing": {"kf-node-1": 0}})
    assert r["failed"] and "kf-node-2, kf-node-3" in r["msg"]
    r = run_main(
        model_peer_plan,
        {
            "hosts": HOSTS,
            "addresses": ADDRESSES,
            "per_source": 0,
            "missing": {"kf-node-1": 0, "kf-node-2": 1, "kf-node-3": 1},
        },
    )
    assert r["failed"] and "per_source must be at least 1" in r["msg"]


def test_fetch_check_mode_says_the_source_and_writes_nothing(tmp_path):
    dest = tmp_path / "model"
    r = run_main(
        model_fetch,
        {
            "dest": str(dest),
            "partial_dir": str(tmp_path / "partial"),
            "files": {"config.json": "0" * 64},
            "sources": [{"name": "kf-node-1", "address": "172.31.250.11"}],
            "prefix": "Qwen3.8-27B-W8A8-INT8-Dynamic",
        },
        check_mode=True,
    )
    assert r["changed"] is True and r["would_fetch"] == {"files": ["config.json"], "source": "kf-node-1"}
    assert not dest.exists() and not (tmp_path / "partial").exists()


def test_fetch_nothing_to_do_is_unchanged_and_bad_source_refused(tmp_path):
    r = run_main(model_fetch, {"dest": str(tmp_path), "partial_dir": str(tmp_path / "p"), "files": {}, "sources": []})
    assert r["changed"] is False and r["fetched"] == []
    r = run_main(
        model_fetch,
        {
            "dest": str(tmp_path),
            "partial_dir": str(tmp_path / "p"),
            "files": {"a": "0" * 64},
            "sources": [{"name": "x", "url": "ftp://h/"}],
        },
    )
    assert r["failed"] and "http://" in r["msg"]


def test_share_check_mode_starts_nothing(tmp_path):
    calls = []

    def run_command(self, argv, **kw):
        calls.append(argv)
        return 3, "inactive\n", ""

    with (
        mock.patch.object(basic.AnsibleModule, "run_command", run_command),
        mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: "/usr/bin/" + name),
    ):
        r = run_main(
            model_share,
            {
                "state": "started",
                "script": "/nonexistent/model_share.py",
                "address": "10.0.0.1",
                "root": str(tmp_path),
                "manifest": "/nonexistent.sha256",
            },
            check_mode=True,
        )
    assert r["changed"] is True and r["active"] is False
    assert [c for c in calls if "systemd-run" in c[0]] == []  # only `systemctl is-active` was asked
