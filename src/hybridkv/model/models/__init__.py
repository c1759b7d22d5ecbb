"""One module per architecture; ``hybridkv.model.registry`` maps HF names to them."""
