# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for what the serve role computes from its settings and its hosts: the vLLM command
line from the serving flags, the requests in flight from a server's /metrics, whether a host
needs a restart or can go back to its last good configuration, and the bench results the
rollout's capacity gate reads.

The unit template, the tests and the stand-in's checks build vLLM's argv with the same
function (vllm_argv), so a flag is spelled in one place. Their documentation: vllm_argv.yml,
vllm_in_flight.yml, serve_needs_restart.yml, serve_can_roll_back.yml and
serve_capacity_results_file.yml beside this file (ansible-doc -t filter).
"""

from __future__ import absolute_import, division, print_function

import re
from collections.abc import Mapping, MutableMapping, MutableSequence

__metaclass__ = type

# vLLM's own gauges of the requests a server holds: running and waiting (vllm/v1/metrics).
# The same pattern as module_utils/rollout_capacity.py's, which the rollout module runs on
# the hosts (a filter runs on the controller and cannot import module_utils); a unit test
# keeps the two equal.
IN_FLIGHT = re.compile(r"(?m)^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? ([0-9.eE+-]+)\s*$")


def _flag(name, value):
    """The tokens of one flag: [] for false or null, the bare flag for true."""
    if value is None or value is False:
        return []
    flag = "--" + str(name).replace("_", "-")
    if value is True:
        return [flag]
    return [flag, str(value)]


def vllm_argv(flags, lines=False):
    if not isinstance(flags, dict):
        raise TypeError("vllm_argv expects a dict of serving flags, got %s" % type(flags).__name__)
    groups = [_flag(name, flags[name]) for name in sorted(flags)]
    if lines:
        return [" ".join(group) for group in groups if group]
    return [token for group in groups for token in group]


def vllm_in_flight(metrics_text):
    """Running + waiting requests of one vLLM server, from its /metrics text (0 for none)."""
    return int(sum(float(v) for v in IN_FLIGHT.findall(metrics_text or "")))


# A bench run's results, reports/bench-<UTC timestamp>/results.json (the names sort by time).
BENCH_RESULTS = re.compile(r"/bench-[^/]+/results.json$")


def _changed(result):
    """Ansible's `changed` test (ansible.plugins.test.core.changed) on a registered result:
    its `changed`, or for a loop's result without one, whether any item changed."""
    if not isinstance(result, MutableMapping):
        raise TypeError("expected a registered task result (a dict), got %s" % type(result).__name__)
    if "changed" in result:
        return bool(result.get("changed"))
    results = result.get("results")
    if isinstance(results, MutableSequence) and results and isinstance(results[0], MutableMapping):
        return any(item.get("changed") for item in results)
    return False


def serve_needs_restart(config_results, running, pending):
    """Whether the service needs a restart: one of the serving configuration's files would
    change (`config_results`: their registered results, from the check-mode probe), the
    service is not running, or an earlier run left a restart pending."""
    return bool(any(_changed(result) for result in config_results) or not running or pending)


def serve_can_roll_back(config_results, last_good):
    """Whether a host that failed readiness can go back: there is a last good configuration
    (`last_good`, the slurp of last-good/image, has content) and this run changed the serving
    configuration (`config_results`: the files' registered results)."""
    return isinstance(last_good, Mapping) and "content" in last_good and any(_changed(r) for r in config_results)


def _bench_inventory(path):
    """The inventory a bench results file was measured with (its meta.inventory), or None."""
    import json
    import os

    try:
        with open(path) as fh:
            meta = (json.load(fh) or {}).get("meta") or {}
    except (OSError, ValueError, AttributeError):
        return None
    inventory = meta.get("inventory")
    return os.path.realpath(inventory) if inventory else None


def serve_capacity_results_file(given, found, inventory=None):
    """The bench results the capacity gate reads: `given` (serve_capacity_results) when set,
    else the latest reports/bench-<timestamp>/results.json among `found` (the find's
    registered result; none when it was skipped) measured with `inventory` (its
    meta.inventory: another inventory's bench, the demo's say, measured other hosts), else
    ''. Without `inventory`, the latest of any."""
    import os

    if given:
        return given
    paths = [f["path"] for f in found.get("files", []) if BENCH_RESULTS.search(f["path"])]
    # Jinja's sort, as the role sorted them: case-insensitive, stable.
    paths = sorted(paths, key=lambda p: p.lower() if isinstance(p, str) else p)
    if inventory:
        wanted = os.path.realpath(str(inventory))
        paths = [p for p in paths if _bench_inventory(p) == wanted]
    return paths[-1] if paths else ""


class FilterModule:
    def filters(self):
        return {
            "vllm_argv": vllm_argv,
            "vllm_in_flight": vllm_in_flight,
            "serve_needs_restart": serve_needs_restart,
            "serve_can_roll_back": serve_can_roll_back,
            "serve_capacity_results_file": serve_capacity_results_file,
        }
