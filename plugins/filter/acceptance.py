# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The acceptance role's verdict line for one measured single stream (a host's, or the fleet
endpoint's): PASS or FAIL against the target, with the figures; and the report's lines, the
hosts' then the fleet endpoint's. The run report and the operator read these lines; their
form is kept exactly. Documentation: acceptance_line.yml and acceptance_lines.yml."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def acceptance_line(result, subject, target, tokens=True):
    """`result` is serving_ready's registered result (tokens_per_s, ttft_s, completion_tokens,
    and msg when it failed)."""
    tokens_per_s = float(result.get("tokens_per_s", 0))
    verdict = "PASS" if tokens_per_s >= float(target) else "FAIL"
    line = "%s %s: single stream %.1f tok/s (target %s), first token %.2f s" % (
        verdict,
        subject,
        tokens_per_s,
        target,
        float(result.get("ttft_s", 0)),
    )
    if tokens:
        line += ", %s tokens" % result.get("completion_tokens", 0)
    if "msg" in result:
        line += " - %s" % result["msg"]
    return line


def acceptance_lines(hosts, hostvars, fleet_result, gateway_url, target):
    """The report's lines: each host's `acceptance_line` (`hosts` in play order, read from
    `hostvars`), then the fleet endpoint's line from `fleet_result` when there is a fleet
    endpoint (`gateway_url` not empty; `fleet_result` is not read otherwise: its measurement
    was skipped)."""
    lines = [hostvars[host]["acceptance_line"] for host in hosts]
    if len(gateway_url) > 0:
        lines.append(acceptance_line(fleet_result, "fleet endpoint %s" % gateway_url, target, tokens=False))
    return lines


class FilterModule:
    def filters(self):
        return {"acceptance_line": acceptance_line, "acceptance_lines": acceptance_lines}
