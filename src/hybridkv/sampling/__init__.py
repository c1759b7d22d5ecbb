"""A request's sampling parameters, torch-free and parsed at the boundary: ``SamplingParams``
(``params.py``, re-exported as ``hybridkv.SamplingParams``) with its value checks
(``checks.py``), the structured-output constraint (``structured.py``) and the llguidance
grammars that enforce it (``grammar.py``), ``kv_transfer_params`` (``transfer_params.py``) and
the ``Logprob`` records of an output (``logprobs.py``). Imports nothing else of hybridkv; the
runner's torch half (the sampler, logits processors) is ``hybridkv.model.sampling``. See
docs/sampling.md.
"""
