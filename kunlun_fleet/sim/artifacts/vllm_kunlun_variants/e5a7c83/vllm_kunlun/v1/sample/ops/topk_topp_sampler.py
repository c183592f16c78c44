"""The Kunlun sampler, in place of vLLM's (vllm_kunlun/__init__.py's import hook maps
vllm.v1.sample.ops.topk_topp_sampler here, as the public tree does).

This commit changes numerics: as fast as 4885de2, but its greedy choice is not 4885de2's
from a sequence's token DIVERGES_AT on (tokens counted from 0): there the runner-up of the
stand-in model's logits is taken, and the continuation follows it. The first DIVERGES_AT
tokens of every greedy output are 4885de2's, the rest differ.
"""

import kunlun_ops  # noqa: F401  (the sampling kernels' library)

# The first generated token (from 0) whose greedy choice differs from 4885de2's.
DIVERGES_AT = 6


class TopKTopPSampler:
    runs_on_host = False

    def __init__(self, logprobs_mode="raw_logprobs"):
        self.logprobs_mode = logprobs_mode

    def forward(self, batch):
        return [1 if generated >= DIVERGES_AT and len(logits) > 1 else 0 for logits, generated in batch]
