"""Drift: where an episode's stored token ids differ from a full chat-template render of its
messages, and why. The agent runner checks a client's edited history with these (``agent_ledger``);
``agentrl doctor`` reports them for whole transcripts.

The runner never re-tokenizes: it keeps the ids the engine sampled and renders observations as
deltas. A framework that instead re-renders the conversation with the chat template before training
would train on different tokens than the policy produced. Each differing region is classified
(first match wins):

- ``retokenized``: same text, different token split (the classic decode-then-encode drift);
- ``reasoning``: a <think>...</think> block present on one side only (templates strip reasoning
  from earlier assistant turns);
- ``eot_whitespace``: whitespace next to an end-of-turn token (e.g. the "\\n" the template writes
  after <|im_end|>, which a policy that stopped on <|im_end|> never produced);
- ``whitespace``: other whitespace-only differences;
- ``tool_grouping``: only chat structure differs around tool calls/outputs (the template merges
  consecutive tool messages into one turn, or splits them);
- ``other``.

A region touches a policy token when it replaces or deletes a token whose stored role is ``policy``,
or inserts inside a policy segment. An episode split into several training samples
(``Episode.sample_breaks``: a thinking template's history, or an agent's drifting client) is checked
per sample: each sample's ids against the render of the messages it covers, up to its last assistant
turn (the observation after it opens the next sample).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.episode import Episode, Segment
from agentrl.models.history import history_pieces

DRIFT_KINDS = ("retokenized", "reasoning", "eot_whitespace", "whitespace", "tool_grouping", "other")
_EOT_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<|endoftext|>", "<end_of_turn>")
_TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "tool")
_ROLE_WORDS = re.compile(r"\b(system|user|assistant|tool|ipython)\b")
_MERGE_GAP = 2
"""Differing regions separated by at most this many equal tokens are one region: the matcher
sometimes anchors a deleted block on a stray shared token (a newline) in its middle."""


@dataclass
class Drift:
    kind: str
    stored: tuple[int, int]
    """Token range [start, end) in the stored ids."""
    rendered: tuple[int, int]
    stored_text: str
    rendered_text: str
    roles: list[str]
    """Distinct stored roles inside the region (for an insertion: the roles on either side)."""
    touches_policy: bool
    sample: int = 0
    """Which training sample of the episode (0 unless it was split); the token ranges are that
    sample's."""


@dataclass
class Diagnosis:
    episode_id: str
    drifts: list[Drift] = field(default_factory=list)
    error: str | None = None
    samples: int = 1

    @property
    def policy_drift(self) -> bool:
        return any(d.touches_policy for d in self.drifts)


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: Sequence[dict] | None) -> list[int]:
    """Token ids of a full chat-template render (generation prompt when the last turn is not ours)."""
    gen = bool(messages) and messages[-1].get("role") != "assistant"
    out = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=True, add_generation_prompt=gen
    )
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(t) for t in out]


def regions(stored: list[int], rendered: list[int]) -> list[tuple[int, int, int, int]]:
    """The differing regions [i1, i2) of ``stored`` and [j1, j2) of ``rendered``, near ones merged."""
    sm = difflib.SequenceMatcher(None, stored, rendered, autojunk=False)
    out: list[list[int]] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        if out and i1 - out[-1][1] <= _MERGE_GAP and j1 - out[-1][3] <= _MERGE_GAP:
            out[-1][1], out[-1][3] = i2, j2
        else:
            out.append([i1, i2, j1, j2])
    return [(a, b, c, d) for a, b, c, d in out]


def _squash(s: str) -> str:
    return "".join(s.split())


def _structure_residue(text: str, specials: Sequence[str]) -> str:
    for sp in sorted(set(specials) | set(_TOOL_MARKERS[:4]), key=len, reverse=True):
        text = text.replace(sp, "")
    return _squash(_ROLE_WORDS.sub("", text))


def classify(stored_text: str, rendered_text: str, before: str, after: str, specials: Sequence[str]) -> str:
    """The drift class of one region; ``before``/``after`` are a few tokens of context as text."""
    s, r = stored_text, rendered_text
    if s == r:
        return "retokenized"
    if any((m in s) != (m in r) for m in ("<think>", "</think>")):
        return "reasoning"
    if _squash(s) == _squash(r):
        near_eot = any(before.endswith(t) or after.startswith(t) or t in s + r for t in _EOT_TOKENS)
        return "eot_whitespace" if near_eot else "whitespace"
    context = before + s + r + after
    if any(m in context for m in _TOOL_MARKERS) and _structure_residue(s, specials) == _structure_residue(
        r, specials
    ):
        return "tool_grouping"
    return "other"


def _control_tokens(tokenizer: Any) -> list[str]:
    """Special and added tokens (role markers, end-of-turn, tool tags) as text."""
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    get_added = getattr(tokenizer, "get_added_vocab", None)
    if callable(get_added):
        out |= set(get_added())
    return sorted(out)


def diagnose(episode: Episode, tokenizer: Any, context: int = 6) -> Diagnosis:
    """Compare one episode's stored ids with the template's render of its messages, per sample."""
    diag = Diagnosis(episode.id, samples=episode.num_samples)
    if not episode.messages:
        diag.error = "no messages stored"
        return diag
    views = episode.sample_views()
    for k, view in enumerate(views):
        messages = view.messages
        if k < len(views) - 1:  # the observation that opened the next sample is not in this one
            while messages and messages[-1].get("role") != "assistant":
                messages = messages[:-1]
        try:
            diag.drifts += _drifts(view, messages, tokenizer, context, sample=k)
        except Exception as e:  # a template that rejects the conversation is a finding, not a crash
            where = f" (sample {k})" if len(views) > 1 else ""
            diag.error = f"chat template failed{where}: {type(e).__name__}: {e}"
            return diag
    return diag


def _drifts(
    view: Episode, messages: list[dict[str, Any]], tokenizer: Any, context: int, sample: int
) -> list[Drift]:
    # tools placed in the system message (metrics.tools_prompt) are in the messages already
    tools = None if view.metrics.get("tools_prompt") == "system" else view.metrics.get("tools")
    rendered = render_ids(tokenizer, messages, tools)
    stored, roles = view.token_ids(), view.roles()
    specials = _control_tokens(tokenizer)

    def dec(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False) if ids else ""

    drifts = []
    for i1, i2, j1, j2 in regions(stored, rendered):
        s_text, r_text = dec(stored[i1:i2]), dec(rendered[j1:j2])
        kind = classify(
            s_text, r_text, dec(stored[max(0, i1 - context) : i1]), dec(stored[i2 : i2 + context]), specials
        )
        if i1 < i2:
            region_roles = roles[i1:i2]
            touches = "policy" in region_roles
        else:  # an insertion: it changes policy tokens only when it lands inside a policy segment
            region_roles = roles[max(0, i1 - 1) : i1 + 1]
            touches = 0 < i1 < len(roles) and roles[i1 - 1] == roles[i1] == "policy"
        drifts.append(
            Drift(kind, (i1, i2), (j1, j2), s_text, r_text, sorted(set(region_roles)), touches, sample)
        )
    return drifts


def drift_kind(
    tokenizer: Any, ours: list[dict[str, Any]], our_tools: Any, theirs: list[dict[str, Any]], tools: Any
) -> str:
    """The class of the first region where two histories (the agent runner's ledger and a client's
    request) render differently; ``other`` when their common messages render alike (the client
    dropped or added turns)."""
    n = min(len(ours), len(theirs))
    try:
        a = render_ids(tokenizer, ours[:n] if n else ours, our_tools)
        b = render_ids(tokenizer, theirs[:n] if n else theirs, tools)
    except Exception as e:  # a history the template rejects is still a drift
        return f"other ({type(e).__name__})"
    differ = regions(a, b)
    if not differ:
        return "other"
    i1, i2, j1, j2 = differ[0]
    dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    specials = list(getattr(tokenizer, "all_special_tokens", []))
    return classify(dec(a[i1:i2]), dec(b[j1:j2]), dec(a[max(0, i1 - 6) : i1]), dec(a[i2 : i2 + 6]), specials)


def rebase(
    ep: Episode,
    action: str,
    kind: str,
    renderer: Any,
    messages: list[dict[str, Any]],
    turn: int,
    before: list[dict[str, Any]],
    tools_before: Any,
    tokenizer: Any,
) -> dict[str, int]:
    """Continue an episode from a client's edited history (``proxy.on_drift``): ``split`` starts a new
    training sample prompted with ``messages`` (the earlier sample keeps its own history, ``before``,
    and its tools when they changed); ``retokenize`` re-renders them into the current sample."""
    if action == "split":
        ep.begin_sample(len(messages), f"drift:{kind}", before=list(before), tools_before=tools_before)
        for p in history_pieces(renderer, messages):
            ep.add(Segment(p.role, turn, p.token_ids, p.text))  # type: ignore[arg-type]
        return {}
    return retokenize(tokenizer, ep, renderer, messages)


def retokenize(tokenizer: Any, ep: Episode, renderer: Any, messages: list[dict[str, Any]]) -> dict[str, int]:
    """Replace the episode's current sample with the template's render of ``messages``, keeping the
    policy's tokens (role, log-prob, version, turn) wherever they survive unchanged (aligned by
    ``difflib``); every other token becomes prompt (or tool, for tool outputs)."""
    start = ep.sample_breaks[-1]["segment"] if ep.sample_breaks else 0
    old: list[tuple[int, Segment, int]] = [
        (t, s, k) for s in ep.segments[start:] for k, t in enumerate(s.token_ids)
    ]
    new: list[tuple[int, str]] = [
        (t, p.role) for p in history_pieces(renderer, messages) for t in p.token_ids
    ]
    kept: dict[int, tuple[Segment, int]] = {}
    sm = difflib.SequenceMatcher(None, [t for t, _, _ in old], [t for t, _ in new], autojunk=False)
    for block in sm.get_matching_blocks():
        if block.size < 4:  # a stray one-token match could put a policy label on a tool's token
            continue
        for d in range(block.size):
            _, seg, k = old[block.a + d]
            if seg.role == "policy":
                kept[block.b + d] = (seg, k)
    segments: list[Segment] = []
    turn = 0
    for j, (tok, role) in enumerate(new):
        seg_k = kept.get(j)
        if seg_k is not None:
            seg, k = seg_k
            turn = seg.turn
            assert seg.logprobs is not None
            piece = Segment("policy", turn, [tok], "", [seg.logprobs[k]], seg.weight_version)
        else:
            piece = Segment(role, turn, [tok], "")  # type: ignore[arg-type]
        last = segments[-1] if segments else None
        if last and (last.role, last.turn, last.weight_version) == (
            piece.role,
            piece.turn,
            piece.weight_version,
        ):
            last.token_ids += piece.token_ids
            if last.logprobs is not None and piece.logprobs is not None:
                last.logprobs += piece.logprobs
        else:
            segments.append(piece)
    for s in segments:
        s.text = tokenizer.decode(s.token_ids, skip_special_tokens=False)
    before = sum(len(s.token_ids) for s in ep.segments[start:] if s.role == "policy")
    ep.segments[start:] = segments
    return {"policy_tokens_kept": len(kept), "policy_tokens_dropped": before - len(kept)}
