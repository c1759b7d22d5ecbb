"""GGUF files (llama.cpp's format) read as a model: ``file.py`` opens one, ``config*.py`` turn
its metadata into the ``config.json`` transformers would write, ``sources*.py`` and
``rewrites.py`` undo the converter's tensor rewrites per family, ``weights.py`` keeps the
quantized blocks as they are, ``tokenizer.py`` rebuilds the tokenizer, ``view.py`` shows it
all as a checkpoint directory."""
