"""What every handler of one server shares: the engine thread, metrics, tokenizer, model name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.chat_output import ChatParsers
from hybridkv.server.errors import APIError
from hybridkv.server.limits import PromptLimits, ServerLimits


@dataclass(slots=True)
class ServerState:
    engine: AsyncEngine
    metrics: ServerMetrics
    tokenizer: Any  # PromptTokenizer + decode; the engine's (thread-safe: no engine state)
    model_name: str
    max_model_len: int
    limits: ServerLimits = field(default_factory=ServerLimits)
    max_prompt_chars: int | None = None  # None: no check before tokenizing
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # generation_config.json
    max_logprobs: int = 20  # --max-logprobs
    log_requests: bool = True  # --disable-log-requests turns it off
    chat_parsers: ChatParsers = field(default_factory=ChatParsers)  # tool calls, reasoning
    created: int = field(default_factory=lambda: int(time.time()))

    @staticmethod
    def of(request: Request) -> ServerState:
        state: ServerState = request.app.state.hybridkv
        return state

    @property
    def prompt_limits(self) -> PromptLimits:
        return PromptLimits(self.max_model_len, self.max_prompt_chars, self.max_logprobs)

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(
                404,
                f"the model {name!r} does not exist: this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "hybridkv",
            "max_model_len": self.max_model_len,
        }
