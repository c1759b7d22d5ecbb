"""``hybridkv proxy``: an OpenAI-compatible router for prefill/decode disaggregated serving."""
