"""bench/answer_tail.py splits a policy turn's surprisal at the end of its last ``\\boxed{...}``."""

import importlib.util
import json
import math

from tests.helpers import ROOT


def load():
    spec = importlib.util.spec_from_file_location("answer_tail", ROOT / "bench" / "answer_tail.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CharTokenizer:
    """One token per character; id 0 is the end of the turn and decodes to nothing."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text] + [0]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i)


def test_answer_end_is_past_the_last_balanced_boxed():
    at = load()
    text = "2*3=6\n\\boxed{\\frac{1}{2}}\n\\text{x}"
    assert text[: at.answer_end(text)].endswith("\\boxed{\\frac{1}{2}}")
    assert at.answer_end("\\boxed{1} and \\boxed{2} tail") == len("\\boxed{1} and \\boxed{2}")
    assert at.answer_end("no answer") is None
    assert at.answer_end("\\boxed{unclosed") is None


def test_turn_and_run_split_surprisal_into_answer_tail_and_end_token(tmp_path):
    at = load()
    tok = CharTokenizer()
    ids = tok.encode("\\boxed{7}xy")  # 9 answer characters, 2 after, the end token
    logprobs = [-0.1] * 9 + [-2.0, -3.0] + [-0.5]
    parts = at.split_turn(tok, ids, logprobs, eos={0})
    assert parts["answer"] == [0.1] * 9 and parts["after"] == [2.0, 3.0] and parts["eos"] == [0.5]
    no_answer = at.split_turn(tok, tok.encode("abc"), [-1.0] * 4, eos={0})
    assert no_answer["answer"] == [1.0] * 3 and no_answer["after"] == []

    def episode(step: int, text: str) -> str:
        seg = {"role": "policy", "token_ids": tok.encode(text), "logprobs": [-1.0] * (len(text) + 1)}
        return json.dumps({"step": step, "segments": [{"role": "prompt", "token_ids": [1]}, seg]})

    path = tmp_path / "transcripts.jsonl"
    path.write_text(
        "\n".join([episode(0, "\\boxed{1}tail"), episode(5, "\\boxed{1}t"), episode(5, "\\boxed{2}")])
    )
    total = at.run_parts(tok, path, from_step=5, eos={0})
    assert total["episodes"] == [2, 1]  # step 0 left out; one of the two has text after its answer
    assert len(total["answer"]) == 18 and len(total["after"]) == 1 and len(total["eos"]) == 2
    assert math.isclose(sum(total["after"]), 1.0)
