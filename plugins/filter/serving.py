# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for what the serve role computes from its settings: the vLLM command line from
the serving flags, and the requests in flight from a server's /metrics.

The unit template, the tests and the stand-in's checks build vLLM's argv with the same
function (vllm_argv), so a flag is spelled in one place. Their documentation: vllm_argv.yml
and vllm_in_flight.yml beside this file (ansible-doc -t filter).
"""

from __future__ import absolute_import, division, print_function

import re

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


class FilterModule:
    def filters(self):
        return {"vllm_argv": vllm_argv, "vllm_in_flight": vllm_in_flight}
