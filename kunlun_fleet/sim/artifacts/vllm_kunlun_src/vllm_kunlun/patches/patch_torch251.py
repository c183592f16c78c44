"""Stand-in of vLLM-Kunlun's patch_torch251.py (0.15.1 era): source fixes applied in
site-packages after install, so that the stack runs on xpytorch 2.5.1.

Usage:
    python patch_torch251.py           # apply every patch
    python patch_torch251.py --dry-run # say what would change, change nothing
    python patch_torch251.py --revert  # put back every patched file from its .bak copy

Each patch replaces one exact piece of code in a file under site-packages. A piece already
replaced counts as skipped, one that is not there (or a file that is missing) as failed.
What it prints and its exit status follow the vendor's script (artifacts/README.md): a
banner between lines of 64 "=", a block per patch, then the results line
"  Results: N applied  |  N skipped  |  N failed  |  N total", the .bak notes when anything
was applied, a last line of 64 "=", and exit status 1 when any patch failed. The pieces
are the stand-in torch's (torch_src/); the vendor's patch vLLM 0.15.1's own files.
"""

import importlib.util
import os
import shutil
import site
import sys


def _site_packages():
    """The directory the patched files are relative to: the one torch is installed in (the
    vendor's takes the interpreter's first site-packages, which is the same directory in the
    image's venv)."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(spec.origin))
    try:
        found = site.getsitepackages()
    except Exception:
        found = []
    return found[0] if found else sys.prefix


SITE_PACKAGES = _site_packages()

# file: relative to SITE_PACKAGES; lines: where the piece is (for the reader only);
# count: occurrences to replace (default 1, 0 for all). A file's import patch comes before
# the patch that needs it.
PATCHES = [
    {
        "file": "torch/cuda/__init__.py",
        "desc": "Skip the CUDA capability check: an XPU has no CUDA compute capability to query.",
        "lines": "19",
        "old": '    raise RuntimeError("CUDA capability check is not available on this device")\n',
        "new": "    return None  # XPU: no CUDA capability to check\n",
    },
    {
        "file": "torch/cuda/__init__.py",
        "desc": "Say where the device name comes from (torch_xmlir).",
        "lines": "4",
        "old": '_device_name = "P800 OAM"\n',
        "new": '_device_name = "P800 OAM"  # reported through torch_xmlir\n',
    },
    {
        "file": "torch/cuda/graphs.py",
        "desc": "Report no stream capture: XPU graphs are captured by XMLIR, never by a CUDA stream.",
        "lines": "9",
        "old": '    raise RuntimeError("stream capture query is not supported by the XPU runtime")\n',
        "new": "    return False  # XPU graphs are captured by XMLIR, never by a CUDA stream\n",
    },
    {
        "file": "torch/_inductor/config.py",
        "desc": "Autotune GEMMs with ATen only (no Triton or C++ templates on the XPU).",
        "lines": "4",
        "old": 'max_autotune_gemm_backends = "ATEN,TRITON,CPP"\n',
        "new": 'max_autotune_gemm_backends = "ATEN"\n',
    },
    {
        "file": "torch/_inductor/config.py",
        "desc": "Turn off Triton CUDA graphs.",
        "lines": "5",
        "old": "triton_cudagraphs = True\n",
        "new": "triton_cudagraphs = False\n",
    },
    {
        "file": "torch/distributed/distributed_c10d.py",
        "desc": "Report nccl as available: XCCL (libbkcl) answers to the nccl name.",
        "lines": "5-6",
        "old": "def is_nccl_available() -> bool:\n    return False\n",
        "new": "def is_nccl_available() -> bool:\n    return True  # XCCL (libbkcl) behind the nccl name\n",
    },
    {
        "file": "torch/distributed/distributed_c10d.py",
        "desc": "Make nccl (XCCL) the default process-group backend.",
        "lines": "2",
        "old": '_default_backend = "gloo"\n',
        "new": '_default_backend = "nccl"\n',
    },
    {
        "file": "torch/utils/_triton.py",
        "desc": "Tell torch that the device runs no upstream Triton: Kunlun's triton is driven by kunlun_ops.",
        "lines": "19-20",
        "old": "def _device_supports_triton() -> bool:\n    return True\n",
        "new": "def _device_supports_triton() -> bool:\n"
        "    return False  # Kunlun triton 3.0.0+b2cde523 is driven by kunlun_ops\n",
    },
    {
        "file": "torch/_ops.py",
        "desc": "Import os (needed by the next patch).",
        "lines": "1-4",
        "old": '"""Operator registry (PyTorch 2.5.1)."""\n\n\nclass OpOverloadPacket:',
        "new": '"""Operator registry (PyTorch 2.5.1)."""\nimport os\n\n\nclass OpOverloadPacket:',
    },
    {
        "file": "torch/_ops.py",
        "desc": "Record loaded operator libraries by their real path (a library is not loaded twice through a link).",
        "lines": "17",
        "old": "        self.loaded_libraries.add(path)\n",
        "new": "        self.loaded_libraries.add(os.path.realpath(path))\n",
    },
    {
        "file": "torch/nn/functional.py",
        "desc": "Point scaled_dot_product_attention at the Kunlun attention backend.",
        "lines": "10",
        "old": '    raise NotImplementedError("scaled_dot_product_attention: no kernel for this device")\n',
        "new": "    from vllm_kunlun import _kunlun  # noqa: F401  (XPU attention lives in kunlun_ops)\n"
        '    raise NotImplementedError("scaled_dot_product_attention: use the Kunlun attention backend")\n',
    },
]


def get_full_path(relative_path):
    return os.path.join(SITE_PACKAGES, relative_path)


def apply_patch(patch, dry_run=False):
    """One patch: "success", "skipped" or "failed"."""
    file_path = get_full_path(patch["file"])
    count = patch.get("count", 1)
    print("\n%sPatch: %s (lines %s)" % ("[DRY RUN] " if dry_run else "", patch["file"], patch["lines"]))
    print("  Description: %s" % patch["desc"])
    try:
        with open(file_path, "r", encoding="utf-8") as fh:
            content = fh.read()
    except FileNotFoundError:
        print("  FAIL: File not found: %s" % file_path)
        return "failed"
    if patch["new"] in content and patch["old"] not in content:
        print("  SKIP: Already patched.")
        return "skipped"
    if patch["old"] not in content:
        print("  FAIL: Original code not found. The file may have been modified or the vLLM version may differ.")
        return "failed"
    found = content.count(patch["old"])
    replacements = found if count == 0 else min(count, found)
    print("  Found %d occurrence(s), will replace %s." % (found, "all" if count == 0 else replacements))
    if dry_run:
        print("  OK: Would apply patch.")
        return "success"
    backup_path = file_path + ".bak"
    if not os.path.exists(backup_path):
        shutil.copy2(file_path, backup_path)
        print("  Backup created: %s" % backup_path)
    else:
        print("  Backup already exists, not overwriting: %s" % backup_path)
    if count == 0:
        content = content.replace(patch["old"], patch["new"])
    else:
        content = content.replace(patch["old"], patch["new"], count)
    with open(file_path, "w", encoding="utf-8") as fh:
        fh.write(content)
    print("  SUCCESS: Patch applied (%d replacement(s))." % replacements)
    return "success"


def revert_all():
    print("=" * 64)
    print("  Reverting all patches from .bak backups")
    print("=" * 64)
    seen = set()
    for patch in PATCHES:
        file_path = get_full_path(patch["file"])
        if file_path in seen:
            continue
        seen.add(file_path)
        backup_path = file_path + ".bak"
        if os.path.exists(backup_path):
            shutil.copy2(backup_path, file_path)
            print("  Restored: %s" % file_path)
        else:
            print("  No backup found for: %s" % file_path)
    print("\nRevert complete.")


def main():
    dry_run = "--dry-run" in sys.argv
    if "--revert" in sys.argv:
        revert_all()
        return
    print("=" * 64)
    print("  vLLM Compatibility Patch for PyTorch 2.5.1")
    print("  Total patches: %d" % len(PATCHES))
    if dry_run:
        print("  Mode: DRY RUN (no files will be modified)")
    print("")
    print("  NOTE: These patches are TEMPORARY. Remove them after")
    print("        upgrading to PyTorch 2.9+.")
    print("=" * 64)
    results = {"success": 0, "skipped": 0, "failed": 0}
    for patch in PATCHES:
        results[apply_patch(patch, dry_run=dry_run)] += 1
    print("\n" + "=" * 64)
    print(
        "  Results: %d applied  |  %d skipped  |  %d failed  |  %d total"
        % (results["success"], results["skipped"], results["failed"], len(PATCHES))
    )
    if not dry_run and results["success"] > 0:
        print("  Original files backed up as .bak")
        print("  To revert: python patch_torch251.py --revert")
    print("=" * 64)
    if results["failed"] > 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
