# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The named stacks (roles/kunlun_stack/defaults/main.yml: kunlun_stack_stacks and the site's
kunlun_stack_site_stacks): the chosen stack's parts under the names every role reads.
Documentation: the .yml file of each filter beside this one. The controller package does the
same through module_utils/kunlun_stack.py (stack_catalog, resolve_pins)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# A part's value when the stack is unknown: preflight refuses the name, naming the known ones,
# before anything reads the part; until then every part keeps its type.
EMPTY = {"base_image": ""}


def _expanded(entry, catalog, seen=()):
    """A stack with `based_on` worked out: the base stack's parts, then the entry's over them -
    its components one by one (a component it names replaces the base's whole), every other
    part whole; status, reason and summary are never inherited. An unknown or circular base is
    left as the entry is (preflight names it)."""
    base_name = entry.get("based_on") if isinstance(entry, dict) else None
    base = catalog.get(base_name) if base_name and base_name not in seen else None
    if not isinstance(base, dict):
        return entry
    base = _expanded(base, catalog, seen + (base_name,))
    out = dict((k, v) for k, v in base.items() if k not in ("status", "reason", "summary", "based_on"))
    components = dict(base.get("components") or {})
    components.update(entry.get("components") or {})
    out.update(entry)
    out["components"] = components
    return out


def fleet_stack_catalog(stacks, site_stacks=None):
    """The shipped stacks with the site's beside them, each complete (`based_on` worked out);
    a shipped name keeps its shipped entry (preflight refuses a site stack that reuses one)."""
    catalog = dict(site_stacks or {})
    catalog.update(stacks or {})
    return dict((name, _expanded(entry, catalog, (name,))) for name, entry in catalog.items())


def fleet_stack_part(stacks, site_stacks, name, part):
    """`part` (components, base_image, driver, patch_expect, serving, serving_env,
    golden_tolerance, status, reason) of the stack called `name`."""
    entry = fleet_stack_catalog(stacks, site_stacks).get(str(name)) or {}
    if part in entry:
        return entry[part]
    return EMPTY.get(part, {})


class FilterModule(object):
    def filters(self):
        return {"fleet_stack_catalog": fleet_stack_catalog, "fleet_stack_part": fleet_stack_part}
