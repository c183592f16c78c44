"""Maintainer tool: extract vllm 0.15.1's api_server flag table from vllm's own source.

Not used at build time. The stand-in's flag table
(vllm_src/vllm/entrypoints/openai/_flag_table.py) was generated with it:

    pip download --no-deps vllm==0.15.1 -d /tmp/vllmwheel
    mkdir /tmp/vsrc && cd /tmp/vsrc && unzip -q /tmp/vllmwheel/vllm-0.15.1-*.whl 'vllm/*.py'
    python3 extract_vllm_flags.py /tmp/vsrc > flags.json
    python3 extract_vllm_flags.py /tmp/vsrc --python > ../vllm_src/vllm/entrypoints/openai/_flag_table.py

It reads EngineArgs.add_cli_args / make_arg_parser (flags, short aliases) and the config
dataclasses (types, Literal choices) with the ast module, without importing vllm.
"""

import ast
import json
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/vsrc")
# Literal aliases across the tree
aliases = {}
for p in root.rglob("*.py"):
    try:
        t = ast.parse(p.read_text())
    except Exception:
        continue
    for n in t.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            v = n.value
            if isinstance(v, ast.Subscript) and getattr(v.value, "id", None) == "Literal":
                s = v.slice
                elts = s.elts if isinstance(s, ast.Tuple) else [s]
                if all(isinstance(e, ast.Constant) for e in elts):
                    aliases.setdefault(n.targets[0].id, [e.value for e in elts])
# config class fields: class name -> field -> annotation node
classes = {}
for p in list(root.glob("vllm/config/*.py")) + [
    root / "vllm/entrypoints/openai/cli_args.py",
    root / "vllm/engine/arg_utils.py",
]:
    t = ast.parse(p.read_text())
    for n in ast.walk(t):
        if isinstance(n, ast.ClassDef):
            f = classes.setdefault(n.name, {})
            for b in n.body:
                if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                    f[b.target.id] = b.annotation


def kind(ann):
    src = ast.unparse(ann)
    parts = [x.strip() for x in re.split(r"\|", src)] if not src.startswith("Literal") else [src]
    lits = []
    for part in parts:
        if part.startswith("Literal["):
            lits += ast.literal_eval("[" + part[8:-1] + "]")
        elif part in aliases:
            lits += aliases[part]
    if "bool" in parts:
        return {"kind": "bool"}
    if lits and all(isinstance(x, str) for x in lits):
        return {"kind": "choice", "choices": lits}
    if any(p.startswith(("list[", "List[")) for p in parts):
        return {"kind": "list"}
    if parts[0] in ("int",):
        return {"kind": "int"}
    if parts[0] in ("float",):
        return {"kind": "float"}
    if parts[0].startswith("dict") or parts[0][0].isupper():
        return {"kind": "json", "ann": src}
    return {"kind": "str", "ann": src}


out = {}


def scan(fn_node, kwmap):
    for n in ast.walk(fn_node):
        if (
            isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "id", None) == "get_kwargs"
        ):
            a = n.value.args[0]
            kwmap[n.targets[0].id] = a.id if isinstance(a, ast.Name) else ast.unparse(a)
    for n in ast.walk(fn_node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument":
            flags = [a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not flags:
                continue
            info = None
            for kw in n.keywords:
                v = kw.value
                if kw.arg is None and isinstance(v, ast.Dict):
                    for k2, v2 in zip(v.keys, v.values, strict=True):
                        if k2 is None and isinstance(v2, ast.Subscript):
                            v = v2
                if kw.arg is None and isinstance(v, ast.Subscript):
                    d = v.value.id
                    field = v.slice.value
                    cls = kwmap.get(d)
                    ann = classes.get(cls, {}).get(field)
                    info = kind(ann) if ann is not None else {"kind": "str", "note": f"{cls}.{field}?"}
            kws = {kw.arg: kw.value for kw in n.keywords if kw.arg}
            if info is None:
                act = kws.get("action")
                act = ast.unparse(act) if act is not None else ""
                if "store_true" in act:
                    info = {"kind": "store_true"}
                elif "BooleanOptional" in act:
                    info = {"kind": "bool"}
                elif "choices" in kws:
                    try:
                        info = {"kind": "choice", "choices": ast.literal_eval(kws["choices"])}
                    except Exception:
                        info = {"kind": "str"}
                else:
                    ty = ast.unparse(kws["type"]) if "type" in kws else "str"
                    info = {"kind": "int" if ty == "int" else "float" if ty == "float" else "str"}
                if "nargs" in kws:
                    info["nargs"] = ast.unparse(kws["nargs"])
            if "deprecated" in kws:
                info["deprecated"] = True
            long = [f for f in flags if f.startswith("--")]
            out[long[0] if long else flags[0]] = dict(info, aliases=[f for f in flags if f not in long[:1]])


t = ast.parse((root / "vllm/engine/arg_utils.py").read_text())
for n in ast.walk(t):
    if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args":
        scan(n, {})
# frontend: every field of FrontendArgs
for f, ann in classes["FrontendArgs"].items():
    out["--" + f.replace("_", "-")] = dict(kind(ann), aliases=[])
t = ast.parse((root / "vllm/entrypoints/openai/cli_args.py").read_text())
for n in ast.walk(t):
    if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser":
        scan(n, {})
if "--python" in sys.argv:
    print('"""vllm 0.15.1 api_server flags (generated by tools/extract_vllm_flags.py from vllm 0.15.1)."""')
    print("# flag: (kind, choices, aliases, extra)  kind in bool/store_true/int/float/str/json/list/choice")
    print("FLAGS = {")
    for k in sorted(out):
        v = out[k]
        extra = {x: v[x] for x in ("nargs", "deprecated") if x in v}
        print(f"    {k!r}: ({v['kind']!r}, {tuple(v.get('choices', ()))!r}, {tuple(v['aliases'])!r}, {extra!r}),")
    print("}")
else:
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
