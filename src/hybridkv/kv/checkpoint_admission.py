"""Which checkpoint a newcomer may displace when the book is full (``CheckpointBook.admit``).

Two candidates, the one that leaves the book worth more wins (none: the newcomer is refused):

- the **least valuable** unreferenced checkpoint, if the newcomer is worth more than it plus
  what its parent (the deepest checkpoint on its prefix) loses by becoming a link; a turn
  end, a caller boundary or a finished request's last state must be worth ``ADMIT_MARGIN``
  times more (see below);
- the newcomer's **parent itself**, when the newcomer *supersedes* it: a request's last state
  supersedes its own prompt end (never hit) and the turn end it resumed from, which its next
  turn continues past. The newcomer is then measured from the parent's own ancestor, and
  needs no margin: a conversation moves its one checkpoint forward instead of taking a
  second slot from another conversation.

**The margin** is Belady's rule for a cycle longer than the budget. Interleaved
conversations each resume once per round; a newcomer's next use is a whole round away, an
incumbent's on average half a round, so the newcomer must be worth about twice as much per
slot. Without it newer (longer) turn ends displace older ones just before their reuse,
round after round (B3's chat on qwen35 at its default budget: 22 checkpoints for 24
conversations). Measured on B3's traces, 2.5 is best (2 and 3 within 1 %). Prompt ends and
periodic boundaries compare as they are (a re-sent batch keeps its most valuable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hybridkv.kv.checkpoint_value import MIN_LINK_SHARE, CheckpointEntry, recompute_cost
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash

ADMIT_MARGIN = 2.5
MARGIN_KINDS = (CheckpointKind.TURN_END, CheckpointKind.CALLER, CheckpointKind.FINISHED)


@dataclass(frozen=True, slots=True)
class Newcomer:
    """A checkpoint about to be made at ``boundary``, worth ``expected`` reuses."""

    kind: CheckpointKind
    expected: float
    prefix: tuple[BlockHash, ...]  # the block hashes before the boundary's own
    boundary: int
    pending_below: int  # the deepest save of the same request below it, not keyed yet
    supersedes: frozenset[int]  # slots it may replace (the request's own, see above)


class AdmissionBook(Protocol):
    """What admission reads of ``CheckpointBook``."""

    entries: dict[int, CheckpointEntry]

    def value(self, entry: CheckpointEntry) -> float: ...
    def victim(self) -> int | None: ...
    def parent(self, prefix: tuple[BlockHash, ...]) -> int | None: ...
    def num_ways(self, entry: CheckpointEntry) -> int: ...
    def is_free(self, slot: int) -> bool: ...


def admission_victim(book: AdmissionBook, new: Newcomer) -> int | None:
    """The checkpoint ``new`` displaces, or None (it is refused)."""
    parent = book.parent(new.prefix)
    margin = ADMIT_MARGIN if new.kind in MARGIN_KINDS else 1.0
    candidates = [] if (v := book.victim()) is None else [(v, margin)]
    if parent is not None and parent in new.supersedes and supersedable(book, parent):
        own_prompt = book.entries[parent].kind == CheckpointKind.PROMPT
        candidates.append((parent, ADMIT_MARGIN if own_prompt else 1.0))
    best, slot = 0.0, None
    for c, m in candidates:
        entry = book.entries[c]
        if c == parent:  # the newcomer replaces it: measured from its ancestor
            base, loss = entry.ancestor, book.value(entry)
        else:
            base = book.entries[parent].boundary if parent is not None else 0
            loss = book.value(entry) + link_loss(book, parent, new.expected)
        gain = new.expected * recompute_cost(max(base, new.pending_below), new.boundary)
        if gain / m - loss > best:
            best, slot = gain / m - loss, c
    return slot


def supersedable(book: AdmissionBook, slot: int) -> bool:
    """An unreferenced prompt end never hit, or a turn end (a finished request's state)."""
    entry = book.entries[slot]
    if not book.is_free(slot):
        return False
    if entry.kind == CheckpointKind.PROMPT:
        return entry.hits == 0
    return entry.kind in (CheckpointKind.TURN_END, CheckpointKind.FINISHED)


def link_loss(book: AdmissionBook, slot: int | None, onward: float) -> float:
    """What a frontier never hit loses when a newcomer (``onward`` expected reuses)
    continues it: it becomes a link (``CheckpointBook.value``)."""
    if slot is None:
        return 0.0
    entry = book.entries[slot]
    if entry.hits or book.num_ways(entry):
        return 0.0
    return book.value(entry) * min(onward, 1.0 - MIN_LINK_SHARE)
