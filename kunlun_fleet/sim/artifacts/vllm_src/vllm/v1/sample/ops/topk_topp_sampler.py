# SPDX-License-Identifier: Apache-2.0
"""The sampler of the v1 engine (vllm/v1/sample/ops/topk_topp_sampler.py, TopKTopPSampler).

A platform plugin may replace this module with its own: vllm-kunlun's `register()` installs
an import hook that maps `vllm.v1.sample.ops.topk_topp_sampler` to
`vllm_kunlun.v1.sample.ops.topk_topp_sampler` (the public vLLM-Kunlun tree: its
`vllm_kunlun/__init__.py` module mappings). The engine imports it after the platform is
resolved (vllm.engine.pacing.Engine), so it gets the plugin's when there is one.

The stand-in's interface, what the engine asks of a sampler:

    forward(batch) -> [index, ...]
        once per engine step, over the sequences that emit a token in it: `batch` holds,
        per sequence, (logits, generated): the stand-in model's next-token logits, a list
        of (token, logit) with the most likely first (vllm.engine.pacing.Sequence.logits),
        and how many tokens the sequence has generated so far. Returns, per sequence, the
        index in its logits of the token sampled.
    runs_on_host
        False: the sampler runs on the accelerator with the model (its cost is part of the
        model's step). True: the logits go to the host and the CPU samples them: the engine
        paces every step with the CPU-sampler profile (the `slow` engine fault's pacing,
        vllm.engine.pacing.Pacing.capped at SLOW_TOKENS_PER_SECOND: 32 tok/s).

This one (vLLM's own, no plugin: the simulator run from its source tree) samples greedily
(the highest logit) on the device, the stand-in's deterministic decoding.
"""


class TopKTopPSampler:
    runs_on_host = False

    def forward(self, batch):
        return [0 for _logits, _generated in batch]
