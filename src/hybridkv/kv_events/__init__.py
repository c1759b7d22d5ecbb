"""KV cache events in vLLM's wire format: the schema, the ZMQ publisher, the per-step collector."""
