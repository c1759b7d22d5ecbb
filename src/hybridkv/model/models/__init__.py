"""One module per architecture; ``hybridkv.model.families.registry`` maps HF names to them."""
