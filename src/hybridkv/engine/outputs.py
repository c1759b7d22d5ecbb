"""The text side of a step: per-request text state, stop strings and ``RequestOutput``s.

After ``update_from_output`` hands back the requests that got a token::

    logprobs / logits of the step -> the request's TextState
    detokenize the new tokens; a stop string finishes the request (scheduler.finish_request)
    RequestOutput for it (all of them, or with ``final_only`` just the finished ones)

With ``final_only`` (``LLM.generate``), a request without stop strings is not detokenized
until its output is built: the text of every id at once equals the incremental text
(``detokenizer.py``), and the per-step decode calls (~7 µs a request) are saved.

Requests finished outside a step (aborts) are reported once by ``take_finished_elsewhere``.
"""

from __future__ import annotations

from collections.abc import Callable

from hybridkv.engine.output import RequestOutput, TextState, make_output
from hybridkv.request import Request, RequestStatus
from hybridkv.sched.scheduler import Scheduler
from hybridkv.step_io import RunnerOutput


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, keep_logits: bool) -> None:
        self.scheduler = scheduler
        self.keep_logits = keep_logits
        self.texts: dict[str, TextState] = {}
        self.live: dict[str, Request] = {}
        # True: unfinished requests get no output; their text advances only if they have stop
        # strings (else it catches up, decoded in one go, when their output is built);
        # ``wants_every(request_id)`` names those that need one anyway
        self.final_only = False
        self.wants_every: Callable[[str], bool] = lambda request_id: False

    def add(self, req: Request, state: TextState) -> None:
        self.texts[req.request_id] = state
        self.live[req.request_id] = req

    def process(
        self, updated: list[Request], result: RunnerOutput, now: float
    ) -> list[RequestOutput]:
        texts = self.texts
        for request_id, chunk in result.prompt_logprobs.items():
            if request_id in texts:
                texts[request_id].add_prompt_logprobs(chunk)
        logprobs, logits = result.logprobs, result.logits
        final_only, wants_every = self.final_only, self.wants_every
        outputs = []
        for req in updated:
            request_id = req.request_id
            state = texts[request_id]
            if req.first_token_time is None:
                req.first_token_time = now
            if logprobs and request_id in logprobs:
                state.add_logprobs(logprobs[request_id])
            if logits and request_id in logits:
                state.logits.append(logits[request_id])
            if final_only and not req.status.is_finished and not wants_every(request_id):
                if state.detok.has_stop_strings:  # else the text catches up in _emit
                    self.apply_stop_strings(req, state)
                continue
            self.apply_stop_strings(req, state)
            outputs.append(self._emit(req))
        return outputs

    def apply_stop_strings(self, req: Request, state: TextState) -> None:
        stop = state.update(req)
        if stop is not None and not req.status.is_finished:
            self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
            req.stop_reason = stop

    def take_finished_elsewhere(self) -> list[RequestOutput]:
        """Outputs for requests finished outside a step (aborts) that nobody reported yet."""
        gone = [r for r in self.live.values() if r.status.is_finished]
        return [self._emit(r) for r in gone]

    def _emit(self, req: Request) -> RequestOutput:
        state = self.texts[req.request_id]
        if not state.detok.has_stop_strings:
            state.update(req)  # tokens of steps that built no output (``final_only``)
        output = make_output(req, state, self.keep_logits)
        if req.status.is_finished:
            self.texts.pop(req.request_id, None)
            self.live.pop(req.request_id, None)
        return output
