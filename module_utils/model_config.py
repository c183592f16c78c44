# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks of a model directory's name and config.json against kunlun_stack_model.

`expected` is the kunlun_stack_model mapping of roles/kunlun_stack/defaults/main.yml
(name, directory, model_type, max_position_embeddings, dtype, quant_method). Every check
returns a list of Problems (the class of module_utils/kunlun_stack.py) naming the item,
what was found and the fix; nothing here raises on bad input. Pure functions apart from
reading config.json; standard library only (runs on managed hosts, Python 3.8+).

Where a field lives: flat configs carry everything at the top; Qwen3.5 multimodal-style
configs keep the language model's fields under `text_config`. A field is looked up at the
top first, then under `text_config`. Rope scaling is `rope_scaling` (transformers 4) or
`rope_parameters` with a `rope_type` other than "default" (transformers 5).
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re

from ansible.module_utils.kunlun_stack import Problem

__metaclass__ = type

CONFIG = "config.json"
_MISSING = object()


def _words(name):
    return sorted(w.lower() for w in re.split(r"[-_.]", name or "") if w)


def check_directory_name(name, expected):
    """Problems when `name` (a directory's base name) is not exactly expected['directory']."""
    want = str(expected.get("directory") or "")
    name = str(name or "")
    if name == want:
        return []
    if _words(name) == _words(want):
        found = "%r has the right words in the wrong order (%sthe directory is %r)" % (
            name,
            ("%r is the model's display name; " % expected["name"]) if expected.get("name") else "",
            want,
        )
    elif name and name.lower() in want.lower():
        found = "%r is a shortened form of %r" % (name, want)
    else:
        found = "%r is not the model directory %r" % (name, want)
    return [
        Problem(
            "model directory",
            found + ": vllm would not find the model and would try to download it from a hub (HFValidationError)",
            "use the directory name %s exactly (kunlun_stack_model.directory); do not set it in the inventory" % want,
        )
    ]


def _field(config, key):
    """(value, where) for a config field, top level first, then text_config."""
    if key in config:
        return config[key], key
    text = config.get("text_config")
    if isinstance(text, dict) and key in text:
        return text[key], "text_config.%s" % key
    return _MISSING, key


def _rope_problems(config, path):
    problems = []
    places = [("", config)]
    if isinstance(config.get("text_config"), dict):
        places.append(("text_config.", config["text_config"]))
    for prefix, section in places:
        scaling = section.get("rope_scaling")
        if scaling:
            kind = (scaling.get("rope_type") or scaling.get("type")) if isinstance(scaling, dict) else scaling
            problems.append(
                Problem(
                    "config.json %srope_scaling" % prefix,
                    "%s sets rope scaling %s (%s): YaRN to 1M contexts must stay off"
                    % (path, kind, json.dumps(scaling, sort_keys=True)),
                    "use the model's config.json as released (no rope_scaling; contexts up to 256K "
                    "are all that is needed), then restage the model",
                )
            )
        params = section.get("rope_parameters")
        if isinstance(params, dict):
            kind = params.get("rope_type") or params.get("type") or "default"
            if kind != "default" or params.get("factor") not in (None, 1, 1.0):
                problems.append(
                    Problem(
                        "config.json %srope_parameters" % prefix,
                        "%s sets rope_type %s (factor %s): rope scaling must stay off"
                        % (path, kind, params.get("factor")),
                        "use the model's config.json as released (rope_type default, no factor), then "
                        "restage the model",
                    )
                )
    return problems


def check_config(config, expected, path=CONFIG):
    """Problems of a parsed config.json (a dict) against `expected` (kunlun_stack_model)."""
    if not isinstance(config, dict):
        return [
            Problem(
                "config.json",
                "%s is not a JSON object" % path,
                "restage the model from the bundle (the file is damaged)",
            )
        ]
    problems = []
    restage = "stage the model %s from the bundle again (this is not its config.json)" % expected.get("name")

    want = expected.get("model_type")
    found, where = _field(config, "model_type")
    if want and found != want:
        problems.append(
            Problem(
                "config.json model_type",
                "%s says %s where %r is expected (another model, or another architecture)"
                % (path, "nothing" if found is _MISSING else repr(found), want),
                restage,
            )
        )

    want = expected.get("max_position_embeddings")
    found, where = _field(config, "max_position_embeddings")
    if want is not None and found != want:
        problems.append(
            Problem(
                "config.json %s" % where,
                "%s says %s where %s is expected (the serving max_model_len is built on it)"
                % (path, "nothing" if found is _MISSING else repr(found), want),
                "use the model's config.json as released (max_position_embeddings %s), then restage the model" % want,
            )
        )

    problems.extend(_rope_problems(config, path))

    want = expected.get("dtype")
    if want:
        dtypes = []
        for key in ("torch_dtype", "dtype"):
            found, where = _field(config, key)
            if found is not _MISSING and found is not None:
                dtypes.append((where, found))
        if not dtypes:
            problems.append(
                Problem(
                    "config.json dtype",
                    "%s has neither torch_dtype nor dtype" % path,
                    "use the model's config.json as released (dtype %s)" % want,
                )
            )
        for where, found in dtypes:
            if found != want:
                problems.append(
                    Problem(
                        "config.json %s" % where,
                        "%s says %r where %r is expected (vllm serves it with --dtype %s)" % (path, found, want, want),
                        "use the model's config.json as released (%s %s), then restage the model" % (where, want),
                    )
                )

    want = expected.get("quant_method")
    if want:
        quant = config.get("quantization_config")
        if not isinstance(quant, dict):
            text = config.get("text_config")
            quant = text.get("quantization_config") if isinstance(text, dict) else None
        if not isinstance(quant, dict):
            problems.append(
                Problem(
                    "config.json quantization_config",
                    "%s has no quantization_config (an unquantized "
                    "model does not fit the INT8 serving settings)" % path,
                    restage,
                )
            )
        elif quant.get("quant_method") != want:
            problems.append(
                Problem(
                    "config.json quantization_config.quant_method",
                    "%s says %r where %r is expected (vllm is started with --quantization %s)"
                    % (path, quant.get("quant_method"), want, want),
                    restage,
                )
            )
    return problems


def check_model_dir(model_dir, expected):
    """Problems of config.json in `model_dir` (missing, unreadable, not JSON, wrong values)."""
    path = os.path.join(model_dir, CONFIG)
    if not os.path.isdir(model_dir):
        return [
            Problem("model directory", "%s does not exist" % model_dir, "stage the model first (playbooks/model.yml)")
        ]
    if not os.path.isfile(path):
        return [
            Problem(
                "config.json",
                "%s is missing" % path,
                "stage the model %s from the bundle again (config.json is part of it)" % expected.get("name"),
            )
        ]
    try:
        with open(path, "rb") as handle:
            config = json.loads(handle.read().decode("utf-8"))
    except (IOError, OSError) as exc:
        return [
            Problem(
                "config.json",
                "%s cannot be read: %s" % (path, exc),
                "check the file's permissions, or restage the model",
            )
        ]
    except ValueError as exc:
        return [
            Problem(
                "config.json",
                "%s is not JSON: %s" % (path, exc),
                "restage the model from the bundle (the file is damaged)",
            )
        ]
    return check_config(config, expected, path)
