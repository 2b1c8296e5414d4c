"""Tiny tokenizer, chat template, tiny model building, caching and loading."""

from __future__ import annotations

import json
import unicodedata

import pytest
import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from agentrl import models
from agentrl.models import (
    PRESETS,
    build_tiny_model,
    ensure_tiny_base,
    load_policy,
    resolve_model_path,
    tiny,
    tiny_config,
    train_tokenizer,
)
from agentrl.models.tokenizer import is_tiny_tokenizer_dir, load_tokenizer

TEXTS = [
    "What is 12 + 345 * 6? The answer is \\boxed{2082}.",
    "Each friend gets \\frac{3}{4} of the pie.",
    'def f(x):\n    return x * 2\n\nfor i in range(10):\n    print(f"{i}: {f(i)}")\n',
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    "```python\nprint(2 ** 10)\n```\n```output\n1024\n```",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "café naïve 温度 математика 🙂🚀 — “quotes” ≈ √2 × π",
    "  leading spaces, trailing tabs\t\t\n\n\nand blank lines   ",
    "",
    "\x00 control \x7f chars \u200b zero width",
]


def test_special_token_ids_are_fixed_and_single(tiny_tokenizer):
    tok = tiny_tokenizer
    expected = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<tool_call>": 3, "</tool_call>": 4}
    for text, tid in expected.items():
        assert tok.encode(text, add_special_tokens=False) == [tid]
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2
    assert tok.bos_token is None
    assert len(tok) == 1024
    # skip_special_tokens drops the ChatML markers but keeps the tool-call tags (ordinary added text)
    ids = tok.encode("<|im_start|><tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_digits_are_single_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    for d in "0123456789":
        assert len(tok.encode(d, add_special_tokens=False)) == 1
    # Qwen2's split: every digit is its own pre-token, so "2024" is 4 tokens, "x=12" keeps 1 and 2 apart
    assert tok.convert_ids_to_tokens(tok.encode("2024", add_special_tokens=False)) == ["2", "0", "2", "4"]
    toks = tok.convert_ids_to_tokens(tok.encode("x = 12", add_special_tokens=False))
    assert toks[-2:] == ["1", "2"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_encode_round_trip(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


def test_nfc_normalisation_is_the_only_change(tiny_tokenizer):
    # Qwen2's normalizer is NFC: a decomposed "é" (e + combining acute) comes back composed.
    decomposed = "cafe\u0301"
    ids = tiny_tokenizer.encode(decomposed, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == unicodedata.normalize("NFC", decomposed) == "caf\u00e9"


def test_common_markup_is_compact(tiny_tokenizer):
    # The corpus covers chat markup and code: role names and keywords are single tokens.
    tok = tiny_tokenizer
    for word in [
        "assistant",
        "user",
        "system",
        "tool",
        "print",
        "import",
        "def",
        "python",
        "arguments",
        "boxed",
        "frac",
    ]:
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word


def test_training_is_deterministic(tiny_tokenizer):
    again = train_tokenizer()
    assert again.get_vocab() == tiny_tokenizer.get_vocab()
    assert again.backend_tokenizer.to_str() == tiny_tokenizer.backend_tokenizer.to_str()


def test_save_load_gives_identical_ids(tiny_model_dir, tiny_tokenizer):
    assert is_tiny_tokenizer_dir(tiny_model_dir)
    loaded = load_tokenizer(tiny_model_dir)
    # AutoTokenizer maps model_type=qwen2 to Qwen2Tokenizer, which rebuilds the pipeline from the
    # vocabulary: because we trained with Qwen2's exact normalizer and pre-tokenizer it agrees too.
    auto = AutoTokenizer.from_pretrained(tiny_model_dir)
    for text in TEXTS:
        want = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == want
        assert auto.encode(text, add_special_tokens=False) == want
    assert loaded.chat_template == tiny_tokenizer.chat_template


# -- chat template ------------------------------------------------------------------------------
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+3?"},
    {
        "role": "assistant",
        "content": 'I will add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
    },
    {"role": "tool", "name": "add", "content": "5"},
    {"role": "assistant", "content": "\\boxed{5}"},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "You are welcome."},
]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def render(tok, messages, tools=None, gen=False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


def test_template_renders_chatml_exactly(tiny_tokenizer):
    got = render(tiny_tokenizer, CONVERSATION[:4], gen=True)
    want = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        '<|im_start|>assistant\nI will add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n5<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert got == want


def test_template_with_tools_merges_system_and_lists_schemas(tiny_tokenizer):
    got = render(tiny_tokenizer, CONVERSATION[:2], tools=TOOLS)
    assert got.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert (
        '\n{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}\n</tools>'
        in got
    )
    assert "<tool_call>" in got
    assert got.count("<|im_start|>system") == 1  # the caller's system message is merged, not repeated
    assert got.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n")
    # Without a system message the tools block still comes first.
    assert render(tiny_tokenizer, CONVERSATION[1:2], tools=TOOLS).startswith("<|im_start|>system\n# Tools\n")


def test_structured_tool_calls_render_like_the_text_format(tiny_tokenizer):
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}],
    }
    got = render(tiny_tokenizer, [msg])
    assert (
        got
        == '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call><|im_end|>\n'
    )


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_is_prefix_stable(tiny_tokenizer, tools):
    """Rendering up to a non-assistant message with the generation prompt is a prefix (as text and as
    token ids) of rendering the conversation with the assistant reply that follows."""
    tok = tiny_tokenizer
    checked = 0
    for k in range(1, len(CONVERSATION)):
        if CONVERSATION[k]["role"] != "assistant" or CONVERSATION[k - 1]["role"] == "assistant":
            continue
        head = render(tok, CONVERSATION[:k], tools, gen=True)
        for end in range(k + 1, len(CONVERSATION) + 1):
            full = render(tok, CONVERSATION[:end], tools)
            assert full.startswith(head)
            head_ids = tok.encode(head, add_special_tokens=False)
            assert tok.encode(full, add_special_tokens=False)[: len(head_ids)] == head_ids
        checked += 1
    assert checked == 3  # replies at positions 2, 4 and 6


# -- tiny models --------------------------------------------------------------------------------
def test_preset_parameter_counts(tiny_tokenizer):
    # h128-L8 by hand: per layer q 128*128+128, k and v 128*64+64 each, o 128*128, MLP 3*128*448,
    # two norms 2*128 -> 221,696; x8 = 1,773,568; + embeddings and untied head 2*1024*128 + final norm 128
    # = 2,035,840. h128-L4: 4 * 221,696 + 262,272 = 1,149,056.
    want = {"h128-L8": 2_035_840, "h128-L4": 1_149_056, "h384-L7": 15_419_392, "h640-L12": 60_319_872}
    for name, shape in PRESETS.items():
        with torch.device("meta"):
            model = Qwen2ForCausalLM(tiny_config(shape, tiny_tokenizer))
        assert models.count_parameters(model) == want[name], name


def test_built_model_config(tiny_model_dir):
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert cfg["tie_word_embeddings"] is False
    assert cfg["vocab_size"] == 1024 and cfg["eos_token_id"] == 2 and cfg["pad_token_id"] == 0
    assert cfg["max_position_embeddings"] == 8192
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 128


def test_build_is_seeded(tmp_path, tiny_tokenizer, tiny_model_dir):
    again = build_tiny_model(tmp_path / "a", num_layers=2, tokenizer=tiny_tokenizer, seed=0)
    other = build_tiny_model(tmp_path / "b", num_layers=2, tokenizer=tiny_tokenizer, seed=1)
    m0, _ = load_policy(tiny_model_dir)
    m1, _ = load_policy(again)
    m2, _ = load_policy(other)
    for (name, p0), p1, p2 in zip(
        m0.state_dict().items(), m1.state_dict().values(), m2.state_dict().values()
    ):
        assert torch.equal(p0, p1), name
        if name.endswith("proj.weight"):
            assert not torch.equal(p0, p2), name
    assert not torch.equal(m0.lm_head.weight, m0.model.embed_tokens.weight)  # untied


def test_load_policy_dtype_and_tokenizer_class(tiny_model_dir):
    model, tok = load_policy(tiny_model_dir, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert type(tok).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    ids = torch.tensor([tok.encode("1 + 1 = 2")])
    assert model(ids).logits.shape == (1, 7, 1024)  # "1"," +"," ","1"," ="," ","2": digits split
    with pytest.raises(ValueError, match="unknown dtype"):
        load_policy(tiny_model_dir, dtype="float8")


def test_ensure_tiny_base_builds_once_and_resolves(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    path = ensure_tiny_base("h128-L8")
    assert path.parent == tmp_path / "tiny" and (path / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == [path.name]  # no temp dir left behind

    def no_rebuild(*a, **k):
        raise AssertionError("the cached model must be reused")

    monkeypatch.setattr(tiny, "build_tiny_model", no_rebuild)
    assert ensure_tiny_base("h128-L8") == path
    assert resolve_model_path("tiny:h128-L8") == str(path)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    model, tok = load_policy("tiny:h128-L8")
    assert model.config.num_hidden_layers == 8 and len(tok) == 1024
    with pytest.raises(ValueError, match="unknown tiny preset"):
        ensure_tiny_base("h1-L1")
