# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks of the named stacks, their pins and the serving arguments.

The data (the named stacks, known-bad combinations, serving rules) lives in
roles/kunlun_stack/defaults/main.yml; this module only applies it, so preflight, the
image proof and serve all judge a configuration the same way, and the controller package
works out the chosen stack's pins the way the roles do (resolve_pins). Every problem is returned
as a Problem naming the item, what was found and the fix; nothing here raises on bad
input. Standard library only: it also runs on managed hosts (Python 3.8+).
"""

from __future__ import absolute_import, division, print_function

import difflib
import re

__metaclass__ = type


class Problem(object):
    """One violated rule: which item, what was found, and how to fix it."""

    def __init__(self, item, found, fix):
        self.item = item
        self.found = found
        self.fix = fix

    def as_dict(self):
        return {"item": self.item, "found": self.found, "fix": self.fix}

    def __str__(self):
        return "%s: %s. Fix: %s" % (self.item, self.found, self.fix)

    def __repr__(self):
        return "Problem(%r)" % str(self)


STACK_STATUSES = ("validated", "candidate", "known-bad")
# The variables every role reads, each a part of the chosen stack (the shipped defaults set
# them to plugins/filter/stacks.py's fleet_stack_part of kunlun_stack_stack).
STACK_PARTS = {
    "kunlun_stack_components": "components",
    "kunlun_stack_base_image": "base_image",
    "kunlun_stack_driver": "driver",
    "kunlun_stack_patch_expect": "patch_expect",
    "kunlun_stack_serving": "serving",
    "kunlun_stack_serving_env": "serving_env",
}
REQUIRED_PARTS = ("status", "base_image", "components", "driver", "patch_expect", "serving", "serving_env")


def _expanded(entry, catalog, seen=()):
    """A stack with `based_on` worked out: the base stack's parts, then the entry's over them -
    its components one by one (a component it names replaces the base's whole), every other
    part whole; status, reason and summary are never inherited."""
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


def stack_catalog(stacks, site_stacks=None):
    """Every stack by name, each complete (`based_on` worked out): the site's beside the
    shipped ones (a shipped name keeps its shipped entry). The same as plugins/filter/stacks.py's
    fleet_stack_catalog, which the roles use (tests/unit/test_stacks.py holds them equal)."""
    catalog = dict(site_stacks or {})
    catalog.update(stacks or {})
    return dict((name, _expanded(entry, catalog, (name,))) for name, entry in catalog.items())


def check_stack(name, stacks, site_stacks=None):
    """(problems, warnings) of serving the stack called `name`: an unknown name, a site stack
    that reuses a shipped name or lacks a part, a status that is none of STACK_STATUSES, a
    known-bad stack (its reason); a candidate is a warning (not yet proven on P800 servers)."""
    problems, warnings = [], []
    stacks, site_stacks = stacks or {}, site_stacks or {}
    for reused in sorted(set(site_stacks) & set(stacks)):
        problems.append(
            Problem(
                "site stack %s" % reused,
                "kunlun_stack_site_stacks reuses the name of a shipped stack",
                "give the site's stack its own name (a shipped stack changes with a release, never in an inventory)",
            )
        )
    catalog = stack_catalog(stacks, site_stacks)
    entry = catalog.get(str(name))
    if not isinstance(entry, dict):
        problems.append(
            Problem(
                "stack %s" % name,
                "no such stack (known: %s)" % ", ".join(sorted(catalog)),
                "set kunlun_stack_stack to one of them, or define it in kunlun_stack_site_stacks (docs/upgrades.md)",
            )
        )
        return problems, warnings
    based_on = (site_stacks.get(str(name)) or stacks.get(str(name)) or {}).get("based_on")
    if based_on and (based_on == name or based_on not in catalog):
        problems.append(
            Problem(
                "stack %s" % name,
                "based_on %s is no other stack (known: %s)" % (based_on, ", ".join(sorted(catalog))),
                "base it on a stack of the catalog, or give it every part",
            )
        )
    missing = [part for part in REQUIRED_PARTS if part not in entry]
    if missing:
        problems.append(
            Problem(
                "stack %s" % name,
                "it has no %s" % ", ".join(missing),
                "give the stack every part (docs/upgrades.md: a stack is a complete combination)",
            )
        )
    status = entry.get("status")
    if status not in STACK_STATUSES:
        problems.append(
            Problem(
                "stack %s" % name,
                "status %r is none of %s" % (status, ", ".join(STACK_STATUSES)),
                "set its status to one of them",
            )
        )
    elif status == "known-bad":
        validated = sorted(n for n, e in catalog.items() if (e or {}).get("status") == "validated")
        problems.append(
            Problem(
                "stack %s" % name,
                "known-bad: %s" % " ".join(str(entry.get("reason") or "(no reason recorded)").split()),
                "serve a validated stack (%s)" % (", ".join(validated) or "none"),
            )
        )
    elif status == "candidate":
        warnings.append(
            "stack %s is a candidate, not yet proven on P800 servers: prove it against the fleet with "
            "`kunlun-fleet upgrade --to %s` (docs/upgrades.md)" % (name, name)
        )
    return problems, warnings


def resolve_pins(variables, stack=None):
    """The kunlun_stack variables with the chosen stack's parts worked out, as the roles see
    them: a copy of `variables` (the defaults file, with any inventory values over it) where
    each STACK_PARTS variable still holding the shipped template is the part of the stack named
    by `stack` (or the variables' kunlun_stack_stack). A variable set to a value (an
    inventory's departure) is kept as it is. An unknown stack gives empty parts (check_stack
    names it)."""
    out = dict(variables)
    if stack is not None:
        out["kunlun_stack_stack"] = stack
    entry = stack_catalog(out.get("kunlun_stack_stacks"), out.get("kunlun_stack_site_stacks")).get(
        str(out.get("kunlun_stack_stack"))
    )
    entry = entry if isinstance(entry, dict) else {}
    for name, part in STACK_PARTS.items():
        value = out.get(name)
        if value is None or (isinstance(value, str) and "fleet_stack_part" in value):
            out[name] = entry.get(part, "" if part == "base_image" else {})
    return out


def _version_of(components, name):
    """The pinned version of a component, '' when the component is not pinned."""
    entry = components.get(name) or {}
    if isinstance(entry, dict):
        return str(entry.get("version", "") or "")
    return str(entry)


def _matches(expected, actual):
    """A known-bad condition: "1.2" equals, "!1.2" means any other (non-empty) value."""
    expected = str(expected)
    if expected.startswith("!"):
        return actual != "" and actual != expected[1:]
    return actual == expected


def component_versions(components):
    """Flatten the pins into {name: version}, plus `<name>_commit` where a commit is pinned."""
    flat = {}
    for name, entry in (components or {}).items():
        flat[name] = _version_of(components, name)
        if isinstance(entry, dict) and entry.get("commit"):
            flat["%s_commit" % name] = str(entry["commit"])
    return flat


def check_known_bad(versions, known_bad):
    """Problems for every known-bad rule whose conditions all hold for `versions`.

    `versions` is {component: version} (as pinned, or as found inside an image).
    """
    problems = []
    for rule in known_bad or []:
        when = rule.get("when") or {}
        if not when:
            continue
        if all(_matches(want, str(versions.get(name, "") or "")) for name, want in when.items()):
            found = ", ".join("%s %s" % (name, versions.get(name)) for name in sorted(when))
            problems.append(
                Problem(
                    "known-bad combination",
                    "%s (%s)" % (found, " ".join(str(rule.get("why", "")).split())),
                    "serve a validated stack of roles/kunlun_stack/defaults/main.yml "
                    "(kunlun_stack_stack; remove the override from your inventory)",
                )
            )
    return problems


def check_departures(components, validated):
    """Problems for every pin that differs from the validated combination.

    A departure that is not known-bad is still a problem: nothing else has been proven
    to load. Callers decide whether an operator may accept it.
    """
    versions = component_versions(components)
    expected = component_versions(validated)
    problems = []
    for name in sorted(expected):
        if versions.get(name, "") != expected[name]:
            problems.append(
                Problem(
                    "pin %s" % name.replace("_commit", " commit"),
                    "inventory asks for %r, the validated combination is %r"
                    % (versions.get(name) or "(missing)", expected[name]),
                    "set %s back to %s (only the validated combination is known to load)" % (name, expected[name]),
                )
            )
    return problems


def check_pins(components, validated, known_bad):
    """Known-bad combinations among the pins, then their departures from the validated set."""
    return check_known_bad(component_versions(components), known_bad) + check_departures(components, validated)


def _as_number(value):
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_serving(args, rules, device_count):
    """Problems of the vllm serving arguments against the serving rules.

    `args` uses the names of kunlun_stack_serving (tensor_parallel_size, dtype, ...);
    `device_count` is the number of accelerators a host has (expected or found).
    """
    problems = []
    rules = rules or {}

    gmu = _as_number(args.get("gpu_memory_utilization"))
    seqs = _as_number(args.get("max_num_seqs"))
    gmu_max = float(rules.get("gpu_memory_utilization_max", 0.8))
    from_seqs = float(rules.get("gpu_memory_utilization_max_applies_from_max_num_seqs", 256))
    if gmu is None or not 0 < gmu <= 1:
        problems.append(
            Problem(
                "gpu_memory_utilization",
                "%r is not a fraction in (0, 1]" % args.get("gpu_memory_utilization"),
                "use 0.75, the measured value",
            )
        )
    elif seqs is not None and seqs >= from_seqs and gmu > gmu_max:
        problems.append(
            Problem(
                "gpu_memory_utilization",
                "%s with max_num_seqs %d: the KV cache takes the memory the SSM state needs and "
                "requests run out of memory under load" % (args.get("gpu_memory_utilization"), seqs),
                "use at most %s (0.75 is the measured value) or lower max_num_seqs below %d" % (gmu_max, from_seqs),
            )
        )

    seqs_max = _as_number(rules.get("max_num_seqs_max", 1024))
    if seqs is None or seqs < 1 or seqs != int(seqs):
        problems.append(
            Problem("max_num_seqs", "%r is not a positive whole number" % args.get("max_num_seqs"), "use 256")
        )
    elif seqs_max is not None and seqs > seqs_max:
        problems.append(
            Problem(
                "max_num_seqs",
                "%d is above %d: vllm's warm-up fails" % (seqs, seqs_max),
                "use at most %d (256 is the measured value)" % seqs_max,
            )
        )

    mml = _as_number(args.get("max_model_len"))
    mml_max = _as_number(rules.get("max_model_len_max", 262144))
    if mml is None or mml < 1 or mml != int(mml):
        problems.append(
            Problem(
                "max_model_len", "%r is not a positive whole number" % args.get("max_model_len"), "use %d" % mml_max
            )
        )
    elif mml > mml_max:
        problems.append(
            Problem(
                "max_model_len",
                "%d is beyond the model's native %d (it would need YaRN rope scaling)" % (mml, mml_max),
                "use at most %d; contexts up to 256K are all that is needed" % mml_max,
            )
        )
    if args.get("rope_scaling"):
        problems.append(
            Problem(
                "rope_scaling",
                "set to %r: YaRN scaling to 1M must stay off" % (args.get("rope_scaling"),),
                "remove rope_scaling (leave it null)",
            )
        )

    tp = _as_number(args.get("tensor_parallel_size"))
    if tp is None or tp < 1 or tp != int(tp):
        problems.append(
            Problem(
                "tensor_parallel_size",
                "%r is not a positive whole number" % args.get("tensor_parallel_size"),
                "use %d" % device_count,
            )
        )
    elif device_count and (tp > device_count or device_count % int(tp)):
        problems.append(
            Problem(
                "tensor_parallel_size",
                "%d does not divide the %d accelerators of a host" % (tp, device_count),
                "use a divisor of %d (8 on a P800 server: one instance over all cards)" % device_count,
            )
        )

    for key in ("dtype", "mamba_ssm_cache_dtype"):
        want = rules.get(key)
        if want and args.get(key) != want:
            problems.append(
                Problem(
                    key, "%r, the model is validated only with %s" % (args.get(key), want), "set %s: %s" % (key, want)
                )
            )
    choices = rules.get("mamba_ssm_cache_dtype_choices")
    if choices and args.get("mamba_ssm_cache_dtype") not in choices:
        problems.append(
            Problem(
                "mamba_ssm_cache_dtype",
                "%r is not one of vllm's choices %s" % (args.get("mamba_ssm_cache_dtype"), ", ".join(choices)),
                "set it to float16",
            )
        )
    problems.extend(check_quantization(args, rules))
    return problems


def check_quantization(args, rules):
    """--quantization against the methods the pinned stack provides (rules'
    quantization_methods; none listed: not checked) and the ones it refuses unless
    allow_deprecated_quantization."""
    method = args.get("quantization")
    methods = [str(m) for m in rules.get("quantization_methods") or []]
    if method in (None, "", False) or not methods:
        return []
    method = str(method)
    if method not in methods:
        close = difflib.get_close_matches(method, methods, n=1, cutoff=0.5)
        return [
            Problem(
                "quantization",
                "%r is not a method the pinned stack provides (vllm's, with none added by vllm-kunlun): "
                "vllm refuses it when it starts" % method,
                "%sset quantization to the model's quant_method (one of %s)"
                % ("did you mean %s? " % close[0] if close else "", ", ".join(methods)),
            )
        ]
    if (
        method in [str(m) for m in rules.get("quantization_deprecated") or []]
        and args.get("allow_deprecated_quantization") is not True
    ):
        return [
            Problem(
                "quantization",
                "%r is deprecated in the pinned vllm: it refuses it at start without "
                "--allow-deprecated-quantization" % method,
                "use the model's quant_method, or set allow_deprecated_quantization: true",
            )
        ]
    return []


_VERSION_PART = re.compile(r"(\d+)")


def version_key(version):
    """A comparable key for dotted versions ('5.0.21.26' < '5.0.21.100'); '' -> ()."""
    return tuple(int(p) for p in _VERSION_PART.findall(str(version or "")))


def version_at_least(version, floor):
    """True when `version` is at least `floor`, comparing dotted numbers."""
    if not version:
        return False
    return version_key(version) >= version_key(floor)
