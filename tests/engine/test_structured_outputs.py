"""Structured outputs on llguidance: the grammar bitmask forces valid output even from a tiny
random model. JSON under a schema (validated by hand: the schema is small and closed), regex
and choice, seeded; bad constraints fail at add with the field named."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hybridkv import SamplingParams, StructuredOutputsParams
from tests.engine.helpers import assert_no_leaks, make_llm, random_ids

pytestmark = pytest.mark.slow
ARCH = "granitemoehybrid"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"enum": ["ann", "bob", "cache block"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


def _valid(value: Any) -> bool:
    """The schema above, checked by hand."""
    props = SCHEMA["properties"]
    return (
        isinstance(value, dict)
        and set(SCHEMA["required"]) <= set(value) <= set(props)
        and value["name"] in props["name"]["enum"]
        and type(value["age"]) is int
        and 0 <= value["age"] <= 99
        and isinstance(value["ok"], bool)
        and isinstance(value.get("tags", []), list)
        and len(value.get("tags", [])) <= 2
        and all(t in ("a", "b") for t in value.get("tags", []))
    )


@pytest.fixture(scope="module")
def model_dir(checkpoints: dict[str, Path]) -> Path:
    return checkpoints[ARCH]


def test_100_seeded_json_generations_parse_and_validate(checkpoints: dict[str, Path]) -> None:
    model_dir = checkpoints["qwen3"]  # the fastest tiny model: 100 requests in one batch
    llm = make_llm(model_dir, max_num_seqs=100)
    constraint = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = [SamplingParams(seed=s, max_tokens=60, structured_outputs=constraint)
              for s in range(100)]  # fmt: skip
    outs = llm.generate([random_ids(8, 80)] * 100, params, use_tqdm=False)
    values = [json.loads(o.text) for o in outs]
    assert all(o.finish_reason == "stop" for o in outs)
    assert all(_valid(v) for v in values)
    assert len({json.dumps(v) for v in values}) > 10  # it samples, within the schema
    again = make_llm(model_dir).generate([random_ids(8, 80)] * 3, params[:3], use_tqdm=False)
    assert [o.text for o in again] == [o.text for o in outs[:3]]
    assert_no_leaks(llm.engine)


def test_regex_and_choice_always_match(model_dir: Path) -> None:
    llm = make_llm(model_dir, max_num_seqs=64)
    pattern = r"(cache|block) [0-9]{2}-[a-z]{1,4}"
    choices = ["the cache", "a block", "yes", "no"]
    regex = StructuredOutputsParams(regex=pattern)
    choice = StructuredOutputsParams(choice=choices)
    params = [SamplingParams(seed=s, max_tokens=30, structured_outputs=c)
              for s in range(30) for c in (regex, choice)]  # fmt: skip
    outs = llm.generate([random_ids(10, 81)] * len(params), params, use_tqdm=False)
    for out, p in zip(outs, params, strict=True):
        assert p.structured_outputs is not None
        if p.structured_outputs.regex:
            assert re.fullmatch(pattern, out.text), out.text
        else:
            assert out.text in choices, out.text
    assert len({o.text for o in outs[1::2]}) > 1


def test_json_object_grammar_and_mixed_batch(model_dir: Path) -> None:
    """An unconstrained request beside constrained ones is unaffected (the mask is per row)."""
    llm = make_llm(model_dir)
    plain = SamplingParams(temperature=0.0, max_tokens=8)
    alone = llm.generate([random_ids(12, 82)], plain, use_tqdm=False)[0]
    grammar = 'start: "x" ("y" | "z")+ "!"'
    params = [
        plain,
        SamplingParams(seed=1, max_tokens=20, structured_outputs=StructuredOutputsParams(
            grammar=grammar)),
        SamplingParams(seed=2, max_tokens=40, structured_outputs=StructuredOutputsParams(
            json_object=True, disable_any_whitespace=True)),
    ]  # fmt: skip
    outs = llm.generate([random_ids(12, 82), random_ids(5, 83), random_ids(5, 84)], params,
                        use_tqdm=False)  # fmt: skip
    assert outs[0].token_ids == alone.token_ids
    assert re.fullmatch(r"x[yz]+!", outs[1].text), outs[1].text
    if outs[2].finish_reason == "stop":  # any object; may be cut by max_tokens
        assert isinstance(json.loads(outs[2].text), dict)
    else:
        assert outs[2].text.startswith("{")


@pytest.mark.parametrize(
    "constraint",
    [{"regex": "("}, {"grammar": "start: foo"}, {"json": {"type": "nonsense"}}],
)
def test_a_bad_constraint_fails_the_request_naming_it(
    model_dir: Path, constraint: dict[str, Any]
) -> None:
    llm = make_llm(model_dir)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))
    out = llm.generate([random_ids(5, 85)], params, use_tqdm=False)[0]
    assert out.finish_reason == "error" and out.error is not None
    assert f"structured_outputs.{next(iter(constraint))}" in out.error


def test_constraint_params_are_checked() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="structured_outputs.choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="structured_outputs.json"):
        StructuredOutputsParams(json="{not json")
