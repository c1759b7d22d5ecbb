"""The offline API as a vLLM user writes it: a vLLM script's ``get_tokenizer()`` and ``chat``
calls run with only its import changed; ``chat`` options, templates' helpers,
``generation_config.json`` defaults, ``inputs.TokensPrompt``, the progress bar's token rates,
vLLM's dtype and CLI names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.inputs import TextPrompt, TokensPrompt
from tests.cli.helpers import run_cli
from tests.support.lifetimes import track

VLLM_SCRIPT = """
from vllm import LLM, SamplingParams

llm = LLM(model=MODEL, kv_cache_memory="64MiB")
tokenizer = llm.get_tokenizer()
messages = [{"role": "user", "content": "Hi"}]
text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
ids = tokenizer.encode(text, add_special_tokens=False)
assert tokenizer.decode(ids, skip_special_tokens=False) == text
assert tokenizer(text)["input_ids"] and tokenizer.eos_token_id is not None
chat = llm.chat(messages, SamplingParams(max_tokens=3, temperature=0),
                chat_template_kwargs={"enable_thinking": False})
RESULT = chat[0].outputs[0].text
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hybridkv.model.loading.make_model import make_model

    return make_model("granitemoehybrid", tmp_path_factory.mktemp("model"), size="tiny", seed=0)


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return track(LLM(str(model_dir), kv_cache_memory="64MiB"))


def test_a_vllm_scripts_tokenizer_and_chat_calls_run(model_dir: Path) -> None:
    """The quickstart and logprobs parts are tests/engine/test_vllm_script.py's."""
    source = VLLM_SCRIPT.replace("from vllm import", "from hybridkv import")
    scope: dict[str, Any] = {"MODEL": str(model_dir)}
    exec(compile(source, "vllm_quickstart.py", "exec"), scope)
    assert isinstance(scope["RESULT"], str)


def test_prompt_types_and_progress_bar(llm: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    ids = llm.get_tokenizer().encode("Once upon a time")
    prompts: list[Any] = [TextPrompt(prompt="Once upon a time"), TokensPrompt(prompt_token_ids=ids)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0), use_tqdm=True)
    assert outs[0].token_ids == outs[1].token_ids
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "est. speed input:" in err and "toks/s" in err


def test_chat_content_parts_and_continue_final_message(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]  # fmt: skip
    joined = [{"role": "user", "content": "a\nb"}]
    assert tok.apply_chat_template(parts) == tok.apply_chat_template(joined)
    with pytest.raises(ValueError, match="image_url"):
        llm.chat([{"role": "user", "content": [{"type": "image_url"}]}])
    partial = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    text = tok.apply_chat_template(partial, add_generation_prompt=False,
                                   continue_final_message=True)  # fmt: skip
    assert text.endswith("Sure,")


def test_template_helpers_and_chat_template_option(llm: LLM, tmp_path: Path) -> None:
    tok = llm.get_tokenizer()
    source = (
        "{{ strftime_now('%Y') }}|{% for m in messages %}{% generation %}{{ m['content'] }}"
        "{% endgeneration %}{% if loop.index == 1 %}{% break %}{% endif %}{% endfor %}"
        "|{{ tools | tojson }}|{{ enable_thinking }}"
        "{% if messages | length > 2 %}{{ raise_exception('too many') }}{% endif %}"
    )
    path = tmp_path / "template.jinja"
    path.write_text(source)
    tok.set_chat_template(str(path))
    try:
        messages = [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
        text = tok.apply_chat_template(messages, tools=[{"name": "é"}], enable_thinking=False)
        year, body, tools, thinking = text.split("|")
        assert len(year) == 4 and body == "x" and tools == '[{"name": "é"}]'
        assert thinking == "False"
        with pytest.raises(ValueError, match="too many"):
            tok.apply_chat_template(messages * 2)
    finally:
        tok.set_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ValueError, match="no such file"):
        tok.set_chat_template("missing.jinja")


def test_generation_config_defaults(model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    config |= {"temperature": 0.0, "max_new_tokens": 3, "top_k": 5}
    (model / "generation_config.json").write_text(json.dumps(config))
    llm = LLM(str(model), kv_cache_memory="64MiB")
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens, defaults.top_k) == (0.0, 3, 5)
    out = llm.generate(["Once upon a time"], use_tqdm=False)[0]
    assert len(out.token_ids) == 3
    plain = LLM(str(model), kv_cache_memory="64MiB", generation_config="vllm")
    assert plain.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ValueError, match="generation-config"):
        LLM(str(model), kv_cache_memory="64MiB", generation_config=str(tmp_path / "nope"))


def test_dtype_names(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="bfloat16"):
        LLM(str(model_dir), dtype="half")
    assert LLM(str(model_dir), dtype="float", kv_cache_memory="64MiB").engine.dtype == "float32"


def test_cli_names(model_dir: Path) -> None:
    from hybridkv import __version__

    assert run_cli("--version").stdout.strip() == f"hybridkv {__version__}"
    done = run_cli("serve", model_dir, "--dtype", "float16")
    assert done.returncode == 2 and "float16" in done.stderr and "bfloat16" in done.stderr
    done = run_cli("serve", model_dir, "--model", "/elsewhere")
    assert done.returncode == 2 and "two models" in done.stderr
    help_text = run_cli("serve", "--help").stdout
    for flag in ("MODEL", "--served-model-name", "--tokenizer", "--chat-template",
                 "--generation-config", "--max-logprobs", "--disable-log-requests",
                 "--log-level", "--uvicorn-log-level"):  # fmt: skip
        assert flag in help_text


def test_chat_adds_no_special_tokens_the_template_did_not_write(
    model_dir: Path, tmp_path: Path
) -> None:
    """A tokenizer that adds BOS to every text: chat prompts get none on top of the template's
    (vLLM's and transformers' rule), plain prompts get it."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.processors import TemplateProcessing

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    hf = HFTokenizer.from_file(str(model / "tokenizer.json"))
    bos = hf.id_to_token(1)
    hf.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 1)])
    hf.save(str(model / "tokenizer.json"))
    llm = LLM(str(model), kv_cache_memory="64MiB")
    messages = [{"role": "user", "content": "hi"}]
    text = llm.get_tokenizer().apply_chat_template(messages)
    out = llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.prompt_token_ids == llm.get_tokenizer().encode(text, add_special_tokens=False)
    plain = llm.generate([text], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert plain.prompt_token_ids == [1, *out.prompt_token_ids]


def test_tokenizer_option(model_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "tokenizer"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, other / name)
    (other / "chat_template.jinja").write_text("X{{ messages[0]['content'] }}")
    llm = LLM(str(model_dir), kv_cache_memory="64MiB", tokenizer=str(other))
    assert llm.get_tokenizer().apply_chat_template([{"role": "user", "content": "hi"}]) == "Xhi"
    out = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1))[0]
    assert out.prompt == "Xhi"


def test_tokenizer_option_reaches_structured_outputs(model_dir: Path, tmp_path: Path) -> None:
    """Grammars are compiled for ``--tokenizer``'s vocabulary, not the model directory's:
    once the engine is up, the model's own tokenizer.json is unreadable, and a constrained
    request still compiles and answers one of the choices."""
    from hybridkv import StructuredOutputsParams

    model, other = tmp_path / "model", tmp_path / "tokenizer"
    shutil.copytree(model_dir, model)
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, other / name)
    llm = LLM(str(model), kv_cache_memory="64MiB", tokenizer=str(other))
    (model / "tokenizer.json").write_text("not a tokenizer")
    choice = StructuredOutputsParams(choice=["yes", "no"])
    params = SamplingParams(max_tokens=4, structured_outputs=choice)
    out = llm.generate(["Answer:"], params, use_tqdm=False)[0]
    assert out.outputs[0].text in ("yes", "no")
