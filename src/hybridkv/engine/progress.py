"""The offline progress bar: requests done, and input and output tokens per second (vLLM's
``est. speed input: ... toks/s, output: ... toks/s``)."""

from __future__ import annotations

import time

from tqdm import tqdm

from hybridkv.engine.output import RequestOutput


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = tqdm(
            total=total,
            desc="Processed prompts",
            unit="req",
            dynamic_ncols=True,
            disable=not enabled or total == 0,
        )
        self._start = time.perf_counter()
        self.input_tokens = 0
        self.output_tokens = 0

    def finished(self, out: RequestOutput) -> None:
        self.input_tokens += out.num_prompt_tokens
        self.output_tokens += sum(len(c.token_ids) for c in out.outputs)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.postfix = (
            f"est. speed input: {self.input_tokens / elapsed:.2f} toks/s, "
            f"output: {self.output_tokens / elapsed:.2f} toks/s"
        )
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
