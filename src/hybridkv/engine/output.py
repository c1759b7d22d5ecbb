"""What a request returns to the user, and the per-request text state the engine keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.engine.detokenizer import Decoder, IncrementalDetokenizer
from hybridkv.request import Request, RequestStatus
from hybridkv.sampling.logprobs import Logprob, PromptLogprobs, SampleLogprobs, TokenLogprobs
from hybridkv.step_io import PositionLogprobs, PromptLogprobsChunk


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: SampleLogprobs | None = None  # per token: {id: Logprob} (chosen + top k)
    stable_text_len: int | None = None  # chars of ``text`` no later output changes (None: all)
    cumulative_logprob: float | None = None  # sum of the chosen tokens' logprobs

    def finished(self) -> bool:
        return self.finish_reason is not None


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
    client_error: bool = False  # ``error`` is the request's own fault (HTTP 400), not the engine's
    metrics: dict[str, float] = field(default_factory=dict)
    logits: list[list[float]] | None = None  # per generated token, only if the engine keeps them
    kv_transfer_params: dict[str, object] | None = None  # the connector's, once finished
    prompt_logprobs: PromptLogprobs | None = None  # per prompt token, None first (as vLLM)
    # the last KV event batch published before this output (events on): it covers the
    # request's blocks so far (``usage.kv_events_seq``, docs/kv_events.md)
    kv_events_seq: int | None = None

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
    logprobs: SampleLogprobs = field(default_factory=list)
    cumulative_logprob: float = 0.0
    prompt_logprobs: PromptLogprobs | None = None  # sized to the prompt when asked for
    logits: list[list[float]] = field(default_factory=list)

    @classmethod
    def create(cls, req: Request, prompt: str | None, decoder: Decoder) -> TextState:
        """A new request's text state: its detokenizer with the request's stop strings and
        options, its prompt logprobs sized to the prompt when asked for."""
        params = req.sampling_params
        detok = IncrementalDetokenizer(
            decoder,
            params.stop,
            skip_special_tokens=params.skip_special_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        state = cls(prompt, detok)
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None] * req.num_prompt_tokens
        return state

    def update(self, req: Request) -> str | None:
        """Feed the output tokens the detokenizer has not seen; return the stop string found,
        if any (text cut before it)."""
        params = req.sampling_params
        start = req.num_prompt_tokens + self.detok.num_tokens
        ids = req.all_token_ids[start:]  # the new tokens only: O(1) per step
        on_token = (
            req.status is RequestStatus.FINISHED_STOPPED and ids and req.stop_reason == ids[-1]
        )
        if on_token and not params.include_stop_str_in_output:
            ids = ids[:-1]  # the stop/eos token itself is not part of the text
        return self.detok.update(ids, check_stop=req.num_output_tokens > params.min_tokens)

    def add_logprobs(self, entry: PositionLogprobs) -> None:
        self.cumulative_logprob += entry.logprobs[0]
        self.logprobs.append(self._token_logprobs(entry))

    def add_prompt_logprobs(self, chunk: PromptLogprobsChunk) -> None:
        assert self.prompt_logprobs is not None
        for j, entry in enumerate(chunk.entries):  # a recomputed chunk overwrites its entries
            self.prompt_logprobs[chunk.start + j] = self._token_logprobs(entry)

    def _token_logprobs(self, entry: PositionLogprobs) -> TokenLogprobs:
        out: TokenLogprobs = {}
        for token, value, rank in zip(entry.token_ids, entry.logprobs, entry.ranks, strict=True):
            if token not in out:  # the chosen token may also be in the top k: one entry
                text = self.detok.decode_token(token)
                out[token] = Logprob(value, rank, text)
        return out


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
        cumulative_logprob=state.cumulative_logprob if params.logprobs is not None else None,
    )
    metrics = {}
    if req.first_token_time is not None:
        metrics["ttft_s"] = req.first_token_time - req.arrival_time
    if req.scheduled_time is not None:
        metrics["queue_s"] = req.scheduled_time - req.arrival_time
    return RequestOutput(
        request_id=req.request_id,
        prompt=state.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=[completion],
        finished=finished,
        num_prompt_tokens=req.num_prompt_tokens,
        cached_tokens=dict(req.cached_tokens),
        error=req.error,
        client_error=req.error_is_client,
        metrics=metrics,
        logits=list(state.logits) if keep_logits else None,
        kv_transfer_params=req.kv_transfer_params if finished else None,
        prompt_logprobs=list(state.prompt_logprobs) if state.prompt_logprobs is not None else None,
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
        client_error=True,
    )
