"""The connector contract's wrappers forward every hook: a hook of ``BaseConnectorScheduler`` /
``BaseConnectorWorker`` (found by introspection, so a hook added later is covered) that a
wrapper left to the base's default would silently change what the wrapped connector does
(e.g. its step interval, so restore units lose their state checkpoints). Optional hook groups
are resolved once, through ``capabilities()``."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    BaseConnectorWorker,
    Capabilities,
    LeaseHooks,
    PartialKV,
    TierControl,
)
from hybridkv.connectors.delegating import DelegatingConnectorScheduler, DelegatingConnectorWorker
from hybridkv.connectors.fault.connector import FaultInjectionScheduler, FaultInjectionWorker
from hybridkv.connectors.multi.connector import MultiConnectorScheduler
from hybridkv.connectors.multi.worker import MultiConnectorWorker

BASES = (BaseConnectorScheduler, BaseConnectorWorker)
GROUPS = (TierControl, LeaseHooks, PartialKV)


def hooks(base: type) -> list[str]:
    """The public methods of a contract class or protocol (its own, not ``object``'s)."""
    return sorted(
        n for n, v in vars(base).items() if callable(v) and not n.startswith("_") and n != "of"
    )


def owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO whose body defines ``name``."""
    return next(c for c in cls.__mro__ if name in vars(c))


def test_the_contract_is_what_this_test_enumerates() -> None:
    """Guards the introspection itself: it finds the hooks (and never the groups' members,
    which live on the protocols, not the base)."""
    assert {"get_num_new_matched_tokens", "request_finished", "capabilities"} <= set(
        hooks(BaseConnectorScheduler)
    )
    assert {"start_load", "save", "get_finished", "shutdown"} <= set(hooks(BaseConnectorWorker))
    for group in GROUPS:
        assert not set(hooks(group)) & set(hooks(BaseConnectorScheduler))


@pytest.mark.parametrize(
    ("base", "wrapper"),
    [
        (BaseConnectorScheduler, DelegatingConnectorScheduler),
        (BaseConnectorWorker, DelegatingConnectorWorker),
        (BaseConnectorScheduler, FaultInjectionScheduler),
        (BaseConnectorWorker, FaultInjectionWorker),
        (BaseConnectorScheduler, MultiConnectorScheduler),
        (BaseConnectorWorker, MultiConnectorWorker),
    ],
)
def test_no_wrapper_leaves_a_hook_to_the_default(base: type, wrapper: type) -> None:
    left = [n for n in hooks(base) if owner(wrapper, n) is base]
    assert not left, f"{wrapper.__name__} leaves {left} to {base.__name__}'s default"


@pytest.mark.parametrize("wrapper", [MultiConnectorScheduler, MultiConnectorWorker])
def test_the_fan_out_spells_out_every_hook(wrapper: type) -> None:
    """MultiConnector decides per hook how its children's answers combine: each is written
    in its own class body, never inherited."""
    base = BaseConnectorScheduler if wrapper is MultiConnectorScheduler else BaseConnectorWorker
    names = hooks(base) + [n for g in GROUPS for n in hooks(g)] * (base is BaseConnectorScheduler)
    missing = [n for n in names if n not in vars(wrapper)]
    assert not missing, f"{wrapper.__name__} does not spell out {missing}"


class Recording:
    """A stand-in inner half: every call is recorded and answered with a marker object."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answers: dict[str, object] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def hook(*args: Any) -> object:
            self.calls.append((name, args))
            return self.answers.setdefault(name, object())

        return hook


@pytest.mark.parametrize(
    ("base", "wrapper"),
    [
        (BaseConnectorScheduler, DelegatingConnectorScheduler),
        (BaseConnectorWorker, DelegatingConnectorWorker),
    ],
)
def test_the_delegating_bases_hand_each_call_and_answer_through(base: type, wrapper: Any) -> None:
    inner = Recording()
    outer = wrapper(inner)
    for name in hooks(base):
        signature = inspect.signature(getattr(base, name))
        args = tuple(object() for _ in list(signature.parameters)[1:])
        answer = getattr(outer, name)(*args)
        assert inner.calls[-1] == (name, args), f"{name} was not forwarded"
        if signature.return_annotation != "None":
            assert answer is inner.answers[name], f"{name} changed the inner's answer"


class Grouped(Recording):
    """An inner scheduler half with every optional group (a NIXL or offloading child)."""

    def capabilities(self) -> Capabilities:
        return Capabilities(self, self, self)  # type: ignore[arg-type]


def test_a_wrapper_answers_with_its_inner_groups() -> None:
    inner = Grouped()
    assert FaultInjectionScheduler(inner).capabilities() == inner.capabilities()  # type: ignore[arg-type]


def test_groups_are_found_by_protocol_and_taken_whole() -> None:
    """A half with every method of a group has it; one with part of a group does not (so a
    half-written group is not called at all, rather than half of it)."""

    class Halfway:
        def on_waiting(self, requests: Any) -> None: ...

        def get_first_whole_blocks(self, request: Any, n: int) -> None: ...

        def get_kept_kv(self, request: Any) -> None: ...

    half = Halfway()
    assert Capabilities.of(half) == Capabilities(partial=half)  # type: ignore[arg-type]
