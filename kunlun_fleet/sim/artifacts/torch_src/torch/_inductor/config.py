"""Inductor configuration (PyTorch 2.5.1)."""

debug = False
max_autotune = False
max_autotune_gemm_backends = "ATEN,TRITON,CPP"
triton_cudagraphs = True
fallback_random = False
cpp_wrapper = False
freezing = False
