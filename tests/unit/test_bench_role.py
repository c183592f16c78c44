"""roles/bench rendered without a host: the points the role makes for a sweep
(points.json.j2, Ansible's own templating) and the arguments of its open-files check, for
the sweeps an operator asks for - fleet points only (`bench_host_concurrency: []`), a
per-host single stream only ([1]), the default."""

import json

import pytest
import yaml

from ansible.module_utils import bench_results as br
from kunlun_fleet import monitoring
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = monitoring.ROOT
ROLE = ROOT / "roles" / "bench"
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]


def variables(**extra):
    """What a bench play on three hosts with a gateway sees (the role's defaults, then the
    inventory's and -e's variables)."""
    v = {"ansible_managed": "Ansible managed"}
    v.update(stack_pins())
    v.update(yaml.safe_load((ROLE / "defaults/main.yml").read_text()))
    v.update(
        {
            "ansible_play_hosts": HOSTS,
            "role_path": str(ROLE),
            "bench_gateway_url": "http://10.0.0.5:8080",
            "bench_host_urls": {h: "http://10.0.0.%d:8000" % (11 + i) for i, h in enumerate(HOSTS)},
        }
    )
    v.update(extra)
    return v


def points(**extra):
    return json.loads(monitoring.render(ROLE / "templates" / "points.json.j2", variables(**extra)))


def fd_task_args(**extra):
    """The open-files check's module arguments as the role renders them."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    task = next(t for t in tasks if t["name"] == "Bench | The controller can open enough connections")
    args = task["bench_fd_limit"]
    v = variables(**extra)
    v["bench_points"] = points(**extra)
    templar = Templar(loader=DataLoader(), variables=monitoring._trust(v))
    return {k: templar.template(monitoring._trust(val)) for k, val in args.items()}


def labels(pts):
    return [p["label"] for p in pts]


def test_default_sweep_measures_the_fleet_and_every_host():
    pts = points()
    assert labels(pts)[:7] == [
        "fleet-single",
        "fleet-c64",
        "fleet-c256",
        "fleet-c1024",
        "fleet-c2048",
        "fleet-long",
        "kf-node-1-single",
    ]
    assert {p["target"] for p in pts} == {"fleet", *HOSTS}


def test_an_empty_host_sweep_is_fleet_points_only():
    pts = points(bench_concurrency=[1024], bench_host_concurrency=[])
    assert labels(pts) == ["fleet-single", "fleet-c1024", "fleet-long"]


def test_a_host_sweep_of_one_is_each_hosts_single_stream():
    pts = points(bench_concurrency=[1024], bench_host_concurrency=[1], bench_long_per_host=False)
    assert labels(pts) == ["fleet-single", "fleet-c1024", "fleet-long"] + ["%s-single" % h for h in HOSTS]


@pytest.mark.parametrize(
    "extra, streams",
    [
        # kunlun-fleet bench --concurrency 1024 -e '{"bench_host_concurrency": []}' (issue #29)
        ({"bench_concurrency": [1024], "bench_host_concurrency": []}, 1024),
        # hosts side by side: 3 hosts at 2048 each (bench_host_parallel 8) beat the fleet's 2048
        ({}, 3 * 2048),
        ({"bench_host_parallel": 2}, 2 * 2048),
        ({"bench_concurrency": [1, 64], "bench_per_host": False}, 64),
    ],
)
def test_the_open_files_check_counts_the_points_that_run(extra, streams):
    args = fd_task_args(**extra)
    assert br.concurrent_streams(args["points"], int(args["host_parallel"]))[0] == streams


def test_the_open_files_module_takes_the_points():
    """bench_fd_limit itself with the fleet-only points: checked, not a template error."""
    from unittest import mock

    import bench_fd_limit
    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    class Done(Exception):
        pass

    def done(self, **kw):
        raise Done(kw)

    args = fd_task_args(bench_concurrency=[1024], bench_host_concurrency=[])
    with (
        patch_module_args(dict(args, _ansible_check_mode=False)),
        mock.patch.multiple(basic.AnsibleModule, exit_json=done, fail_json=done),
    ):
        with pytest.raises(Done) as exc:
            bench_fd_limit.main()
    r = exc.value.args[0]
    assert r["concurrency"] == 1024 and r["needed"] == 1024 + 1024 and r["action"] in ("ok", "raise", "refuse")
    assert "largest fleet point 1024, 0 host(s) side by side" in r["msg"]
