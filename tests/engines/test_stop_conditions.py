"""Stop conditions: a turn ends with the token that closes its answer (issue 52).

The answer stop (``BOXED_ANSWER``) must not fire on the braces of ``\\frac{1}{2}`` inside the answer,
no token after the closing brace may be returned (so none is recorded or trained on), and
``stop_reason`` names the condition. The engine tests use a tiny model that has learnt one completion
by heart (tests/helpers/memorised.py), so a real decode writes a known answer and text after it."""

from __future__ import annotations

import pytest

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Task
from agentrl.models.stopping import (
    ANSWER_TAG,
    BOXED_ANSWER,
    StopCondition,
    StopStringMatcher,
    answer_tag_closed,
    boxed_answer_closed,
    cut_at_condition,
    token_decoder,
)
from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner, RunnerSettings
from environments.short_cot import ShortCoT
from tests.helpers.invariants import check_invariants
from tests.helpers.memorised import memorised_policy

ANSWER = "The answer is \\boxed{\\frac{1}{2}}"
AFTER = " because half. More text here."


@pytest.mark.parametrize(
    ("text", "closed"),
    [
        ("The answer is \\boxed{\\frac{1}", False),  # the } of \frac's numerator
        ("The answer is \\boxed{\\frac{1}{2}", False),  # and of its denominator
        ("The answer is \\boxed{\\frac{1}{2}}", True),
        ("\\boxed{\\frac{1}{2}} and more", True),
        ("a set {1, 2} then", False),  # braces with no \boxed
        ("<think>so \\boxed{1}", False),  # inside thinking
        ("<think>so \\boxed{1}</think> hence \\boxed{2", False),
        ("<think>so \\boxed{1}</think> hence \\boxed{2}", True),
        ("<|im_start|>assistant\n<think>\n\\boxed{3}", False),  # a template that opens thinking
    ],
)
def test_the_boxed_answer_closes_at_its_own_brace(text, closed):
    assert boxed_answer_closed(text) is closed


def test_the_answer_tag_closes_after_thinking_only():
    assert not answer_tag_closed("<think><answer>1</answer>")
    assert answer_tag_closed("<think>x</think><answer>1</answer>")
    assert not answer_tag_closed("<answer>1</answ")
    assert ANSWER_TAG.triggers == ("</answer>",)


def test_a_condition_needs_a_name_and_triggers():
    with pytest.raises(ValueError, match="triggers"):
        StopCondition("x", boxed_answer_closed, ())
    with pytest.raises(ValueError, match="name"):
        StopCondition("", boxed_answer_closed, ("}",))


def test_the_context_is_read_before_the_text():
    """A generation prompt that opens ``<think>`` makes a boxed answer inside the thinking no answer."""
    opened = BOXED_ANSWER.with_context("<|im_start|>assistant\n<think>\n")
    assert not opened.met("\\boxed{3}") and opened.met("\\boxed{3}</think>\\boxed{3}")
    assert BOXED_ANSWER.met("\\boxed{3}")


def test_the_matcher_and_the_cut_agree_on_the_first_token_where_it_holds(tiny_tokenizer):
    tok, decode = tiny_tokenizer, token_decoder(tiny_tokenizer)
    ids = tok.encode(ANSWER + AFTER, add_special_tokens=False)
    # by hand: the shortest prefix whose text holds a closed boxed answer
    first = next(k for k in range(1, len(ids) + 1) if boxed_answer_closed(decode(ids[:k])))
    assert decode(ids[:first]) == ANSWER  # "}}" is one token here, " because" the next
    matcher = StopStringMatcher((), decode, (BOXED_ANSWER,))
    grown = next(k for k in range(1, len(ids) + 1) if matcher.match(ids[:k]) is not None)
    assert grown == first and matcher.match(ids[:first]) == "boxed_answer"
    assert cut_at_condition(ids, (BOXED_ANSWER,), decode) == (first, "boxed_answer")
    assert cut_at_condition(ids[: first - 1], (BOXED_ANSWER,), decode) is None
    # of two conditions, the earlier stop point wins
    comma = StopCondition("comma_or_period", lambda t: "." in t, (".",))
    assert cut_at_condition(ids, (comma, BOXED_ANSWER), decode) == (first, "boxed_answer")


@pytest.fixture(scope="module")
def answering(tiny_model_dir, tiny_tokenizer):
    """A tiny policy that answers ``What is half of one?`` with ANSWER + AFTER, then ends its turn."""
    tok = tiny_tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is half of one?"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    completion = tok.encode(ANSWER + AFTER + "<|im_end|>", add_special_tokens=False)
    model, tok = memorised_policy(tiny_model_dir, prompt_ids, completion)
    return model, tok, prompt_ids


@pytest.mark.parametrize("poll_every", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.5])
def test_the_hf_engine_ends_the_turn_with_the_answers_closing_brace(answering, poll_every, temperature):
    """With poll_every 4 the tokens are read back four at a time (the CUDA loop's way): the ones
    sampled past the stop are discarded exactly."""
    model, tok, prompt = answering
    engine = HFEngine(model, tok, poll_every=poll_every)
    free_params = SamplingParams(max_tokens=40, temperature=temperature, seed=3)
    (free,) = engine.generate([prompt], free_params)
    written = tok.decode(free.token_ids)
    assert written.startswith(ANSWER) and len(written) > len(ANSWER)  # it writes on after its answer
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=3, stop_conditions=(BOXED_ANSWER,))
    (stopped,) = engine.generate([prompt], params)
    assert tok.decode(stopped.token_ids) == ANSWER  # \frac{1}{2}'s braces did not stop it; nothing after
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", "boxed_answer")
    n = len(stopped.token_ids)
    assert stopped.token_ids == free.token_ids[:n] and stopped.logprobs == free.logprobs[:n]


def test_the_runner_records_the_answer_stop_and_trains_nothing_after_it(tiny_tokenizer):
    """short_cot declares the answer stop: the policy segment ends at the brace, the end-of-turn
    token is the runner's scaffold, the transcript names the condition; ``env_stop=False`` keeps
    the text after the answer (and the turn ends at the model's end-of-turn token)."""
    task = Task("half", "What is half of one?", "1/2")
    reply = ANSWER + AFTER + "<|im_end|>"
    episodes = {}
    for env_stop in (True, False):
        engine = ScriptedEngine([reply], tokenizer=tiny_tokenizer)
        runner = EpisodeRunner(engine, tiny_tokenizer, ShortCoT, RunnerSettings(env_stop=env_stop))
        try:
            (episodes[env_stop],) = runner.run([EpisodeRequest(task, seed=0)])
        finally:
            runner.close()
    ep = episodes[True]
    check_invariants(ep, tiny_tokenizer)
    policy = [s for s in ep.segments if s.role == "policy"]
    assert [s.text for s in policy] == [ANSWER]
    assert ep.segments[-1].role == "scaffold" and ep.segments[-1].text.startswith("<|im_end|>")
    assert ep.metrics["stop_reasons"] == ["condition:boxed_answer"]
    assert ep.stop_reason == "answered" and ep.reward == 1.0
    free = episodes[False]
    assert [s.text for s in free.segments if s.role == "policy"] == [ANSWER + AFTER + "<|im_end|>"]
    assert free.metrics["stop_reasons"] == ["eos"] and free.reward == 1.0
