"""What the model reads of a tool's output: a 5 MB output is cut by characters before it is tokenized
(it read as the whole output cut to the token limit), and ``bytes`` are decoded."""

from __future__ import annotations

import warnings

import pytest

from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Environment, Task, tool
from agentrl.models.chat import ChatRenderer, Piece
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.rollout.tool_output import LongToolOutputWarning, cut_bounds, truncate_output
from agentrl.tools import format_tool_call
from tests.helpers.invariants import check_invariants

CAP = 40  # max_tool_output_tokens: cut_bounds(40) = (48 * 256, 18 * 256) = (12,288, 4,608) characters


def log_lines(chars: int) -> str:
    """``chars`` characters of a varied log, as a tool that prints a big file returns."""
    lines = (f"row {i}: value={i * 7919 % 10007} ok\n" for i in range(chars // 10 + 1))
    text = "".join(lines)[:chars]
    assert len(text) == chars
    return text


class Logs(Environment):
    name = "test_logs"

    @tool
    def read_log(self, chars: int) -> str:
        """A log of ``chars`` characters.

        Args:
            chars: how long.
        """
        return log_lines(chars)

    @tool
    def dump_log(self, chars: int) -> str:
        """The same log, by another name (warned about once, in one test only).

        Args:
            chars: how long.
        """
        return log_lines(chars)

    @tool
    def raw(self, ok: bool) -> bytes:
        """Bytes, UTF-8 or not.

        Args:
            ok: UTF-8 bytes or not.
        """
        return "525 °C".encode() if ok else b"\xff\xfe525"


def call(name, **args):
    return format_tool_call(name, args) + "<|im_end|>"


def run_one(tokenizer, turns, cap=CAP):
    engine = ScriptedEngine([*turns, "\\boxed{1}<|im_end|>"], tokenizer=tokenizer)
    settings = RunnerSettings(
        budgets=Budgets(max_turns=8, max_tool_output_tokens=cap, max_episode_tokens=4000)
    )
    runner = EpisodeRunner(engine, tokenizer, Logs, settings)
    try:
        (ep,) = runner.run([EpisodeRequest(Task(id="t", prompt="Read the log."), seed=0)])
    finally:
        runner.close()
    return ep


class RecordingTokenizer:
    """The tiny tokenizer, recording the longest text it is asked to tokenize. Without a
    ``backend_tokenizer`` the renderer encodes through ``__call__``."""

    backend_tokenizer = None

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.longest = 0

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self._tokenizer(text, **kwargs)

    def encode(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self._tokenizer.encode(text, **kwargs)


def test_a_5mb_tool_output_is_cut_by_characters_before_it_is_tokenized(tiny_tokenizer):
    # The trial's tool returned 5 MB and each step took 100 times longer: all 5 MB were tokenized to
    # keep 256 tokens. Tokenized now: the head and tail of cut_bounds plus the marker between them.
    recording = RecordingTokenizer(tiny_tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ep = run_one(recording, [call("dump_log", chars=5_000_000)] * 2)
    head, tail = cut_bounds(CAP)
    marker = len("\n...[5000000 characters, truncated]...\n")
    assert 0 < recording.longest <= head + tail + marker  # 16,935 of 5,000,000 characters
    assert ep.failure is None and ep.stop_reason == "answered"
    outputs = [s for s in ep.segments if s.role == "tool"]
    assert [len(s.token_ids) for s in outputs] == [CAP, CAP]
    assert "[5000000 characters, truncated]" in outputs[0].text and outputs[0].text.startswith("row 0:")
    long = [w for w in caught if issubclass(w.category, LongToolOutputWarning)]
    assert len(long) == 1  # the same tool twice: one warning
    assert "tool 'dump_log' returned 5,000,000 characters" in str(long[0].message)
    check_invariants(ep, tiny_tokenizer)


def test_an_output_cut_by_characters_reads_as_the_whole_output_cut_to_the_token_limit(tiny_tokenizer):
    # 200,000 characters > 12,288 + 4,608: cut by characters. The model must read what the whole
    # output, tokenized and cut to CAP tokens (with the same marker), would have given it.
    out = log_lines(200_000)
    with pytest.warns(LongToolOutputWarning, match="tool 'read_log' returned 200,000 characters"):
        ep = run_one(tiny_tokenizer, [call("read_log", chars=200_000)])
    (whole,) = [
        p for p in ChatRenderer(tiny_tokenizer).render_observation([tool_msg(out)]) if p.role == "tool"
    ]
    assert len(whole.token_ids) > 100_000  # about 1.4 characters a token
    want = truncate_output(tiny_tokenizer, whole, CAP, chars=len(out))
    (seg,) = [s for s in ep.segments if s.role == "tool"]
    assert seg.token_ids == want.token_ids and seg.text == want.text
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == [want.text]


def test_outputs_under_the_character_bound_are_cut_by_tokens_as_before(tiny_tokenizer):
    # 16,000 characters <= 12,288 + 4,608: tokenized whole, the marker counts tokens.
    out = log_lines(16_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LongToolOutputWarning)
        ep = run_one(tiny_tokenizer, [call("read_log", chars=16_000)])
    (whole,) = [
        p for p in ChatRenderer(tiny_tokenizer).render_observation([tool_msg(out)]) if p.role == "tool"
    ]
    (seg,) = [s for s in ep.segments if s.role == "tool"]
    assert seg.token_ids == truncate_output(tiny_tokenizer, whole, CAP).token_ids
    assert f"[{len(whole.token_ids)} tokens, truncated]" in seg.text


def tool_msg(content: str) -> dict:
    return {"role": "tool", "name": "read_log", "content": content}


def test_truncating_an_output_under_the_limit_that_was_cut_by_characters_still_marks_it(tiny_tokenizer):
    # A cut output always shows the marker, even if (with an odd tokenizer) it has few tokens left;
    # head and tail never overlap.
    ids = tiny_tokenizer("short", add_special_tokens=False)["input_ids"]
    got = truncate_output(tiny_tokenizer, Piece("tool", ids, "short", 0), 200, chars=9_000_000)
    assert "[9000000 characters, truncated]" in got.text
    assert got.text.count("short") <= 1 and len(got.token_ids) <= 200


def test_a_tool_returning_bytes_reads_as_text(tiny_tokenizer):
    # The trial's tool returned b"525" and the model read "b'525'".
    ep = run_one(tiny_tokenizer, [call("raw", ok=True)])
    assert ep.failure is None
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == ["525 °C"]


def test_a_tool_returning_bytes_that_are_not_utf8_fails_at_the_tool_boundary(tiny_tokenizer):
    ep = run_one(tiny_tokenizer, [call("raw", ok=False)])
    assert ep.failure is not None and ep.failure.boundary == "tool"
    assert "tool 'raw' returned 5 bytes that are not UTF-8" in ep.failure.message
