"""The incremental detokenizer: at every step its text equals decoding the whole output at once,
each step decodes only a few tokens, and it owns stop strings (and what the server may send)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, decoders, models

from hybridkv.engine.detokenizer import IncrementalDetokenizer
from hybridkv.model.loading.tiny_tokenizer import train_tokenizer


class _Decoder:
    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.decoded_ids = 0  # ids passed to decode, in total

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decoded_ids += len(ids)
        return str(self.tok.decode(ids, skip_special_tokens=skip_special_tokens))


def _byte_level() -> Tokenizer:
    return train_tokenizer(512)  # byte-level BPE: random ids make broken UTF-8 too


def _word_level(decoder: decoders.Decoder, words: list[str]) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.decoder = decoder
    return tok


TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "byte_level": _byte_level,
    "metaspace": lambda: _word_level(
        decoders.Metaspace(), ["<unk>", "▁the", "▁cat", "s", "▁", "at", "▁é", "ß", "▁日本"]
    ),
    "wordpiece": lambda: _word_level(
        decoders.WordPiece(), ["[UNK]", "the", "cat", "##s", "##at", "play", "##ing", ",", "."]
    ),
    "byte_fallback": lambda: _word_level(
        decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()]),
        ["<unk>", "a", "b", "<0xE2>", "<0x82>", "<0xAC>", "<0xC3>", "<0xA9>", " "],
    ),
}


@pytest.mark.parametrize("name", ["byte_level", "metaspace", "wordpiece"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_text_equals_a_full_decode_at_every_step(name: str, chunk: int) -> None:
    tok = TOKENIZERS[name]()
    vocab = tok.get_vocab_size()
    for seed in range(4):
        rng = random.Random(seed)
        ids = [rng.randrange(vocab) for _ in range(240)]
        detok = IncrementalDetokenizer(_Decoder(tok))
        for end in range(chunk, len(ids) + 1, chunk):
            assert detok.update(ids[end - chunk : end]) is None
            assert detok.text == tok.decode(ids[:end]), (name, seed, end)


def test_byte_fallback_characters_arriving_byte_by_byte() -> None:
    """A byte-fallback decoder turns a run of byte tokens into U+FFFD while the run is not
    valid UTF-8 yet, so the texts are compared whenever a character is whole."""
    tok = TOKENIZERS["byte_fallback"]()
    units = [[1], [2], [8], [3, 4, 5], [6, 7]]  # "a", "b", " ", "€", "é"
    rng = random.Random(0)
    detok, ids = IncrementalDetokenizer(_Decoder(tok)), []
    for _ in range(200):
        unit = rng.choice(units)
        for token in unit:
            detok.update([token])
        ids += unit
        assert detok.text == tok.decode(ids)


class _Chars:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.calls.append(len(ids))
        return "".join(chr(i) for i in ids)


def test_each_step_decodes_a_few_tokens_however_long_the_output() -> None:
    chars = _Chars()
    detok = IncrementalDetokenizer(chars, stop=("never",))
    for i in range(4000):
        detok.update([ord("a") + i % 26])
    assert len(detok.text) == 4000
    assert max(chars.calls) <= 2  # the window, not the output


def test_stop_string_across_tokens_cuts_the_text() -> None:
    detok = IncrementalDetokenizer(_Chars(), stop=("cd",))
    assert [detok.update([ord(c)]) for c in "abc"] == [None, None, None]
    assert detok.stable_length(finished=False) == 2  # "c" may start the stop string
    assert detok.update([ord("d")]) == "cd"
    assert detok.text == "ab" and detok.stop_string == "cd"
    assert detok.update([ord("e")]) is None and detok.text == "ab"  # finished: nothing more


def test_the_first_listed_stop_string_wins() -> None:
    detok = IncrementalDetokenizer(_Chars(), stop=("zz", "b", "a"))
    assert detok.update([ord(c) for c in "xabzz"]) == "zz"
    assert detok.text == "xab"


def test_stable_length_holds_back_an_incomplete_character() -> None:
    tok = _word_level(
        decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()]),
        ["<unk>", "a", "<0xE2>", "<0x82>", "<0xAC>"],
    )
    detok = IncrementalDetokenizer(_Decoder(tok))
    detok.update([1, 2, 3])  # "a" + the first two bytes of "€"
    assert detok.text == tok.decode([1, 2, 3]) and detok.text.startswith("a\ufffd")
    assert detok.stable_length(finished=False) == 1
    detok.update([4])
    assert detok.text == "a€" and detok.stable_length(finished=False) == 2
