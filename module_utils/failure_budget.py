# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The failure budget's arithmetic: how many serving hosts a run may leave out (a host
that failed or became unreachable is out of the rest of the run, Ansible's own rule) and
still go on with the others, and whether the hosts left out so far are within it.

A host the whole fleet depends on (a gateway, the image builder, the monitoring host) is
never within a budget: losing it is a fault every host shares. Standard library only; pure
functions.
"""

from __future__ import absolute_import, division, print_function

import math

__metaclass__ = type


def _number(text, kind):
    try:
        return kind(text)
    except ValueError:
        return None


def parse_budget(value, serving):
    """An int (hosts, 0 or more) or 'N%' (of `serving`, rounded down: '10%' of 9 is 0, of 40
    is 4) -> hosts. Raises ValueError naming the value on anything else."""
    text = str(value).strip()
    if isinstance(value, bool) or not text:
        raise ValueError("%r is not a host count or a percentage" % (value,))
    if text.endswith("%"):
        pct = _number(text[:-1], float)
        if pct is None:
            raise ValueError("%r is not a percentage like '10%%'" % (value,))
        if pct < 0 or pct > 100:
            raise ValueError("%r: a percentage must be from 0%% to 100%%" % (value,))
        return int(math.floor(int(serving) * pct / 100.0 + 1e-9))
    hosts = _number(text, int)
    if hosts is None or hosts < 0 or str(hosts) != text.lstrip("+"):
        raise ValueError("%r: give a host count (0 or more) or a percentage like '10%%'" % (value,))
    return hosts


def verdict(hosts, remaining, serving, shared, budget):
    """The hosts left out so far (in `hosts`, the run's hosts of this play, not in
    `remaining`) against the budget. Returns a dict: left_out, shared_left_out, serving (the
    run's serving hosts, the base of a percentage), allowed, within (bool) and why."""
    remaining = set(remaining)
    left_out = [h for h in hosts if h not in remaining]
    shared_set = set(shared)
    serving_in_run = [h for h in hosts if h in set(serving)]
    allowed = parse_budget(budget, len(serving_in_run))
    shared_out = [h for h in left_out if h in shared_set]
    within = not shared_out and len(left_out) <= allowed
    if not left_out:
        why = "no host left out (budget %d of %d serving hosts)" % (allowed, len(serving_in_run))
    elif shared_out:
        why = (
            "%s left out, and the fleet depends on %s (a gateway, the image builder or the monitoring host): "
            "a fault every host shares stops the run, whatever the budget"
            % (", ".join(left_out), "it" if len(shared_out) == 1 else "them: " + ", ".join(shared_out))
        )
    else:
        why = "%d host(s) left out (%s), budget %d of %d serving hosts (kunlun_stack_failure_budget: %s)" % (
            len(left_out),
            ", ".join(left_out),
            allowed,
            len(serving_in_run),
            budget,
        )
    return {
        "left_out": left_out,
        "shared_left_out": shared_out,
        "serving": len(serving_in_run),
        "allowed": allowed,
        "within": within,
        "why": why,
    }
