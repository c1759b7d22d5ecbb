"""A fake engine told what to answer: the reply of the script key found last in the prompt,
one character per token per step (else the next letters, as ``FakeEngine``). It keeps every
request's ``SamplingParams`` and gives prompt logprobs when asked (-1.0 per token, rank 1), so
server tests see what reached the engine and what came back."""

from __future__ import annotations

from typing import Any

from hybridkv.engine.output import RequestOutput
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.sampling.logprobs import Logprob
from hybridkv.sampling.params import SamplingParams
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.chat_output import ChatParsers
from hybridkv.server.state import ServerState
from tests.server.fake_engine import FakeEngine, _Req

MODEL = "fake-model"
VOCAB_SIZE = 256  # CharTokenizer's ids


class ScriptedEngine(FakeEngine):
    def __init__(self, script: dict[str, str], **kw: Any) -> None:
        super().__init__(max_model_len=kw.pop("max_model_len", 4096), **kw)
        self.script = script
        self.params: list[SamplingParams] = []

    def add_request(self, prompt_token_ids, params, request_id=None, prompt=None, cache_salt=None):  # noqa: ANN001
        if not prompt_token_ids:  # as the engine's Request
            raise ValueError(f"request {request_id}: the prompt is empty")
        if not all(0 <= t < VOCAB_SIZE for t in prompt_token_ids):  # as the engine's checks
            raise ValueError(f"request {request_id}: a prompt token id is out of the vocabulary")
        self.params.append(params)
        super().add_request(prompt_token_ids, params, request_id, prompt, cache_salt)

    def _reply(self, req: _Req) -> str | None:
        """The reply of the script key found last in the prompt (the newest message's)."""
        prompt = self.tokenizer.decode(req.prompt_ids)
        found = [(prompt.rfind(key), reply) for key, reply in self.script.items() if key in prompt]
        return max(found)[1] if found else None

    def next_token(self, req: _Req) -> int:
        reply = self._reply(req)
        if reply is None:
            return super().next_token(req)
        if len(req.out_ids) + 1 >= len(reply):  # the reply's last token: stop after it
            req.status = "stop"
        return ord(reply[len(req.out_ids)])

    def _emit(self, req: _Req) -> RequestOutput:
        out = super()._emit(req)
        if req.params.prompt_logprobs is not None:
            entries = [{t: Logprob(-1.0, 1, chr(t))} for t in req.prompt_ids[1:]]
            out.prompt_logprobs = [None, *entries]
        return out


def make_scripted_app(
    script: dict[str, str], parsers: ChatParsers | None = None, **engine_kw: Any
) -> tuple[Any, ScriptedEngine]:
    fake = ScriptedEngine(script, **engine_kw)
    metrics = ServerMetrics()
    engine = AsyncEngine(fake, metrics)  # type: ignore[arg-type]
    state = ServerState(engine, metrics, fake.tokenizer, MODEL, fake.max_model_len,
                        chat_parsers=parsers or ChatParsers())  # fmt: skip
    return create_app(state), fake
