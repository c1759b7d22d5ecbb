"""Checkpoints in and out: a directory (or an ``org/name`` in the local Hugging Face cache,
``hub.py``) becomes our model filled from its safetensors (``loader.py``; ``matmul.py`` decides
where a bfloat16 model multiplies) and a ``Tokenizer`` with its chat template
(``tokenizer.py``, ``chat_template.py``); ``make_model.py`` writes tiny random checkpoints of
every registered family with our own code (its tokenizer from ``tiny_tokenizer.py``).
"""
