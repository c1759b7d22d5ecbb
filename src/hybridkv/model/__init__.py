"""Model side of hybridkv: Hugging Face checkpoints run on the paged cache.

One folder per concept, in the order a checkpoint travels: ``config/`` (config.json ->
the frozen ``ModelConfig``), ``families/`` (one torch-free ``ModelFamily`` descriptor per
supported family: the registry the loader, ``make-model`` and the CLI read), ``loading/``
(weights, tokenizer and chat template in; tiny random checkpoints out), ``models/`` (one file
per architecture) built from ``layers/``, ``step/`` (the ``ModelRunner`` and the tensors it
builds once per step) and ``sampling/`` (logits -> tokens and logprobs). Nothing is
re-exported here, so importing a torch-free module (``families``, ``config.layer_kinds``)
stays torch-free.
"""
