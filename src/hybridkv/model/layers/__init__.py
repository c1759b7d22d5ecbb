"""Building blocks shared by the architectures: norms, RoPE, paged attention, Mamba2, Gated
DeltaNet, MLPs and MoE, and ``step_context.py``, the per-step tensors every layer reads (built
by ``hybridkv.model.step.step_builder``)."""
