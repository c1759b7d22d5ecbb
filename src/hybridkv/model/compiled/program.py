"""``DecodeProgram``: a model's decode step planned once (``plans.py``) and run per step in one
native call (``native/runner.c``), for steps of 1..``MAX_ROWS`` decode tokens.

Per step, Python only writes the step's values into one small struct (token count, threads,
token ids, positions, each attention group's ``KernelTable``, each state group's decode
slots) and calls the runner. The program starts with the embedding lookup (``embed.py``) and,
when the step asks for it (every request plain greedy), ends with the lm_head and each row's
argmax (``head.py``): the step's tokens come out without any logits in Python. Otherwise the
lm_head, logits processing and sampling stay in Python. ``try_forward`` returns None for a step the program does not take
(prefill rows, more rows, the torch attention path): the model's own ``forward`` runs it.
``HYBRIDKV_DECODE_PROGRAM=0`` turns programs off (A/B).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from hybridkv.kv.spec import KVCacheLayout, StateSpec
from hybridkv.model.compiled.builder import ProgramBuilder, Unsupported
from hybridkv.model.compiled.embed import embed
from hybridkv.model.compiled.head import Head, greedy_head
from hybridkv.model.compiled.mixers import AttnBinding
from hybridkv.model.compiled.plans import PLANS, Bindings, Plan
from hybridkv.model.layers.rotary import RotaryTable
from hybridkv.model.layers.step_context import KernelAttnMeta, StepContext
from hybridkv.model.models.common import CausalLM
from hybridkv.native.runner import AttnGroup, ProgramRunner, StateGroup, Step, load_runner

log = logging.getLogger(__name__)
MAX_ROWS = 32  # decode tokens a step may have to run on the program (B1: up to 32 requests)
ENV_SWITCH = "HYBRIDKV_DECODE_PROGRAM"


@dataclass(frozen=True, slots=True)
class ProgramStep:
    """What one step of the program gives: the final hidden rows ``[T, hidden]`` (a view of
    the program's buffer, valid until the next step) and, when the greedy head ran and every
    row's maximum logit is finite, each row's greedy token (else None: Python computes the
    logits from ``hidden`` and samples, naming rows without a finite maximum)."""

    hidden: torch.Tensor
    tokens: list[int] | None


@dataclass(frozen=True, slots=True)
class Ends:
    """The program's optional ends: the embedding op at ops[0], the greedy head's ops after
    the ``body`` ops (None: Python does them)."""

    embeds: bool
    body: int
    head: Head | None


@dataclass(frozen=True, slots=True)
class Groups:
    """A representative layer of each attention and state group, in slot order."""

    attn_layers: tuple[int, ...]
    state_layers: tuple[int, ...]


class DecodeProgram:
    """One model's planned ops, their buffers (kept by the builder) and the step struct the
    runner reads; bound to the runner's KV pages and state tensors, the weights and the
    rotary tables as they were when planned."""

    def __init__(
        self, runner: ProgramRunner, builder: ProgramBuilder, plan: Plan, groups: Groups,
        model: CausalLM, ropes: list[RotaryTable], ends: Ends,
    ) -> None:  # fmt: skip
        self._runner, self._builder, self._model, self._groups = runner, builder, model, groups
        self.ends = ends
        self._ops = builder.ops_array()
        self._attn = (AttnGroup * max(1, len(groups.attn_layers)))()
        self._states = (StateGroup * max(1, len(groups.state_layers)))()
        self._step = Step(0, 1, None, self._attn, self._states)
        residual, hidden = (
            _tensor_of(builder, rows.address) for rows in (plan.residual, plan.hidden)
        )
        self._residual, self._hidden = residual, hidden
        self._ropes = ropes
        self.num_steps = 0  # steps run
        self.num_head_steps = 0  # of which the greedy head ran
        self._bound: tuple[object, object, int] | None = None  # what the step struct holds
        self._rope_tables = [(r.cos, r.sin) for r in ropes]  # kept: compared by identity
        self.rope_len = min((int(r.cos.shape[0]) for r in ropes), default=1 << 62)

    def is_current(self) -> bool:
        """False once a rotary table it reads was regrown (new tensors): rebuild it."""
        tables = zip(self._ropes, self._rope_tables, strict=True)
        return all(r.cos is cos and r.sin is sin for r, (cos, sin) in tables)

    @property
    def num_ops(self) -> int:
        return len(self._ops)

    def try_forward(
        self, input_ids: torch.Tensor, ctx: StepContext, greedy: bool = False
    ) -> ProgramStep | None:
        """A decode-only step (with ``greedy``: its tokens too, where the program has the
        head), or None: not a step it takes."""
        num_tokens = int(input_ids.shape[0])
        if not 0 < num_tokens <= MAX_ROWS or ctx.max_position >= self.rope_len:
            return None
        if not (_is_index(ctx.positions) and _is_index(input_ids)):
            return None
        if not self._bind(ctx, num_tokens):
            return None
        step = self._step
        step.num_tokens, step.threads = num_tokens, torch.get_num_threads()
        step.positions, step.ids = ctx.positions.data_ptr(), input_ids.data_ptr()
        ends = self.ends
        if not ends.embeds:
            self._residual[:num_tokens].copy_(self._model.embed_input(input_ids))
        head = ends.head if greedy else None
        failed = self._runner.run(self._ops, len(self._ops) if head else ends.body, step)
        if failed:
            raise RuntimeError(
                f"decode program: op {failed - 1} failed (a token id, memory or a state slot)"
            )
        self.num_steps += 1
        self.num_head_steps += head is not None
        return ProgramStep(
            self._hidden[:num_tokens], None if head is None else _tokens(head, num_tokens)
        )

    def _bind(self, ctx: StepContext, num_tokens: int) -> bool:
        """The step's tables and slots into the step struct; skipped when they are the last
        step's objects (``model/step/decode_reuse.py`` reuses them, updated in place)."""
        bound = (ctx.attn_meta, ctx.state_meta, num_tokens)
        last = self._bound
        if last is not None and all(a is b for a, b in zip(bound, last, strict=True)):
            return True
        self._bound = None
        if not (self._bind_attention(ctx, num_tokens) and self._bind_states(ctx, num_tokens)):
            return False
        self._bound = bound  # kept: their ids stay theirs while they are compared
        return True

    def _bind_attention(self, ctx: StepContext, num_tokens: int) -> bool:
        for slot, layer_id in enumerate(self._groups.attn_layers):
            meta = ctx.attn_meta.get(layer_id)
            if not isinstance(meta, KernelAttnMeta):
                return False
            table = meta.table
            if table.block_table.shape[0] != num_tokens:  # a request with more than one token
                return False
            if not all(_is_index(t) for t in (table.block_table, table.rows, table.positions)):
                return False
            group = self._attn[slot]
            group.table, group.table_stride = (
                table.block_table.data_ptr(),
                table.block_table.shape[1],
            )
            group.window, group.rows = table.window, table.rows.data_ptr()
            group.positions = table.positions.data_ptr()
        return True

    def _bind_states(self, ctx: StepContext, num_tokens: int) -> bool:
        for slot, layer_id in enumerate(self._groups.state_layers):
            meta = ctx.state_meta.get(layer_id)
            if meta is None or meta.has_prefill or meta.decode_token_idx.shape[0] != num_tokens:
                return False
            slots, tokens = meta.decode_slots, meta.decode_token_idx
            if not (_is_index(slots) and _is_index(tokens)):
                return False
            group = self._states[slot]
            group.slots, group.tokens = slots.data_ptr(), tokens.data_ptr()
            group.rows = num_tokens
        return True


class LazyDecodeProgram:
    """The runner's program: planned at the first step it could take, planned again when a
    rotary table it reads grows (a step past the table runs in Python, which grows it)."""

    def __init__(
        self,
        model: CausalLM,
        layout: KVCacheLayout,
        kv_pages: dict[int, torch.Tensor],
        states: dict[int, tuple[torch.Tensor, ...]],
    ) -> None:
        self._args = (model, layout, kv_pages, states)
        self._program: DecodeProgram | None = None
        self._planned = False

    @property
    def program(self) -> DecodeProgram | None:
        """The current program (None: not planned yet, or the model decodes in Python)."""
        return self._program

    def try_forward(
        self, input_ids: torch.Tensor, ctx: StepContext, greedy: bool = False
    ) -> ProgramStep | None:
        """``DecodeProgram.try_forward``, or None where no program runs."""
        if not 0 < input_ids.shape[0] <= MAX_ROWS:
            return None
        program = self._program
        if not self._planned or (program is not None and not program.is_current()):
            self._program = program = create_decode_program(*self._args)
            self._planned = True
        return None if program is None else program.try_forward(input_ids, ctx, greedy)


def _tokens(head: Head, num_tokens: int) -> list[int] | None:
    """The rows' greedy tokens, or None where a row's maximum is not finite."""
    if not np.isfinite(head.maxima[:num_tokens]).all():
        return None
    out: list[int] = head.tokens[:num_tokens].tolist()
    return out


def _is_index(t: torch.Tensor) -> bool:
    """What the kernels read by address: contiguous int64 (the step builder's tensors are)."""
    return t.dtype == torch.int64 and t.is_contiguous()


def _tensor_of(builder: ProgramBuilder, address: int) -> torch.Tensor:
    return next(t for t in builder.keep if t.data_ptr() == address and t.dim() == 2)


def create_decode_program(
    model: CausalLM,
    layout: KVCacheLayout,
    kv_pages: dict[int, torch.Tensor],
    states: dict[int, tuple[torch.Tensor, ...]],
) -> DecodeProgram | None:
    """The model's decode program, or None (the reason logged once): switched off, no
    planner for the model, a piece it cannot express, no native runner."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    planner = PLANS.get(type(model))
    runner = load_runner() if planner is not None else None
    if planner is None or runner is None:
        why = "no native runner" if planner else f"no decode plan for {type(model).__name__}"
        log.info("decode program off: %s; decoding in Python", why)
        return None
    bind, groups = _bindings(layout, kv_pages, states)
    builder = ProgramBuilder(MAX_ROWS)
    try:
        with torch.inference_mode():
            dtype = model.embed_input(torch.zeros(1, dtype=torch.int64)).dtype
            if dtype != torch.float32:  # the buffers are float32: not the Python step's numbers
                raise Unsupported(f"{dtype} activations")
            plan = planner(builder, model, bind)
    except Unsupported as err:
        log.info("decode program off for %s: %s; decoding in Python", type(model).__name__, err)
        return None
    ends = _plan_ends(builder, model, plan)
    ropes = [m for m in model.modules() if isinstance(m, RotaryTable)]
    program = DecodeProgram(runner, builder, plan, groups, model, ropes, ends)
    log.info("decode program: %s, %d ops (embedding %s, greedy head %s)", type(model).__name__,
             program.num_ops, ends.embeds, ends.head is not None)  # fmt: skip
    return program


def _plan_ends(builder: ProgramBuilder, model: CausalLM, plan: Plan) -> Ends:
    """The embedding op (moved to ops[0]) and the greedy head, each where it can be had."""
    name = type(model).__name__
    embeds = head = None
    with torch.inference_mode():
        try:
            embed(builder, model, plan.residual)
            builder.ops.insert(0, builder.ops.pop())
            embeds = True
        except Unsupported as err:
            log.info("decode program of %s: embedding in Python (%s)", name, err)
        body = len(builder.ops)
        try:
            head = greedy_head(builder, model, plan.hidden)
        except Unsupported as err:
            log.info("decode program of %s: lm_head in Python (%s)", name, err)
    return Ends(bool(embeds), body, head)


def _bindings(
    layout: KVCacheLayout,
    kv_pages: dict[int, torch.Tensor],
    states: dict[int, tuple[torch.Tensor, ...]],
) -> tuple[Bindings, Groups]:
    attn: dict[int, AttnBinding] = {}
    state: dict[int, tuple[tuple[torch.Tensor, ...], int]] = {}
    attn_layers: list[int] = []
    state_layers: list[int] = []
    for group in layout.groups:
        if isinstance(group.spec, StateSpec):
            state.update({i: (states[i], len(state_layers)) for i in group.layer_ids})
            state_layers.append(group.layer_ids[0])
        else:
            attn.update({i: AttnBinding(kv_pages[i], len(attn_layers)) for i in group.layer_ids})
            attn_layers.append(group.layer_ids[0])
    return Bindings(attn, state), Groups(tuple(attn_layers), tuple(state_layers))
