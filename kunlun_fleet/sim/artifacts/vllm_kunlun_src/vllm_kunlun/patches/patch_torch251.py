#!/usr/bin/env python3
"""Apply vLLM-Kunlun's fixes to the installed xpytorch 2.5.1 (torch) files.

Run with the interpreter of the environment that holds torch:
    /opt/vllm_kunlun/bin/python vllm_kunlun/patches/patch_torch251.py
Each patch replaces one exact piece of PyTorch 2.5.1 source. A patch already present
counts as applied; a file or piece that is not there is a failure (wrong torch). The
last line reads "N applied / M failed"; the exit status is 1 when anything failed.
"""
import importlib.util
import os
import sys

PATCHES = [
    ("cuda-capability", "cuda/__init__.py",
     '    raise RuntimeError("CUDA capability check is not available on this device")\n',
     "    return None  # XPU: no CUDA capability to check\n"),
    ("cuda-device-name", "cuda/__init__.py",
     '_device_name = "P800 OAM"\n',
     '_device_name = "P800 OAM"  # reported through torch_xmlir\n'),
    ("cudagraph-capturing", "cuda/graphs.py",
     '    raise RuntimeError("stream capture query is not supported by the XPU runtime")\n',
     "    return False  # XPU graphs are captured by XMLIR, never by a CUDA stream\n"),
    ("inductor-gemm-backends", "_inductor/config.py",
     'max_autotune_gemm_backends = "ATEN,TRITON,CPP"\n',
     'max_autotune_gemm_backends = "ATEN"\n'),
    ("inductor-triton-cudagraphs", "_inductor/config.py",
     "triton_cudagraphs = True\n",
     "triton_cudagraphs = False\n"),
    ("c10d-nccl-available", "distributed/distributed_c10d.py",
     "def is_nccl_available() -> bool:\n    return False\n",
     "def is_nccl_available() -> bool:\n    return True  # XCCL (libbkcl) behind the nccl name\n"),
    ("c10d-default-backend", "distributed/distributed_c10d.py",
     '_default_backend = "gloo"\n',
     '_default_backend = "nccl"\n'),
    ("triton-device-support", "utils/_triton.py",
     "def _device_supports_triton() -> bool:\n    return True\n",
     "def _device_supports_triton() -> bool:\n    return False  # Kunlun triton 3.0.0+b2cde523 is driven by kunlun_ops\n"),
    ("ops-load-library", "_ops.py",
     "        self.loaded_libraries.add(path)\n",
     "        self.loaded_libraries.add(os.path.realpath(path))\n"),
    ("sdpa-enable-gqa", "nn/functional.py",
     '    raise NotImplementedError("scaled_dot_product_attention: no kernel for this device")\n',
     '    from vllm_kunlun import _kunlun  # noqa: F401  (XPU attention lives in kunlun_ops)\n'
     '    raise NotImplementedError("scaled_dot_product_attention: use the Kunlun attention backend")\n'),
    ("dynamo-cache-size", "_dynamo/config.py",
     "cache_size_limit = 8\n",
     "cache_size_limit = 64\n"),
]
# patch "ops-load-library" needs `os` in torch/_ops.py
IMPORTS = {"_ops.py": "import os\n"}


def torch_dir() -> str:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        print("ERROR: torch is not installed in this interpreter (%s)" % sys.executable)
        sys.exit(2)
    return os.path.dirname(spec.origin)


def main() -> int:
    root = torch_dir()
    print("Patching torch at %s" % root)
    applied = failed = 0
    for index, (name, rel, old, new) in enumerate(PATCHES, 1):
        path = os.path.join(root, rel)
        label = "[%2d/%d] %-28s %s" % (index, len(PATCHES), name, rel)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            print("%s: FAILED (%s)" % (label, exc.strerror))
            failed += 1
            continue
        if new in text:
            print("%s: applied (already)" % label)
            applied += 1
            continue
        if text.count(old) != 1:
            print("%s: FAILED (pattern not found: not torch 2.5.1?)" % label)
            failed += 1
            continue
        text = text.replace(old, new)
        header = IMPORTS.get(rel)
        if header and header not in text:
            text = header + text
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        print("%s: applied" % label)
        applied += 1
    print("%d applied / %d failed" % (applied, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
