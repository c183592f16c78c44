"""`kunlun-fleet estimate` (kunlun_fleet/estimate.py): bare -> serving time for N hosts from a
measured run. The model gives back the reference run at the reference's own size, grows each
stage by the controller's work per host-task, and adds what grows with the fleet: the image's
pulls over the builder's link, the weights' peer waves, the serve stage's engine starts."""

import json

import pytest

from kunlun_fleet import cli, estimate, runner

INPUTS = {
    "task_cpu_s": 0.2,
    "cores": 4,
    "forks": 50,
    "link_gbps": 25.0,
    "controller_gbps": 10.0,
    "per_source": 2,
    "idle_batch_max": 0,
    "image_gb": 30.0,
    "model_gb": 31.0,
    "engine_start_s": 600.0,
    "ref_image_gb": None,
    "ref_model_gb": None,
    "ref_engine_start_s": None,
}


def summary(n=1):
    hosts = ["p800-%02d" % i for i in range(1, n + 1)]
    stages = [("preflight", 20.0, 12), ("image", 900.0, 120), ("model", 200.0, 10), ("serve", 700.0, 60)]
    return {
        "id": "20261207T000000Z-deploy",
        "stages": [{"stage": s, "wall_s": w, "hosts": n, "host_tasks": t * n} for s, w, t in stages],
        "hosts": dict({h: {"ok": 200, "failed": 0, "skipped": 2, "unreachable": 0} for h in hosts}, localhost={}),
    }


@pytest.mark.parametrize("hosts, waves", [(1, 0), (2, 1), (3, 1), (4, 2), (9, 2), (10, 3), (27, 3), (40, 4), (200, 5)])
def test_peer_waves_grow_threefold_with_two_per_source(hosts, waves):
    assert estimate.waves(hosts, 2) == waves


def test_serve_batches_of_a_first_deploy():
    assert [estimate.serve_batches(n) for n in (1, 2, 3, 40)] == [1, 2, 2, 2]
    assert estimate.serve_batches(40, idle_batch_max=10) == 1 + 4


@pytest.mark.parametrize("n", [1, 3, 12])
def test_the_reference_at_its_own_size_is_given_back(n):
    result = estimate.estimate(summary(n), n, INPUTS)
    assert result["n_ref"] == n  # the controller (localhost) is not a server
    assert [(r["stage"], r["est_s"]) for r in result["stages"]] == [(r["stage"], r["ref_s"]) for r in result["stages"]]
    assert result["total_s"] == result["ref_total_s"] == 1820.0


def test_what_grows_from_one_host_to_forty():
    result = estimate.estimate(summary(1), 40, INPUTS)
    by = {r["stage"]: r for r in result["stages"]}
    # The controller: 12 host-tasks per host x 0.2 CPU-s / 4 cores = 0.6 s per host.
    assert by["preflight"]["est_s"] == pytest.approx(20.0 + 39 * 0.6, abs=0.1)
    # The image: 39 pulls of 30 GB over one 25 Gb/s link (3.125 GB/s) = 374.4 s more.
    assert by["image"]["est_s"] == pytest.approx(900.0 + 39 * 6.0 + 374.4, abs=0.1)
    assert "39 pull(s) of a 30 GB image" in by["image"]["why"]
    # The weights: 1 -> 3 -> 9 -> 27 -> 81 holders: 4 waves of 2 x 31 GB at 3.125 GB/s.
    assert by["model"]["est_s"] == pytest.approx(200.0 + 39 * 0.5 + 4 * 2 * 31 / 3.125, abs=0.1)
    # Serve: the canary, then the 39 others together: one engine start more.
    assert by["serve"]["est_s"] == pytest.approx(700.0 + 39 * 3.0 + 600.0, abs=0.1)
    # Past the forks, the hosts' own work goes in rounds.
    big = {r["stage"]: r for r in estimate.estimate(summary(1), 120, INPUTS)["stages"]}
    assert big["preflight"]["est_s"] == pytest.approx((20.0 - 0.6) * 3 + 120 * 0.6, abs=0.1)


def test_a_reference_of_other_sizes():
    # A sim reference: a 0.77 GB image, weights of kilobytes, an engine start of seconds.
    sim = dict(INPUTS, ref_image_gb=0.77, ref_model_gb=0.0001, ref_engine_start_s=5.0)
    by = {r["stage"]: r for r in estimate.estimate(summary(3), 3, sim)["stages"]}
    assert by["serve"]["est_s"] == pytest.approx(700.0 + 2 * 600.0 - 2 * 5.0, abs=0.1)
    assert by["image"]["est_s"] == pytest.approx(900.0 + 2 * (30 - 0.77) / 3.125, abs=0.1)
    # Sizes not given: those terms as measured (only the controller grows).
    bare = dict(INPUTS, image_gb=None, model_gb=None, engine_start_s=None)
    by = {r["stage"]: r for r in estimate.estimate(summary(1), 40, bare)["stages"]}
    assert by["serve"]["est_s"] == pytest.approx(700.0 + 39 * 3.0, abs=0.1)


def test_an_older_report_spreads_the_hosts_tasks_over_the_stages():
    old = summary(2)
    for s in old["stages"]:
        del s["host_tasks"], s["hosts"]
    per = estimate.stage_tasks_per_host(old)
    assert sum(per.values()) == pytest.approx(202.0) and per["image"] > per["preflight"]


def test_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUNLUN_FLEET_ROOT", str(tmp_path))
    # No run to start from: refused, with the way to get one.
    assert cli.main(["estimate", "--hosts", "40"]) == runner.REFUSED
    assert "deploy one server first" in capsys.readouterr().err
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    xpu_servers:\n      hosts:\n" + "".join("        h%d:\n" % i for i in range(7))
    )
    run = runner.runs_dir(tmp_path) / "20261207T000000Z-deploy"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        json.dumps(dict(summary(1), command="deploy", exit_code=0, inventory=str(inv), stages_selected=None))
    )
    # A --only run is no reference for a whole deploy.
    other = runner.runs_dir(tmp_path) / "20261208T000000Z-deploy"
    other.mkdir()
    (other / "summary.json").write_text(
        json.dumps(dict(summary(1), command="deploy", exit_code=0, inventory=str(inv), stages_selected=["storage"]))
    )
    assert cli.main(["estimate", "-i", str(inv), "--controller-cores", "4", "--image-gb", "30", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["run"] == "20261207T000000Z-deploy" and got["hosts"] == 7 and got["n_ref"] == 1
    assert cli.main(["estimate", "-i", str(inv), "--controller-cores", "4"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("estimate for 7 serving host(s), from run 20261207T000000Z-deploy (1 host(s) measured)")
    assert "a model, not a promise" in text
