"""Logits -> tokens, in the runner: the batched sampler (``sampler.py``) with its per-request
state (``sampling_state.py``), the batch's logits processors in vLLM's order
(``logits_batch.py`` over ``logits_process.py``), sampled-token logprobs
(``logprobs_compute.py``) and prompt logprobs chunk by chunk (``prompt_logprobs.py``).
See docs/sampling.md.
"""
