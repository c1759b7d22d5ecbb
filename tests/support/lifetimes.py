"""Engines and connector doubles that tests build are closed when their scope ends.

The shared builders (``tests/engine/helpers.make_llm``, ``tests/connectors/helpers.Engine``,
...) ``track`` what they create; ``tests/conftest.py`` closes what was tracked during a test at
its end, and what a module's fixtures built at the module's end (the engines of one test file
are torn down before the next file builds its own). Something cached for the whole session
(``keep``) is closed at the session's end. Without this, every connector double left its tier
threads running: the test process once held 467 idle threads and 3.7 GB by mid-suite.

Tracked objects are held until their scope ends: a connector double has no finalizer of its
own, so dropping it would leave its threads running.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")  # anything with ``close()`` (an LLM, a connector double) or ``shutdown()``

_tracked: list[Any] = []
_session: list[Any] = []


def track(obj: T) -> T:
    """Close ``obj`` at the end of the test (or fixture scope) that created it."""
    _tracked.append(obj)
    return obj


def keep(obj: T) -> T:
    """Close ``obj`` at the end of the session only (a builder's cache), even if tracked."""
    _session.append(obj)
    return obj


def mark() -> int:
    return len(_tracked)


def close_since(start: int) -> None:
    """Close every object tracked since ``mark()`` returned ``start`` (newest first)."""
    taken = _tracked[start:]
    del _tracked[start:]
    kept = {id(obj) for obj in _session}
    _close_all([obj for obj in reversed(taken) if id(obj) not in kept])


def close_session() -> None:
    taken = _session[:]
    _session.clear()
    _close_all(taken[::-1])


def _close_all(objects: list[Any]) -> None:
    for obj in objects:
        try:
            close = getattr(obj, "close", None) or obj.shutdown  # an EngineCore's
            close()
        except Exception:
            log.exception("closing %r at the end of its test failed", obj)
