"""``PublisherStats``: what a KV event publisher counted (zmq-free, for ``EngineStats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PublisherStats:
    published_batches: int = 0  # batches handed to the socket (or counted by the null publisher)
    dropped_batches: int = 0  # oldest batches dropped from a full queue (the thread fell behind)
