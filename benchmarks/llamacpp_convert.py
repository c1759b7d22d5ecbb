"""Run llama.cpp's ``convert_hf_to_gguf.py`` on a ``make-model`` checkpoint.

    python benchmarks/llamacpp_convert.py LLAMA_SRC CHECKPOINT --outtype f32 --outfile X.gguf

The converter names a byte-level BPE tokenizer's split rule (``tokenizer.ggml.pre``) by
looking up a hash of how it tokenizes a test text in a table of known Hub models, and stops
on any other tokenizer. make-model's tokenizer is trained here (``tiny_tokenizer.py``) with
GPT-2's byte-level split, so an unknown hash is answered "gpt-2" (the table's name for that
split); everything else is the converter's own code, run as it is from LLAMA_SRC (the source
tree ``setup_llamacpp_baseline.sh`` unpacked), with its own ``gguf-py``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

GPT2_SPLIT = "gpt-2"


def main() -> None:
    src = Path(sys.argv[1]).resolve()
    converter = src / "convert_hf_to_gguf.py"
    sys.argv = [str(converter), *sys.argv[2:]]
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    from conversion.base import TextModel  # the converter's package, from LLAMA_SRC

    known = TextModel.get_vocab_base_pre

    def pre_tokenizer(self: Any, tokenizer: Any) -> str:
        try:
            return str(known(self, tokenizer))
        except NotImplementedError:  # not a Hub model's hash: our GPT-2 split tokenizer
            return GPT2_SPLIT

    TextModel.get_vocab_base_pre = pre_tokenizer  # type: ignore[method-assign]
    runpy.run_path(str(converter), run_name="__main__")


if __name__ == "__main__":
    main()
