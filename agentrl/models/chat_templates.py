"""Chat-template families, their tiny local tokenizers, and what the runner needs to know about them.

Four families, each a template written by us from the real family's documented behaviour
(``agentrl/assets/templates/``; never copied from a hub):

- ``chatml``: the tiny models' own template (``agentrl/assets/chat_template.jinja``); tool results
  are plain ``tool`` turns;
- ``qwen2_5``: ChatML with ``<tool_call>`` JSON calls and consecutive tool results grouped into one
  user turn of ``<tool_response>`` blocks;
- ``llama3``: header/``<|eot_id|>`` turns, tools described in the first user message, a call is a
  bare JSON object ``{"name": ..., "parameters": ...}``, tool results are ``ipython`` turns;
- ``qwen3``: ``qwen2_5`` plus thinking; reasoning of assistant turns before the last user query is
  stripped from the history.

``family_tokenizer(family)`` builds a byte-level BPE (vocab 1024, Qwen2's pipeline, as
``agentrl.models.train_tokenizer``) with the family's control tokens, so the tiny models can generate
with it. ``probe_history`` renders a probe conversation once per template to learn whether earlier
reasoning survives in the history; ``resolve_history`` turns ``rollout.history`` into a policy:

- ``split``: the template strips earlier reasoning, so a served model would see a different history
  than the one the policy wrote; a new training sample starts where they differ, and every sample
  keeps the model's own thinking tokens;
- ``merge``: the template keeps earlier turns verbatim, so one sample covers the whole episode.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl.models.tokenizer import TINY_MARKER

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

FAMILIES: tuple[str, ...] = ("chatml", "qwen2_5", "llama3", "qwen3")
ASSETS = Path(__file__).resolve().parents[1] / "assets"
TEMPLATES_DIR = ASSETS / "templates"
VOCAB_SIZE = 1024
"""Every family tokenizer has exactly this many ids, the tiny models' vocabulary."""

_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_LLAMA_SPECIAL = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|eom_id|>", "<|python_tag|>",
)  # fmt: skip


@dataclass(frozen=True)
class FamilySpec:
    """Control tokens of one family: ``special`` are dropped by ``skip_special_tokens``; ``added`` are
    single tokens that decode as ordinary text (as the real families' tool and think tags do)."""

    special: tuple[str, ...]
    added: tuple[str, ...]
    eos: str
    """End of turn: generation stops on it."""
    pad: str
    bos: str | None = None


SPECS: dict[str, FamilySpec] = {
    "qwen2_5": FamilySpec(_QWEN_SPECIAL, _QWEN_TOOL_TAGS, eos="<|im_end|>", pad="<|endoftext|>"),
    "qwen3": FamilySpec(
        _QWEN_SPECIAL, (*_QWEN_TOOL_TAGS, "<think>", "</think>"), eos="<|im_end|>", pad="<|endoftext|>"
    ),
    "llama3": FamilySpec(
        _LLAMA_SPECIAL, (), eos="<|eot_id|>", pad="<|end_of_text|>", bos="<|begin_of_text|>"
    ),
}


def template_path(family: str) -> Path:
    _check_family(family)
    return ASSETS / "chat_template.jinja" if family == "chatml" else TEMPLATES_DIR / f"{family}.jinja"


def family_template(family: str) -> str:
    """The Jinja chat template of ``family``."""
    return template_path(family).read_text()


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown chat-template family {family!r}; valid: {list(FAMILIES)}")


# -- tokenizers -----------------------------------------------------------------------------------
@functools.cache
def family_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A tiny tokenizer (byte-level BPE, exactly ``VOCAB_SIZE`` ids) with ``family``'s control tokens
    and chat template, trained locally in about a second and cached for the process. Deterministic.

    The returned object is shared: do not modify it. ``chatml`` is ``agentrl.models.train_tokenizer()``.
    Save with ``save_family_tokenizer`` (or ``save_pretrained``); ``agentrl.models.tokenizer.load_tokenizer``
    loads it back with identical ids."""
    # Imported here: torch and transformers take seconds, and probing a template needs neither.
    from transformers import PreTrainedTokenizerFast

    from agentrl.models.tiny import train_bpe, train_tokenizer

    _check_family(family)
    if family == "chatml":
        return train_tokenizer()
    spec, template = SPECS[family], family_template(family)
    tok = train_bpe(spec.special, spec.added, _corpus_renderer(template), VOCAB_SIZE)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token=None,
        padding_side="left",
        model_max_length=8192,
        chat_template=template,
        clean_up_tokenization_spaces=False,
        **{TINY_MARKER: True},
    )
    if len(wrapped) != VOCAB_SIZE:  # the corpus ran out of merges: a larger corpus is needed
        raise RuntimeError(f"{family} tokenizer has {len(wrapped)} ids, expected {VOCAB_SIZE}")
    return wrapped


def _corpus_renderer(template: str) -> Any:
    from transformers.utils.chat_template_utils import render_jinja_template

    def render(messages: list[dict], tools: list[dict] | None) -> str:
        rendered = render_jinja_template([messages], tools=tools, chat_template=template)  # type: ignore[arg-type]
        return rendered[0][0]

    return render


def save_family_tokenizer(family: str, out_dir: str | os.PathLike) -> Path:
    """Write ``family_tokenizer(family)`` to ``out_dir`` in HF format (it loads with
    ``agentrl.models.tokenizer.load_tokenizer``)."""
    out = Path(out_dir)
    family_tokenizer(family).save_pretrained(out)
    return out


# -- what a template does ---------------------------------------------------------------------------
def _render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def tool_call_format(tokenizer: Any) -> Literal["json", "llama3"]:
    """How the tokenizer's template writes an assistant tool call, learned by rendering one:
    ``json`` for ``<tool_call>`` markup (ChatML, Qwen), ``llama3`` for a bare JSON object with
    ``"parameters"``. The result is the ``fmt`` for ``agentrl.tools.parse_tool_calls``."""
    call = {"type": "function", "function": {"name": "probe_tool", "arguments": {"probe_arg": 7}}}
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "PROBE-QUESTION"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = _render(tokenizer, msgs, add_generation_prompt=False)
    asked = text.find("PROBE-QUESTION")
    reply = text[asked + len("PROBE-QUESTION") :] if asked >= 0 else text
    if "<tool_call>" in reply and "probe_tool" in reply:
        return "json"
    start = reply.find('{"name"')
    if start >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(reply[start:])
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and obj.get("name") == "probe_tool" and "parameters" in obj:
            return "llama3"
    raise ValueError(
        "the chat template renders an assistant tool call in neither known format (<tool_call> JSON "
        f'markup, or a bare {{"name": ..., "parameters": ...}} object); it rendered: {reply!r}'
    )


@dataclass(frozen=True)
class HistoryProbe:
    """Whether a template strips earlier reasoning, and the history policy that follows from it."""

    strips_thinking: bool
    policy: Literal["merge", "split"]
    reason: str
    """One sentence for people: what was probed or set, and why this policy."""


PROBE_REASONING, PROBE_ANSWER = "PROBE-REASONING", "PROBE-ANSWER"
_PROBE_MESSAGES = [
    {"role": "user", "content": "PROBE-QUESTION-1"},
    {"role": "assistant", "content": f"<think>\n{PROBE_REASONING}\n</think>\n\n{PROBE_ANSWER}"},
    {"role": "user", "content": "PROBE-QUESTION-2"},
]
_PROBES: dict[str, HistoryProbe] = {}


def probe_history(tokenizer: Any) -> HistoryProbe:
    """Render [user, assistant "<think>\\nPROBE-REASONING\\n</think>\\n\\nPROBE-ANSWER", user] with the
    generation prompt and check whether the earlier reasoning survives. Cached per template text."""
    template = str(getattr(tokenizer, "chat_template", None) or "")
    if template in _PROBES:
        return _PROBES[template]
    text = _render(tokenizer, _PROBE_MESSAGES, add_generation_prompt=True)
    if PROBE_ANSWER not in text:
        raise ValueError(
            f"history probe: the chat template dropped an earlier assistant answer ({PROBE_ANSWER!r}) "
            f"from the history; it rendered: {text!r}"
        )
    probed = "an earlier assistant turn with a <think> block, followed by a new user message"
    if PROBE_REASONING in text:
        probe = HistoryProbe(
            False,
            "merge",
            f"the chat template keeps the reasoning of {probed}, so the history a server shows the "
            "model equals the episode's own tokens and one sample covers the episode",
        )
    else:
        probe = HistoryProbe(
            True,
            "split",
            f"the chat template strips the reasoning of {probed}, so a server would show the model a "
            "different history; each sample keeps the model's own thinking tokens and a new sample "
            "starts where the histories differ",
        )
    _PROBES[template] = probe
    return probe


def resolve_history(setting: Literal["auto", "split", "merge"], tokenizer: Any) -> HistoryProbe:
    """The history policy for ``rollout.history``: ``auto`` follows ``probe_history``; ``split`` or
    ``merge`` is used as set, with a reason that says so."""
    if setting == "auto":
        return probe_history(tokenizer)
    if setting not in ("split", "merge"):
        raise ValueError(f"rollout.history must be 'auto', 'split' or 'merge', got {setting!r}")
    probe = probe_history(tokenizer)
    if setting == "split":
        why = "rollout.history: split was set in the config"
        if not probe.strips_thinking:
            why += " (the chat template keeps earlier reasoning, so the history alone never splits a sample)"
        return HistoryProbe(probe.strips_thinking, "split", why)
    why = "rollout.history: merge was set in the config"
    if probe.strips_thinking:
        why += (
            "; the chat template strips earlier reasoning, so the training sequence then differs "
            "from the history a server would show the model"
        )
    return HistoryProbe(probe.strips_thinking, "merge", why)
