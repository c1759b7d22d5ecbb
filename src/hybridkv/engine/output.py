"""What a request returns to the user, and the per-request text state (stop strings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from hybridkv.request import Request, RequestStatus


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[float] | None = None


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
    """Decoded output text of one request; finds stop strings as tokens arrive."""

    prompt: str | None
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    logits: list[list[float]] = field(default_factory=list)

    def update(self, req: Request, tokenizer: Detokenizer) -> str | None:
        """Decode the output so far; return the stop string found, if any (text cut before it)."""
        self.text = tokenizer.decode(_visible_ids(req))
        for stop in req.sampling_params.stop:
            at = self.text.find(stop)
            if at != -1:
                self.text = self.text[:at]
                return stop
        return None


def _visible_ids(req: Request) -> list[int]:
    ids = req.output_token_ids
    if req.status is RequestStatus.FINISHED_STOPPED and ids and req.stop_reason == ids[-1]:
        return ids[:-1]  # the stop/eos token itself is not part of the text
    return ids


def make_output(req: Request, state: TextState, keep_logits: bool) -> RequestOutput:
    finished = req.status.is_finished
    reason = req.status.value if finished else None
    params = req.sampling_params
    completion = CompletionOutput(
        index=0,
        text=state.text,
        token_ids=req.output_token_ids,
        finish_reason=reason,
        stop_reason=req.stop_reason,
        logprobs=list(state.logprobs) if params.logprobs else None,
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
