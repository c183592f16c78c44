"""How long bare -> serving takes for N hosts, before a deploy: `kunlun-fleet estimate`.

The model starts from a measured run (a run report, reports/runs/<id>/summary.json: each
stage's wall time, its hosts and their task results) at n_ref serving hosts - best a
deploy of one real server (the README's "Real servers" path, step 6), which carries the
real driver install, image build, weights copy and engine start - and scales each stage to
N hosts by what grows with N:

- the controller's work: every host-task costs the controller `task_cpu_s` of CPU (Ansible
  and Mitogen; docs/performance.md measures 0.1-0.25 s on a 2-core controller), spread
  over its cores: a stage's `host_tasks / hosts` per host, times N, times task_cpu_s, over
  the cores. The rest of the stage's wall time is the hosts' own work, done side by side,
  `forks` hosts at a time;
- the image: every host but the builder pulls it from the builder's registry at once, so
  the builder's link carries (N - 1) images: (pullers(N) - pullers(n_ref)) x image / link;
- the weights: the controller sends them once, to one host; then hosts fetch from hosts
  that hold a verified copy, each source serving `per_source` at a time, so the holders
  grow (per_source + 1)-fold a wave (library/model_peer_plan.py): each wave more is
  per_source x model / link;
- the serve stage: a canary, then every idle host in one wave (serve_idle_batch_max
  bounds it): each batch more waits for an engine start.

Every input is printed with the estimate; the figures are a model, not a promise (the
network's real throughput, the registry's disk, a slow host).
"""

import math

# The stage terms that grow with N, and the input each is computed from (its `ref_` twin:
# the reference run's own value, by default the same - a reference run on real servers).
TERMS = {"image": "image_gb", "model": "model_gb", "serve": "engine_start_s"}


def waves(hosts, per_source, origin=1):
    """Peer waves after the origin copy until `hosts` hold the weights (model_peer_plan)."""
    if hosts <= origin:
        return 0
    have, n = origin, 0
    while have < hosts:
        have *= per_source + 1
        n += 1
    return n


def serve_batches(hosts, idle_batch_max=0):
    """Batches of a first deploy's serve stage: the canary, then the rest together (at most
    idle_batch_max at once, 0 for all)."""
    if hosts <= 1:
        return hosts
    rest = hosts - 1
    return 1 + (math.ceil(rest / idle_batch_max) if idle_batch_max else 1)


# The controller's own name in a run's hosts (plays and tasks delegated to it): not a server.
CONTROLLER = {"localhost", "127.0.0.1"}


def reference_hosts(summary):
    """The servers of a reference run (the hosts of its report but the controller)."""
    return len([h for h in summary.get("hosts") or {} if h not in CONTROLLER])


def stage_tasks_per_host(summary):
    """{stage: host-tasks per host}: from the stages' own counts, or (an older report) the
    hosts' task results spread over the stages by their wall time."""
    stages = summary.get("stages") or []
    if stages and all("host_tasks" in s for s in stages):
        return {s["stage"]: (s["host_tasks"] / s["hosts"]) if s.get("hosts") else 0.0 for s in stages}
    hosts = {k: v for k, v in (summary.get("hosts") or {}).items() if k not in CONTROLLER}
    per_host = (
        sum(sum(h.get(k, 0) for k in ("ok", "failed", "skipped", "unreachable")) for h in hosts.values()) / len(hosts)
        if hosts
        else 0.0
    )
    total = sum(s.get("wall_s") or 0 for s in stages) or 1.0
    return {s["stage"]: per_host * (s.get("wall_s") or 0) / total for s in stages}


def term(stage, hosts, value, inputs):
    """(seconds, what) of a stage's term that grows with the hosts: the image pulled from
    the builder's registry by every other host at once (the builder's link carries them);
    the weights sent once by the controller, then peer waves; an engine start per serve
    batch."""
    link = inputs["link_gbps"] * 1e9 / 8
    if stage == "image":
        pullers = max(0, hosts - 1)
        return pullers * value * 1e9 / link, "%d pull(s) of a %g GB image over the builder's link" % (pullers, value)
    if stage == "model":
        n = waves(hosts, inputs["per_source"])
        origin = value * 1e9 / (min(inputs["controller_gbps"], inputs["link_gbps"]) * 1e9 / 8)
        return (
            origin + n * inputs["per_source"] * value * 1e9 / link,
            "%g GB weights: one copy from the controller, %d peer wave(s) of %d per source"
            % (value, n, inputs["per_source"]),
        )
    batches = serve_batches(hosts, inputs["idle_batch_max"])
    return batches * value, "%d serve batch(es), an engine start of %.0f s each" % (batches, value)


def estimate(summary, hosts, inputs):
    """The estimate for `hosts` serving hosts from the reference run `summary`. `inputs`:
    task_cpu_s, cores, forks, link_gbps, controller_gbps, per_source, idle_batch_max, and
    image_gb, model_gb, engine_start_s (None: that term as the reference measured it) with
    their ref_ twins. Returns {n_ref, hosts, stages: [{stage, ref_s, est_s, why}], total_s}."""
    n_ref = max(1, reference_hosts(summary))
    per_host = stage_tasks_per_host(summary)
    cpu, cores, forks = inputs["task_cpu_s"], max(1, inputs["cores"]), max(1, inputs["forks"])
    rows = []
    for s in summary.get("stages") or []:
        if s.get("wall_s") is None:
            continue
        name, wall = s["stage"], float(s["wall_s"])
        tasks = per_host.get(name, 0.0)
        ctrl_ref = tasks * n_ref * cpu / cores
        ctrl = tasks * hosts * cpu / cores
        own = max(0.0, wall - ctrl_ref)
        rounds = math.ceil(hosts / forks) / math.ceil(n_ref / forks)
        est = own * rounds + ctrl
        why = ["%.0f host-tasks per host x %.2f CPU-s / %d cores" % (tasks, cpu, cores)]
        if rounds != 1:
            why.append("%d rounds of %d forks" % (math.ceil(hosts / forks), forks))
        if name in TERMS and inputs.get(TERMS[name]) is not None:
            key = TERMS[name]
            ref_value = inputs.get("ref_" + key)
            ref_value = inputs[key] if ref_value is None else ref_value
            target, what = term(name, hosts, inputs[key], inputs)
            measured, _ = term(name, n_ref, ref_value, inputs)
            est += target - measured
            why.append("%s: %.0f s for %d hosts against %.0f s in the reference" % (what, target, hosts, measured))
        rows.append({"stage": name, "ref_s": round(wall, 1), "est_s": round(est, 1), "why": "; ".join(why)})
    return {
        "n_ref": n_ref,
        "hosts": hosts,
        "stages": rows,
        "ref_total_s": round(sum(r["ref_s"] for r in rows), 1),
        "total_s": round(sum(r["est_s"] for r in rows), 1),
    }


def duration(seconds):
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "%dh%02dm" % (h, m) if h else "%dm%02ds" % (m, s)


def _given(inputs, key, fmt):
    if inputs.get(key) is None:
        return "as measured"
    ref = inputs.get("ref_" + key)
    return (fmt % inputs[key]) + ("" if ref is None else " (reference: %s)" % (fmt % ref))


def render(result, run_id, inputs):
    lines = [
        "estimate for %d serving host(s), from run %s (%d host(s) measured)"
        % (result["hosts"], run_id, result["n_ref"]),
        "",
        "%-12s %10s %10s  %s" % ("stage", "measured", "estimate", "what grows"),
    ]
    for r in result["stages"]:
        lines.append("%-12s %10s %10s  %s" % (r["stage"], duration(r["ref_s"]), duration(r["est_s"]), r["why"]))
    lines.append("%-12s %10s %10s" % ("total", duration(result["ref_total_s"]), duration(result["total_s"])))
    lines.append("")
    lines.append(
        "inputs: controller %d cores, forks %d, %.2f CPU-s per host-task; links %g Gb/s (controller %g); "
        "image %s; model %s; %d transfers per source; engine start %s; serve_idle_batch_max %d"
        % (
            inputs["cores"],
            inputs["forks"],
            inputs["task_cpu_s"],
            inputs["link_gbps"],
            inputs["controller_gbps"],
            _given(inputs, "image_gb", "%g GB"),
            _given(inputs, "model_gb", "%g GB"),
            inputs["per_source"],
            _given(inputs, "engine_start_s", "%.0f s"),
            inputs["idle_batch_max"],
        )
    )
    lines.append(
        "a model, not a promise: the reference run's own per-host work is taken as it was; the network, the "
        "registry's disk and the slowest host decide the rest (docs/performance.md, 'Bare to serving')"
    )
    return "\n".join(lines) + "\n"
