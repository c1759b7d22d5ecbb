"""``n > 1``: one request fanned out into n children after its prefill.

The first child runs alone; when it has its first token its prompt KV is in the prefix cache,
and the other ``n - 1`` children are added: they hit that cache for the prompt (all but the
last, partial block; ``cached_tokens`` shows it), so the prompt is computed (or, with P/D,
transferred) once (prompt logprobs and ``kv_transfer_params``, if given, go to the first
child alone). Child i runs
with ``n=1`` and, if the parent is seeded, ``seed + i`` (vLLM's derivation); its id is
``f"{i}_{parent_id}"`` (vLLM's). The parent's ``RequestOutput`` holds the n completions
(``index`` i), is finished when all are, and sums the children's ``cached_tokens``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridkv.engine.output import CompletionOutput, RequestOutput
from hybridkv.request import RequestStatus
from hybridkv.sampling.params import SamplingParams

AddChild = Callable[[str, SamplingParams], None]


@dataclass(slots=True)
class ParentRequest:
    request_id: str
    params: SamplingParams
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[RequestOutput | None] = field(default_factory=list)
    num_spawned: int = 1
    aborted: bool = False  # children not added yet never will be

    def __post_init__(self) -> None:
        self.children = [None] * self.params.n

    def child_id(self, index: int) -> str:
        return f"{index}_{self.request_id}"

    def child_params(self, index: int) -> SamplingParams:
        """n=1, ``seed + index``; only the first child computes prompt logprobs (the others
        then hit the prefix cache for the prompt) and carries ``kv_transfer_params``: one
        transfer per request (P/D), not one per copy. On a consumer the first child reads the
        producer's KV once (a second read of the same params would find the lease ended); on
        a producer only the first child's KV waits for the consumer's read, and the others
        free theirs when they finish."""
        seed = self.params.seed
        first = index == 0
        extra = self.params.extra_args
        if extra and not first:
            extra = {k: v for k, v in extra.items() if k != "kv_transfer_params"} or None
        return dataclasses.replace(
            self.params,
            n=1,
            seed=None if seed is None else seed + index,
            prompt_logprobs=self.params.prompt_logprobs if first else None,
            extra_args=extra,
        )

    @property
    def finished(self) -> bool:
        return all(c.finished if c is not None else self.aborted for c in self.children)

    def output(self) -> RequestOutput:
        first = self.children[0]
        assert first is not None
        completions = []
        cached: dict[str, int] = {}
        for i, child in enumerate(self.children):
            if child is None:
                reason = RequestStatus.FINISHED_ABORTED.value if self.aborted else None
                completions.append(CompletionOutput(i, "", [], reason))
                continue
            completions.append(dataclasses.replace(child.outputs[0], index=i))
            for source, tokens in child.cached_tokens.items():
                cached[source] = cached.get(source, 0) + tokens
        errors = [c.error for c in self.children if c is not None and c.error]
        return dataclasses.replace(
            first,
            request_id=self.request_id,
            outputs=completions,
            finished=self.finished,
            cached_tokens=cached,
            error=errors[0] if errors else None,
        )


class ParallelSampling:
    """The engine's parents by id and the children they are waiting for."""

    def __init__(self, add_child: AddChild) -> None:
        self._add_child = add_child
        self._parents: dict[str, ParentRequest] = {}
        self._child_of: dict[str, tuple[ParentRequest, int]] = {}

    def add(self, parent: ParentRequest) -> tuple[str, SamplingParams]:
        """Register ``parent``; the first child's id and params, for the caller to add."""
        self._parents[parent.request_id] = parent
        self._child_of[parent.child_id(0)] = (parent, 0)
        return parent.child_id(0), parent.child_params(0)

    def is_child(self, request_id: str) -> bool:
        """A child of a parent with n > 1 (its outputs are routed to the parent)."""
        return request_id in self._child_of

    def route(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Children's outputs become their parent's (one per parent); others pass through."""
        out: list[RequestOutput] = []
        touched: dict[str, ParentRequest] = {}
        for o in outputs:
            found = self._child_of.get(o.request_id)
            if found is None:
                out.append(o)
                continue
            parent, index = found
            parent.children[index] = o
            if o.finished:
                del self._child_of[o.request_id]
            self._spawn(parent)
            touched[parent.request_id] = parent
        for parent in touched.values():
            out.append(parent.output())
            if parent.finished:
                del self._parents[parent.request_id]
        return out

    def abort(self, request_id: str) -> list[str] | None:
        """Abort a parent: its children not added yet never will be; returns the live
        children's ids for the caller to abort (None if ``request_id`` is no parent)."""
        parent = self._parents.get(request_id)
        if parent is None:
            return None
        parent.aborted = True
        return [c for c, (p, _) in self._child_of.items() if p is parent]

    def _spawn(self, parent: ParentRequest) -> None:
        """After the first child's first output (its prompt KV is cached), add the others."""
        while parent.num_spawned < parent.params.n and not parent.aborted:
            index = parent.num_spawned
            parent.num_spawned += 1
            self._child_of[parent.child_id(index)] = (parent, index)
            self._add_child(parent.child_id(index), parent.child_params(index))
