"""``NixlConnector``: prefill/decode disaggregation over NIXL (pull mode).

A producer (prefill engine) keeps a finished prompt's KV for a consumer (decode engine) that
reads it with NIXL READs straight into its own cache, then notifies the producer, which frees.
See docs/disaggregation.md for the flow, the parameters and the failure behaviour.
"""
