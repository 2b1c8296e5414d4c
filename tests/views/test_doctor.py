"""agentrl doctor: stored ids vs a full chat-template re-render, on recorded fixture episodes.

The fixtures (tests/data/transcripts/make_fixtures.py) use a tiny BPE tokenizer whose Qwen3-like
template groups consecutive tool messages into one user turn and strips <think> blocks from assistant
turns before the last user message. Each drifted episode carries exactly one kind of difference.
"""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from agentrl.episode import Episode, Segment
from agentrl.rollout.drift import classify, diagnose
from agentrl.transcripts import iter_episodes
from agentrl.views.doctor import doctor_command
from tests.helpers import DATA

DATA = DATA / "transcripts"
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


# -- split samples and the history report -------------------------------------------------------------
def _thinking_episode(family: str, split: bool, ep_id: str) -> Episode:
    """An episode built the way the runner builds it: q1 -> think + tool call -> tool result -> think +
    answer -> a new user query -> think + answer. With ``split`` the new query opens a second sample
    prompted with the template's render (the earlier thinking stripped, for qwen3); without it the
    query is appended as a delta after the model's own tokens."""
    from agentrl.models.chat import ChatRenderer
    from agentrl.models.chat_templates import family_tokenizer

    tok = family_tokenizer(family)
    r = ChatRenderer(tok)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    ep = Episode(id=ep_id, env="e", task_id="t", messages=messages)
    prompt = r.render_prompt(messages)
    ep.add(Segment("prompt", 0, prompt.token_ids, prompt.text))
    replies = [
        '<think>\nI add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
        "<think>\nThe tool said 5.\n</think>\n\nIt is 5.",
        "<think>\n4 and 4 make 8.\n</think>\n\n8.",
    ]
    observations = [[{"role": "tool", "content": "5"}], [{"role": "user", "content": "And 4+4?"}]]
    for turn, reply in enumerate(replies):
        text = reply + "<|im_end|>"
        ids = r.encode(text, split_special=False)
        ep.add(Segment("policy", turn, ids, text, logprobs=[-1.0] * len(ids)))
        close = r.close_turn(text, ended_with_eos=True)
        ep.add(Segment("scaffold", turn, close.token_ids, close.text))
        messages.append({"role": "assistant", "content": reply})
        if turn == len(observations):
            break
        obs = observations[turn]
        messages.extend(obs)
        if split and obs[0]["role"] == "user":
            ep.begin_sample(len(messages), "history")
            text = r.render_text(messages, generation_prompt=True)
            ep.add(Segment("prompt", turn + 1, r.encode(text, False), text))
        else:
            for p in r.render_observation(obs):
                ep.add(Segment(p.role, turn + 1, p.token_ids, p.text))  # type: ignore[arg-type]
    return ep


def test_split_episode_is_diagnosed_per_sample():
    from agentrl.models.chat_templates import family_tokenizer

    tok = family_tokenizer("qwen3")
    split = _thinking_episode("qwen3", split=True, ep_id="split")
    assert split.num_samples == 2
    d = diagnose(split, tok)
    assert (d.samples, d.error, d.drifts) == (2, None, [])
    # Kept in one sample, the model's own thinking before the new query is what a re-render strips.
    merged = diagnose(_thinking_episode("qwen3", split=False, ep_id="merged"), tok)
    assert merged.samples == 1 and merged.policy_drift
    assert [(x.kind, x.sample, x.stored_text) for x in merged.drifts] == [
        ("reasoning", 0, "<think>\nI add.\n</think>\n\n"),
        ("reasoning", 0, "<think>\nThe tool said 5.\n</think>\n\n"),
    ]
    # A drift inside the second sample is reported there, in that sample's token range.
    bad = _thinking_episode("qwen3", split=True, ep_id="bad")
    bad.messages[-1] = {"role": "assistant", "content": "<think>\n4 and 4 make 8.\n</think>\n\n9."}
    (x,) = diagnose(bad, tok).drifts
    assert (x.kind, x.sample, x.stored_text, x.rendered_text, x.touches_policy) == (
        "other",
        1,
        "8",
        "9",
        True,
    )
    assert x.stored[0] >= len(bad.sample_views()[1].segments[0].token_ids)  # after the second prompt


def _doctor_output(tmp_path, family: str, episodes: list[Episode], capsys) -> tuple[int, str]:
    from agentrl.models.chat_templates import save_family_tokenizer

    path = tmp_path / "t.jsonl"
    path.write_text("".join(ep.to_json() + "\n" for ep in episodes))
    code = doctor_command(
        str(path), model=str(save_family_tokenizer(family, tmp_path / family)), verbose=True
    )
    return code, " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping


def test_doctor_explains_split(tmp_path, capsys):
    eps = [_thinking_episode("qwen3", split=True, ep_id=f"s{i}") for i in range(2)]
    code, out = _doctor_output(tmp_path, "qwen3", eps, capsys)
    assert code == 0, out
    assert "history: split — the chat template strips the reasoning of an earlier assistant turn" in out
    assert "a new sample starts where the histories differ" in out
    assert "2 episode(s) split into 4 samples (history: 2)" in out
    assert "ok s0 (2 samples): identical" in out and "history used by the run" not in out


def test_doctor_explains_merge_and_a_run_that_chose_otherwise(tmp_path, capsys):
    from agentrl.models.chat_templates import family_tokenizer, resolve_history

    ep = _thinking_episode("qwen2_5", split=False, ep_id="m")
    code, out = _doctor_output(tmp_path, "qwen2_5", [ep], capsys)
    assert code == 0, out
    assert "history: merge — the chat template keeps the reasoning of an earlier assistant turn" in out
    assert "split into" not in out and "1 episode(s) identical" in out
    # A qwen3 run configured with history: merge keeps thinking the template strips: the doctor
    # prints the probe, what the run used, and the policy drift that follows.
    chosen = resolve_history("merge", family_tokenizer("qwen3"))
    ep = _thinking_episode("qwen3", split=False, ep_id="m3")
    ep.metrics["history"] = {"policy": chosen.policy, "reason": chosen.reason}
    code, out = _doctor_output(tmp_path, "qwen3", [ep], capsys)
    assert code == 1
    assert "history: split — the chat template strips" in out
    assert (
        "history used by the run (1 episode(s)): merge — rollout.history: merge was set in the config" in out
    )
    assert "differs from the history a server would show the model" in out
    assert "reasoning (policy)" in out


def test_the_masking_check_fails_on_feedback_in_the_loss_or_a_tool_result_never_shown(tok, tmp_path, capsys):
    eps = list(iter_episodes(DATA / "doctor_clean.jsonl"))
    for ep in eps:
        ep.overlays = {"trained": [float(r == "policy") for r in ep.roles()]}
    path = tmp_path / "t.jsonl"

    def doctor(episodes: list[Episode]) -> tuple[int, str]:
        path.write_text("".join(e.to_json() + "\n" for e in episodes))
        code = doctor_command(str(path), model=TOK_DIR)
        return code, " ".join(capsys.readouterr().out.split())

    code, out = doctor(eps)
    assert code == 0, out
    tools = sum(r == "tool" for e in eps for r in e.roles())
    assert (
        f"masking: {tools} tool tokens in 3 of 3 episode(s); 0 of them" in out
        and "4 of 4 tool results shown" in out
    )
    leaked = eps[0].roles().index("tool")
    eps[0].overlays["trained"][leaked] = 1.0  # a tool token in the loss
    code, out = doctor(eps)
    assert code == 1 and "; 1 of them (or of any feedback token) in the loss" in out, out
    eps[0].overlays["trained"][leaked] = 0.0
    eps[2].messages = [dict(m) for m in eps[2].messages]
    eps[2].messages[3]["content"] = "a result the model was never shown"
    code, out = doctor(eps)
    assert code == 1 and "3 of 4 tool results shown to the model" in out, out
