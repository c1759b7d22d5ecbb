"""Building blocks shared by the architectures: norms, RoPE, paged attention, Mamba2, MLPs."""
