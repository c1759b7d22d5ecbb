"""One module per architecture family, the ``nn.Module`` classes built from ``layers/``; each
family's torch-free descriptor (``hybridkv.model.families``) maps config.json's architecture
names to the classes here."""
