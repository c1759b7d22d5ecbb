"""What a request returns to the user, and the per-request text state the engine keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.engine.detokenizer import IncrementalDetokenizer
from hybridkv.request import Request, RequestStatus


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[float] | None = None
    stable_text_len: int | None = None  # chars of ``text`` no later output changes (None: all)


@dataclass(slots=True)
class RequestOutput:
    """vLLM-shaped: ``out.outputs[0].text``; the shortcuts ``text``, ``token_ids``,
    ``finish_reason`` read the first completion."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_prompt_tokens: int
    cached_tokens: dict[str, int] = field(default_factory=dict)  # by source: local, cpu, disk...
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    logits: list[list[float]] | None = None  # per generated token, only if the engine keeps them
    kv_transfer_params: dict[str, object] | None = None  # the connector's, once finished

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def num_cached_tokens(self) -> int:
        return sum(self.cached_tokens.values())


@dataclass(slots=True)
class TextState:
    """One request's output text (its detokenizer, which owns the stop strings), logprobs and
    logits, beside the scheduler's ``Request``."""

    prompt: str | None
    detok: IncrementalDetokenizer
    logprobs: list[float] = field(default_factory=list)
    logits: list[list[float]] = field(default_factory=list)

    def update(self, req: Request) -> str | None:
        """Feed the output tokens the detokenizer has not seen; return the stop string found,
        if any (text cut before it)."""
        start = req.num_prompt_tokens + self.detok.num_tokens
        ids = req.all_token_ids[start:]  # the new tokens only: O(1) per step
        if req.status is RequestStatus.FINISHED_STOPPED and ids and req.stop_reason == ids[-1]:
            ids = ids[:-1]  # the stop/eos token itself is not part of the text
        return self.detok.update(ids)


def make_output(req: Request, state: TextState, keep_logits: bool) -> RequestOutput:
    finished = req.status.is_finished
    reason = req.status.value if finished else None
    params = req.sampling_params
    completion = CompletionOutput(
        index=0,
        text=state.detok.text,
        token_ids=req.output_token_ids,
        finish_reason=reason,
        stop_reason=req.stop_reason,
        logprobs=list(state.logprobs) if params.logprobs is not None else None,
        stable_text_len=state.detok.stable_length(finished),
    )
    metrics = {}
    if req.first_token_time is not None:
        metrics["ttft_s"] = req.first_token_time - req.arrival_time
    return RequestOutput(
        request_id=req.request_id,
        prompt=state.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=[completion],
        finished=finished,
        num_prompt_tokens=req.num_prompt_tokens,
        cached_tokens=dict(req.cached_tokens),
        error=req.error,
        metrics=metrics,
        logits=list(state.logits) if keep_logits else None,
        kv_transfer_params=req.kv_transfer_params if finished else None,
    )


def error_output(
    request_id: str, prompt: str | None, prompt_ids: list[int], message: str
) -> RequestOutput:
    """The output of a request rejected before it ran (bad prompt or parameters)."""
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=prompt_ids,
        outputs=[CompletionOutput(0, "", [], RequestStatus.FINISHED_ERROR.value)],
        finished=True,
        num_prompt_tokens=len(prompt_ids),
        error=message,
    )
