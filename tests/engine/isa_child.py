"""Child of ``test_isa_batch_invariance.py``: in a process whose kernels are one instruction-set
variant (``HYBRIDKV_NATIVE_ISA``), greedy tokens of a few prompts run alone and inside a batch
of 32 mixed prompts of other lengths, printed as JSON ``{"alone": ..., "batched": ...}``."""

from __future__ import annotations

import json
import sys

import torch

from hybridkv import LLM, SamplingParams

WATCHED = (0, 9, 17, 31)  # prompts also run alone


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    lens = torch.randint(5, 300, (32,), generator=gen).tolist()
    return [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in lens]


def main(model_dir: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(model=model_dir, dtype="float32", kv_cache_memory="256MiB", max_num_seqs=32,
              enable_prefix_caching=False)  # fmt: skip
    batch = prompts()
    batched = [o.token_ids for o in llm.generate([{"prompt_token_ids": p} for p in batch], params)]
    alone = {
        i: llm.generate([{"prompt_token_ids": batch[i]}], params)[0].token_ids for i in WATCHED
    }
    print(json.dumps({"alone": alone, "batched": {i: batched[i] for i in WATCHED}}))


if __name__ == "__main__":
    main(sys.argv[1])
