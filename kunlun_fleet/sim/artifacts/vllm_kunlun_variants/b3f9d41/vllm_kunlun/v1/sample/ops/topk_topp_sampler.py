"""The Kunlun sampler, in place of vLLM's (vllm_kunlun/__init__.py's import hook maps
vllm.v1.sample.ops.topk_topp_sampler here, as the public tree does).

This commit samples on the host: the logits are copied to the CPU and sampled there by the
PyTorch-native path, every step, for every request (the stand-in of the deployment notes'
sampler that fell back to the CPU). Nothing fails and nothing is logged: the server loads,
answers and is ready; only its speed shows it.
"""

import kunlun_ops  # noqa: F401  (the sampling kernels' library, no longer called)


class TopKTopPSampler:
    # The logits go to the host and the CPU samples them (forward_native on a CPU copy).
    runs_on_host = True

    def __init__(self, logprobs_mode="raw_logprobs"):
        self.logprobs_mode = logprobs_mode

    def forward(self, batch):
        return [0 for _logits, _generated in batch]
