"""One request's output text, decoded incrementally, and its stop strings.

The engine feeds each request's new tokens to its ``IncrementalDetokenizer`` once per step;
the server streams what the detokenizer says is stable. Two offsets into the output token ids
(as vLLM's)::

    ids:   [ .......... text done .......... | window being read | new ]
           0                          prefix            read          len

Each update decodes ``ids[prefix:]`` and ``ids[prefix:read]`` and appends the difference, so
a step costs the few tokens of the window, not the whole output. The window only moves on
when its text does not end in U+FFFD (a multi-byte character still arriving), so text already
done never changes, and done + window text equals decoding every id at once (tested for
byte-level BPE, Metaspace, WordPiece and byte-fallback decoders). One exception, as in vLLM: a
byte-fallback decoder replaces a whole run of byte tokens that is not valid UTF-8 by one
U+FFFD per byte, so broken bytes may show as U+FFFD in a different number or place.

Stop strings are searched in the text that can hold a new one: from ``hold`` characters
before the previous end (``hold`` = the longest stop string's length - 1). The stop token
itself (eos or a ``stop_token_ids`` entry, found by ``Request.check_stop`` in the scheduler)
is never fed: it is not part of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"  # what an incomplete UTF-8 sequence decodes to


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """``skip_special_tokens`` as the tokenizer's; ``include_stop_str_in_output`` keeps a stop
    string found at the end of the text (vLLM's option)."""

    def __init__(
        self,
        decoder: Decoder,
        stop: Sequence[str] = (),
        *,
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._decoder = decoder
        self._skip_special = skip_special_tokens
        self._include_stop = include_stop_str_in_output
        self._stop = tuple(stop)
        self.hold = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._done = ""  # the text of ids[:read]; never changes
        self.text = ""  # the output text so far (cut before a stop string)
        self.stop_string: str | None = None  # the stop string found, if any

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stop)

    @property
    def num_tokens(self) -> int:
        """Tokens fed so far."""
        return len(self._ids)

    def update(self, new_ids: Sequence[int], check_stop: bool = True) -> str | None:
        """Decode ``new_ids`` onto the text; return the stop string that now appears in it
        (the text is cut before it, or after it with ``include_stop_str_in_output``, and the
        caller finishes the request), else None. ``check_stop=False`` (before min_tokens)
        looks for none: text before min_tokens never stops the request, as in vLLM."""
        if self.stop_string is not None:
            return None
        searched_to = max(0, len(self._done) - self.hold)  # before this no new stop can start
        self._ids.extend(new_ids)
        if new_ids:
            tail = self._decode_window()
            text = self._done + tail
        else:
            text = self.text
        for stop in self._stop if check_stop else ():  # the first stop string listed that occurs
            at = text.find(stop, searched_to)
            if at != -1:
                self.text, self.stop_string = text[: at + len(stop) * self._include_stop], stop
                return stop
        self.text = text
        return None

    def decode_token(self, token_id: int) -> str:
        """One token's text alone (a logprob's ``decoded_token``; special tokens shown)."""
        return self._decoder.decode([token_id], False)

    def stable_length(self, finished: bool) -> int:
        """How many characters of ``text`` no later update changes: all once finished; else
        the text minus the last ``hold`` characters (a stop string may still complete there
        and be cut) and minus trailing U+FFFD (a character still arriving)."""
        if finished:
            return len(self.text)
        end = len(self.text) - self.hold
        while end > 0 and self.text[end - 1] == REPLACEMENT_CHAR:
            end -= 1
        return max(0, end)

    def _decode_window(self) -> str:
        """Text of ``ids[read:]``; moves the window on when it ends on a whole character."""
        skip = self._skip_special
        prefix_text = self._decoder.decode(self._ids[self._prefix : self._read], skip)
        window_text = self._decoder.decode(self._ids[self._prefix :], skip)
        new = window_text[len(prefix_text) :]
        if window_text.endswith(REPLACEMENT_CHAR):
            return new  # not done: decoded again with the next tokens
        self._done += new
        self._prefix, self._read = self._read, len(self._ids)
        return ""
