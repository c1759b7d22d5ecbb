"""A checkpoint's ``config.json`` read into our own frozen ``ModelConfig`` (no transformers).

``model_config.py`` holds ``ModelConfig`` and ``build_model_config`` (from a parsed file);
the parts beside it: ``json_fields.py`` (reading the JSON files, typed field access naming a
bad key), ``layer_kinds.py`` (``LayerKind`` from every spelling the Hub has used),
``mamba.py`` and ``gdn.py`` (Mamba2 and Gated DeltaNet sizes), ``rope.py`` (RoPE parameters)
and ``errors.py`` (``ModelLoadError``, raised by everything that reads a checkpoint).
"""
