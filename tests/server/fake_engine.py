"""A stand-in for EngineCore with the same surface the server uses, and no model.

Each request's next token is the letter after its last one (``a``..``z`` cycling); tokens are
characters (id = code point). It runs in any thread, so server tests that are about HTTP,
threads and disconnects need no checkpoint.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hybridkv.engine.detokenizer import IncrementalDetokenizer
from hybridkv.engine.output import CompletionOutput, RequestOutput
from hybridkv.engine.stats import EngineStats, GroupCacheStats
from hybridkv.model.loading.chat_template import text_messages
from hybridkv.sampling.logprobs import Logprob
from hybridkv.sampling.params import SamplingParams
from tests.support.waits import Gate

BLOCK = 4
NUM_BLOCKS = 64


class CharTokenizer:
    def __init__(self) -> None:
        self.slow = Gate()  # holds a SLOWTOKENS prompt's tokenizing

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if "BUG" in text:
            raise KeyError("a bug in the tokenizer")
        if "SLOWTOKENS" in text:
            self.slow.hold()  # a prompt that takes long to tokenize
        return [min(ord(c), 255) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kw: Any
    ) -> str:
        """``<role>content`` per message; template kwargs show as ``[name=value]``."""
        messages = text_messages(messages)
        text = "".join(f"<{m['role']}>{m.get('content', '')}" for m in messages)
        extra = {k: v for k, v in kw.items() if v is not None and k != "continue_final_message"}
        text += "".join(f"[{k}={v}]" for k, v in sorted(extra.items()) if k != "tools")
        return text + ("<assistant>" if add_generation_prompt else "")


def next_letter(token: int) -> int:
    return ord("a") + (token - ord("a") + 1) % 26 if ord("a") <= token <= ord("z") else ord("a")


def expected_text(prompt: str, n: int) -> str:
    out, last = [], ord(prompt[-1])
    for _ in range(n):
        last = next_letter(last)
        out.append(chr(last))
    return "".join(out)


@dataclass
class _Req:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    out_ids: list[int] = field(default_factory=list)
    status: str | None = None
    error: str | None = None


class FakeEngine:
    def __init__(self, max_model_len: int = 64, step_delay: float = 0.0) -> None:
        self.tokenizer = CharTokenizer()
        self.max_model_len = max_model_len
        self.step_delay = step_delay
        self.stall = Gate()  # holds the first step of a STALL prompt
        self.num_queries = 0
        self.queried_tokens = 0
        self.reqs: dict[str, _Req] = {}
        self.done: list[_Req] = []
        self.threads: set[str] = set()  # names of the threads that called in

    def _note(self) -> None:
        self.threads.add(threading.current_thread().name)

    def add_request(self, prompt_token_ids, params, request_id=None, prompt=None, cache_salt=None):  # noqa: ANN001
        self._note()
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(f"request {request_id}: prompt of {len(prompt_token_ids)} tokens does not fit max_model_len={self.max_model_len}")  # fmt: skip
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)  # the engine's text and stops
        self.reqs[request_id] = _Req(request_id, list(prompt_token_ids), params, detok)
        self.num_queries += 1
        self.queried_tokens += len(prompt_token_ids)

    def abort_request(self, request_id: str) -> None:
        self._note()
        req = self.reqs.pop(request_id, None)
        if req is not None:
            req.status = "abort"
            self.done.append(req)

    def shutdown(self) -> None:
        self._note()

    def has_unfinished_requests(self) -> bool:
        return bool(self.reqs)

    def step(self) -> list[RequestOutput]:
        self._note()
        time.sleep(self.step_delay)
        outs = [self._emit(r) for r in self.done]
        self.done.clear()
        for req in list(self.reqs.values()):
            prompt = self.tokenizer.decode(req.prompt_ids)
            if "CRASH" in prompt:
                raise RuntimeError("the fake engine crashed")
            if "STALL" in prompt and not req.out_ids:
                self.stall.hold()  # one stuck step (a disk that does not answer)
            if "FAIL" in prompt and req.out_ids:
                req.status, req.error = "error", "KV load failed (fake)"
                del self.reqs[req.request_id]
                outs.append(self._emit(req))
                continue
            req.out_ids.append(self.next_token(req))
            if req.detok.update(req.out_ids[-1:]) is not None:
                req.status = "stop"
            elif len(req.out_ids) >= req.params.max_tokens:
                req.status = "length"
            if req.status:
                del self.reqs[req.request_id]
            outs.append(self._emit(req))
        return outs

    def next_token(self, req: _Req) -> int:
        """The letter after the request's last token (a subclass may say otherwise)."""
        return next_letter((req.out_ids or req.prompt_ids)[-1])

    def _emit(self, req: _Req) -> RequestOutput:
        lps = None
        if req.params.logprobs is not None:  # the chosen token, rank 1, at -0.5
            lps = [{t: Logprob(-0.5, 1, chr(t))} for t in req.out_ids]
        stable = req.detok.stable_length(req.status is not None)
        outs = [CompletionOutput(j, req.detok.text, list(req.out_ids), req.status, logprobs=lps,
                                 stable_text_len=stable) for j in range(req.params.n)]  # fmt: skip
        return RequestOutput(req.request_id, None, req.prompt_ids, outs, req.status is not None,
                             len(req.prompt_ids), cached_tokens={"local": 0}, error=req.error,
                             kv_transfer_params=self._transfer_params(req))  # fmt: skip

    @staticmethod
    def _transfer_params(req: _Req) -> dict[str, object] | None:
        """Finished requests echo the client's kv_transfer_params (as a connector would)."""
        sent = req.params.kv_transfer_params
        return {"echo": sent} if sent is not None and req.status is not None else None

    def stats(self) -> EngineStats:
        used = sum(-(-(len(r.prompt_ids) + len(r.out_ids)) // BLOCK) for r in self.reqs.values())
        return EngineStats(
            num_running=len(self.reqs),
            kv_usage=used / NUM_BLOCKS,
            prefix_cache_queries=self.num_queries,
            prefix_cache_queried_tokens=self.queried_tokens,
            groups=(GroupCacheStats(0, "full_attention", self.queried_tokens, 0),),
        )
