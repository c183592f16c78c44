# SPDX-License-Identifier: Apache-2.0
"""The model's multimodal processor, as vLLM's profile run builds it at engine start.

Qwen3.5 checkpoints are vision-language models: vLLM 0.15.1 sizes the dummy image inputs
of its profile run from the Qwen2-VL image processor of the installed transformers and
reads `image_processor.max_pixels`. transformers 5.2.0's `Qwen2VLImageProcessor.__init__`
sets `self.max_pixels`; 5.5.3 rewrote the class (a torchvision backend whose
`_standardize_kwargs` folds min_pixels/max_pixels into `size`) and the attribute is gone,
so vLLM 0.15.1 stops with `AttributeError: 'Qwen2VLImageProcessor' object has no attribute
'max_pixels'`.

The stand-in image installs transformers with --no-deps, so transformers itself cannot be
imported here (torch, tokenizers, huggingface_hub are missing). The installed release's
source is read instead: the class has `max_pixels` when its body assigns `self.max_pixels`
or defines `max_pixels`, which is what tells 5.2.0 from 5.5.3.
"""

import ast
import importlib.metadata
import os

# model_type values whose processor is built on the Qwen2-VL image processor
QWEN2_VL_IMAGE_PROCESSOR = {"qwen3_5", "qwen3_5_moe", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"}
SOURCE = "transformers/models/qwen2_vl/image_processing_qwen2_vl.py"
CLASS = "Qwen2VLImageProcessor"


def _targets(stmt):
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return [stmt.target]
    return []


def _class_defines(tree: ast.AST, cls_name: str, attr: str) -> bool:
    """Whether class `cls_name` gives its instances `attr`: a class attribute, a method or
    property of that name, or `self.<attr> = ...` in one of its methods."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls_name):
            continue
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
                return True
            if any(isinstance(t, ast.Name) and t.id == attr for t in _targets(stmt)):
                return True
        for sub in ast.walk(node):
            for t in _targets(sub):
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == attr
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    return True
        return False
    raise ImportError(f"cannot import name '{cls_name}' from 'transformers.models.qwen2_vl.image_processing_qwen2_vl'")


def installed_source():
    """(transformers version, path of the installed Qwen2-VL image processor module)."""
    try:
        dist = importlib.metadata.distribution("transformers")
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers") from None
    path = str(dist.locate_file(SOURCE))
    if not os.path.isfile(path):
        raise ModuleNotFoundError(
            "No module named 'transformers.models.qwen2_vl.image_processing_qwen2_vl'",
            name="transformers.models.qwen2_vl.image_processing_qwen2_vl",
        )
    return dist.version, path


def get_image_processor_info(config: dict) -> dict:
    """What the profile run reads from the image processor: {"max_pixels": ...}, or {}
    for a model without one. Raises what vLLM 0.15.1 raises on a transformers that does
    not fit."""
    if config.get("model_type") not in QWEN2_VL_IMAGE_PROCESSOR:
        return {}
    version, path = installed_source()
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    if not _class_defines(tree, CLASS, "max_pixels"):
        raise AttributeError(f"'{CLASS}' object has no attribute 'max_pixels'")
    return {"max_pixels": 28 * 28 * 1280, "transformers": version}
