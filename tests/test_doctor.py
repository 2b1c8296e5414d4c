"""agentrl doctor: stored ids vs a full chat-template re-render, on recorded fixture episodes.

The fixtures (tests/data/transcripts/make_fixtures.py) use a tiny BPE tokenizer whose Qwen3-like
template groups consecutive tool messages into one user turn and strips <think> blocks from assistant
turns before the last user message. Each drifted episode carries exactly one kind of difference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from agentrl.doctor import classify, diagnose, doctor_command
from agentrl.episode import Episode, Segment
from agentrl.transcripts import iter_episodes

DATA = Path(__file__).parent / "data" / "transcripts"
TOK_DIR = str(DATA / "tokenizer")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_response>", "</tool_response>"]


@pytest.fixture(scope="module")
def tok():
    return PreTrainedTokenizerFast.from_pretrained(TOK_DIR)


def test_consistent_episodes_have_no_difference(tok, capsys):
    eps = list(iter_episodes(DATA / "doctor_clean.jsonl"))
    assert len(eps) == 3
    for ep in eps:
        d = diagnose(ep, tok)
        assert d.error is None and d.drifts == [], (ep.id, d.drifts)
    assert doctor_command(str(DATA / "doctor_clean.jsonl"), model=TOK_DIR) == 0
    assert "3 episode(s) identical" in capsys.readouterr().out


# episode id -> (the one expected kind, whether it touches policy tokens, stored text, rendered text)
EXPECTED = {
    "drift-eot-newline": ("eot_whitespace", False, "", "\n"),  # the final <|im_end|> lacks its "\n"
    "drift-think": ("reasoning", True, "<think>\nLet me think step by step.\n</think>\n\n", ""),
    "drift-tool-grouping": ("tool_grouping", False, "<|im_end|>\n<|im_start|>user\n", ""),
    "drift-content": ("other", True, " 43", " 42"),
    "drift-retokenized": ("retokenized", True, " 42", " 42"),
}


def test_each_drift_is_found_and_classified(tok):
    eps = {ep.id: ep for ep in iter_episodes(DATA / "doctor_drifted.jsonl")}
    assert set(eps) == set(EXPECTED)
    for ep_id, (kind, policy, s_text, r_text) in EXPECTED.items():
        d = diagnose(eps[ep_id], tok)
        assert [x.kind for x in d.drifts] == [kind], (ep_id, d.drifts)
        x = d.drifts[0]
        assert (x.touches_policy, x.stored_text, x.rendered_text) == (policy, s_text, r_text), ep_id
        assert d.policy_drift == policy
    # The retokenized drift: ' 42' stored as ' ' '4' '2' (3 tokens) where the template gives one piece.
    x = diagnose(eps["drift-retokenized"], tok).drifts[0]
    assert x.stored[1] - x.stored[0] == 3 and x.rendered[1] - x.rendered[0] == 1
    assert x.roles == ["policy"]


def test_doctor_exit_code_is_nonzero_only_for_policy_drift(tok, tmp_path, capsys):
    assert doctor_command(str(DATA / "doctor_drifted.jsonl"), model=TOK_DIR, verbose=True) == 1
    text = capsys.readouterr().out
    assert "3 episode(s) would train on different policy tokens" in text
    for kind in ("retokenized", "reasoning", "eot_whitespace", "tool_grouping", "other"):
        assert kind in text
    harmless = tmp_path / "harmless.jsonl"
    lines = [
        ln
        for ln in (DATA / "doctor_drifted.jsonl").read_text().splitlines()
        if '"drift-eot' in ln or '"drift-tool' in ln
    ]
    harmless.write_text("\n".join(lines) + "\n")
    assert doctor_command(str(harmless), model=TOK_DIR) == 0
    assert "no policy token would differ" in capsys.readouterr().out


def test_doctor_finds_the_tokenizer_from_the_run_config(capsys):
    # run/config.yaml says model.path: ../tokenizer; all run episodes are consistent.
    assert doctor_command(str(DATA / "run")) == 0
    text = capsys.readouterr().out
    assert "48 episode(s) identical" in text


def test_doctor_cannot_run_without_a_tokenizer(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text((DATA / "doctor_clean.jsonl").read_text())
    assert doctor_command(str(path)) == 2
    assert "no tokenizer found" in capsys.readouterr().out
    assert doctor_command(str(tmp_path / "missing.jsonl"), model=TOK_DIR) == 2


def test_episode_without_messages_is_skipped_not_failed(tok):
    ep = Episode(id="x", env="e", task_id="t")
    ep.add(Segment("policy", 0, [5], "a", logprobs=[-1.0]))
    d = diagnose(ep, tok)
    assert d.error == "no messages stored" and not d.policy_drift


def test_insertion_counts_as_policy_only_inside_a_policy_segment(tok):
    # Stored policy ids are "The answer" + "42." with one token dropped in the middle: the render
    # inserts it between two policy tokens, so the policy's own sequence would differ.
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is 42."}]
    full = tok.apply_chat_template(msgs, tokenize=False)
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    pol = list(tok("The answer is 42.<|im_end|>", add_special_tokens=False)["input_ids"])
    ep = Episode(id="ins", env="e", task_id="t", messages=msgs)
    ep.add(Segment("prompt", 0, list(tok(prompt, add_special_tokens=False)["input_ids"]), prompt))
    dropped = pol[:2] + pol[3:]
    ep.add(Segment("policy", 0, dropped, "x", logprobs=[-1.0] * len(dropped)))
    ep.add(Segment("scaffold", 0, list(tok("\n", add_special_tokens=False)["input_ids"]), "\n"))
    assert full.endswith("<|im_end|>\n")
    d = diagnose(ep, tok)
    assert len(d.drifts) == 1 and d.drifts[0].stored == (ep.prompt_length + 2, ep.prompt_length + 2)
    assert d.drifts[0].touches_policy and d.drifts[0].kind == "other"


@pytest.mark.parametrize(
    ("stored", "rendered", "before", "after", "kind"),
    [
        ("42", "42", "", "", "retokenized"),
        ("<think>x</think>\n", "", "", "", "reasoning"),
        ("", "\n", "<|im_end|>", "<|im_start|>", "eot_whitespace"),
        ("  ", " ", "a", "b", "whitespace"),
        ("<|im_end|>\n<|im_start|>user\n", "", "</tool_response>\n", "<tool_response>", "tool_grouping"),
        ("<|im_end|>\n<|im_start|>user\n", "", "hello", "world", "other"),  # no tool marker nearby
        ("<|im_end|>\n<|im_start|>user\nhi", "", "</tool_response>", "", "other"),  # content lost
        ("abc", "abd", "", "", "other"),
    ],
)
def test_classify(stored, rendered, before, after, kind):
    assert classify(stored, rendered, before, after, SPECIALS) == kind
