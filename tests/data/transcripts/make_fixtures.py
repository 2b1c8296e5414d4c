"""Build the recorded transcript fixtures (run once; the outputs are committed).

    .venv/bin/python tests/data/transcripts/make_fixtures.py

Writes, next to this file:
- ``tokenizer/``: a tiny byte-level BPE tokenizer with a Qwen3-like ChatML template (groups consecutive
  tool messages into one user turn, strips <think> blocks from assistant turns before the last user
  message).
- ``run/``: a fake training run (config.yaml, metrics.jsonl, transcripts.jsonl with overlays, failed
  episodes and a torn last line, as a killed trainer leaves it).
- ``doctor_clean.jsonl``: episodes whose ids equal a full re-render of their messages.
- ``doctor_drifted.jsonl``: one episode per drift class (see ``DRIFTS``).

Episodes are built the way the runner builds them: each piece of text is tokenized separately and
tagged with its role; the consistent ones are checked to equal the template's own rendering.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agentrl.episode import Episode, Segment
from agentrl.errors import Failure

HERE = Path(__file__).parent
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<tool_response>", "</tool_response>"]  # fmt: skip
TEMPLATE = (
    # Every newline is an explicit string: HF renders templates with trim_blocks/lstrip_blocks.
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}"
    "{{ messages[0].content + '\\n\\n' }}{% endif %}{{ '# Tools\\n<tools>\\n' }}"
    "{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}{{ '</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{ '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}{% set c = m.content %}"
    "{%- if loop.index0 < ns.last_user and '</think>' in c %}{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user\\n' }}{% endif %}"
    "{{ '<tool_response>\\n' + m.content + '\\n</tool_response>\\n' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "You are a careful calculator agent. Use the add tool, then answer with the number.",
    "What is 17 + 25? What is 3 + 4? Compute 120 + 7 and 9 + 90.",
    'call {"name": "add", "arguments": {"a": 17, "b": 25}} result 42 the answer is 42',
    "Let me think step by step. I will add the numbers. The answer is 42. Try again.",
    "Error: unknown tool. Wrong answer, please try again. Thank you.",
    " 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 42 43 99 127",
]
ADD_SCHEMA = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
              "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"]}}}  # fmt: skip
SYSTEM = "You are a careful calculator agent. Use the add tool, then answer with the number."


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=TEMPLATE
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIALS[3:]})
    if out.exists():
        shutil.rmtree(out)
    fast.save_pretrained(out)
    return fast


def call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def encode(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"]) if text else []


def build_episode(tok, messages, ep_id: str, *, tools=True, split_tool_turns=False, eot_newline=True,
                  policy_text=None, rng: random.Random | None = None) -> Episode:  # fmt: skip
    """Tokenize pieces the way the runner does: prompt rendered once, then per turn the policy's own
    text + <|im_end|>, scaffold, and observation contents tagged tool/env. ``policy_text`` overrides
    what the policy "sampled" for a given assistant message index (to simulate drift)."""
    rng = rng or random.Random(0)
    first_asst = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ep = Episode(id=ep_id, env="calc_fixture", task_id=ep_id.split("-")[0], seed=0, messages=messages)
    ep.metrics["tools"] = [ADD_SCHEMA] if tools else None
    prompt = tok.apply_chat_template(messages[:first_asst], tools=ep.metrics["tools"], add_generation_prompt=True,
                                     tokenize=False)  # fmt: skip
    ep.add(Segment("prompt", 0, encode(tok, prompt), prompt))
    turn = 0
    for i in range(first_asst, len(messages)):
        m = messages[i]
        if m["role"] == "assistant":
            text = (policy_text or {}).get(i, m["content"])
            ids = [*encode(tok, text), tok.convert_tokens_to_ids("<|im_end|>")]
            lps = [round(-abs(rng.gauss(0.4, 0.6)), 4) for _ in ids]
            ep.add(Segment("policy", turn, ids, text + "<|im_end|>", logprobs=lps, weight_version=0))
            if eot_newline or i + 1 < len(messages):
                ep.add(Segment("scaffold", turn, encode(tok, "\n"), "\n"))
            turn += 1
            continue
        prev_tool = messages[i - 1]["role"] == "tool" and not split_tool_turns
        nxt_tool = i + 1 < len(messages) and messages[i + 1]["role"] == "tool" and not split_tool_turns
        if m["role"] == "tool":
            head = ("" if prev_tool else "<|im_start|>user\n") + "<tool_response>\n"
            tail = "\n</tool_response>\n" + ("" if nxt_tool else "<|im_end|>\n")
            role = "tool"
        else:
            head, tail, role = "<|im_start|>user\n", "<|im_end|>\n", "env"
        ep.add(Segment("scaffold", turn, encode(tok, head), head))
        ep.add(Segment(role, turn, encode(tok, m["content"]), m["content"]))
        if i + 1 < len(messages) and messages[i + 1]["role"] == "assistant":
            tail += "<|im_start|>assistant\n"
        ep.add(Segment("scaffold", turn, encode(tok, tail), tail))
    return ep


def conversation(a: int, b: int, *, think=False, retry=False, double_tool=False) -> list[dict]:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}]
    reply = (
        "<think>\nLet me think step by step.\n</think>\n\n" if think else ""
    ) + f"I will add. {call(a, b)}"
    msgs.append({"role": "assistant", "content": reply})
    msgs.append({"role": "tool", "name": "add", "content": str(a + b)})
    if double_tool:
        msgs[-2]["content"] = f"{call(a, b)}{call(b, a)}"
        msgs.append({"role": "tool", "name": "add", "content": str(a + b)})
    if retry:
        msgs.append({"role": "assistant", "content": f"The answer is {a + b + 1}."})
        msgs.append({"role": "user", "content": "Wrong answer, please try again."})
    msgs.append({"role": "assistant", "content": f"The answer is {a + b}."})
    return msgs


def check_consistent(tok, ep: Episode) -> None:
    want = tok.apply_chat_template(ep.messages, tools=ep.metrics["tools"], tokenize=False)
    assert ep.text() == want, (ep.text(), want)
    assert ep.token_ids() == encode(tok, want), ep.id


def doctor_fixtures(tok) -> tuple[list[Episode], list[Episode]]:
    clean = [
        build_episode(tok, conversation(17, 25), "clean-basic"),
        build_episode(tok, conversation(3, 4, retry=True), "clean-retry"),
        build_episode(tok, conversation(9, 90, double_tool=True), "clean-two-tools"),
    ]
    for ep in clean:
        check_consistent(tok, ep)
    # Retokenization drift: the policy "sampled" '42' as '4' '2' (same text, different ids).
    retok = build_episode(tok, conversation(17, 25), "drift-retokenized")
    seg = retok.segments[-2]  # the final policy turn
    assert seg.role == "policy"
    cut = seg.text.index("42")
    seg.token_ids = encode(tok, seg.text[:cut]) + encode(tok, "4") + encode(tok, "2") + encode(tok, seg.text[cut + 2:])  # fmt: skip
    seg.logprobs = [-0.5] * len(seg.token_ids)
    drifted = [
        build_episode(tok, conversation(17, 25), "drift-eot-newline", eot_newline=False),
        build_episode(tok, conversation(3, 4, think=True, retry=True), "drift-think"),
        build_episode(
            tok, conversation(9, 90, double_tool=True), "drift-tool-grouping", split_tool_turns=True
        ),
        build_episode(tok, conversation(17, 25), "drift-content", policy_text={4: "The answer is 43."}),
        retok,
    ]
    return clean, drifted


# -- the fake run --------------------------------------------------------------------------------
def attach_overlays(ep: Episode, rng: random.Random, adv: float, gate: bool) -> None:
    """Plausible STARE overlays: L+ = top-10% surprisal tokens among A>0 (per episode here)."""
    n = len(ep.token_ids())
    roles, lps = ep.roles(), ep.engine_logprobs()
    ov = {
        k: [None] * n
        for k in ("logp_old", "logp_new", "entropy", "advantage", "weight", "selected", "clipped")
    }
    pol = [i for i in range(n) if roles[i] == "policy"]
    for i in pol:
        old = round(min(0.0, lps[i] + rng.gauss(0, 0.02)), 4)
        ov["logp_old"][i] = old
        ov["logp_new"][i] = round(old + adv * rng.uniform(0, 0.05), 4)
        ov["entropy"][i] = round(max(0.0, -old * rng.uniform(0.6, 1.6)), 4)
        ov["advantage"][i] = adv
        ov["weight"][i], ov["selected"][i] = 1.0, 0
        ov["clipped"][i] = (
            2 if adv > 0 and rng.random() < 0.03 else (1 if adv < 0 and rng.random() < 0.03 else 0)
        )
    if adv != 0 and pol:
        k = max(1, math.ceil(0.1 * len(pol)))
        top = sorted(pol, key=lambda i: ov["logp_old"][i])[:k]
        for i in top:
            ov["selected"][i] = 1 if adv > 0 else -1
            if gate:
                ov["weight"][i] = 1.1 if adv > 0 else 0.9
    ep.overlays = ov
    ep.metrics["weighting"] = "stare"


def build_run(tok, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(
        "model:\n  path: ../tokenizer\nenv:\n  name: calc_fixture\n  options: {}\n"
        "algorithm:\n  weighting: stare\n  stare: {H_tgt: 0.3, P: 0.1, W: 1.1, M: 0.9}\n"
    )
    rng = random.Random(7)
    metrics, lines = [], []
    for step in range(1, 7):
        gate = step >= 3
        rewards = []
        for g in range(4):
            a, b = rng.randint(1, 30), rng.randint(1, 30)
            group = f"s{step}-g{g}"
            eps = []
            for j in range(2):
                wrong = rng.random() < 0.5 - 0.05 * step
                msgs = conversation(a, b, retry=wrong and j == 0)
                ep = build_episode(tok, msgs, f"t{a}+{b}-s{step}-g{g}-{j}", rng=rng)
                ep.step, ep.group = step, group
                ep.metrics["task"] = {
                    "id": ep.task_id,
                    "prompt": msgs[1]["content"],
                    "answer": a + b,
                    "metadata": {},
                }
                ep.reward = 0.0 if wrong else 1.0
                ep.reward_components = {"correct": ep.reward, "turns": float(ep.num_turns)}
                ep.stop_reason = "answered"
                if step == 4 and g == 1 and j == 1:
                    ep.stop_reason, ep.reward = "error", 0.0
                    ep.failure = Failure("tool", "tool 'add' raised ValueError: sandbox died")
                if step == 5 and g == 2 and j == 0:
                    ep.stop_reason, ep.reward = "max_turns", 0.0
                eps.append(ep)
            mean = sum(e.reward for e in eps) / len(eps)
            for ep in eps:
                attach_overlays(ep, rng, round(ep.reward - mean, 4), gate)
                rewards.append(ep.reward)
                lines.append(ep.to_json())
        ent = round(0.55 - 0.06 * step, 4)
        metrics.append({"step": step, "entropy/mean": ent, "reward/mean": round(sum(rewards) / len(rewards), 4),
                        "length/policy_tokens": 60 + step, "stare/gate_on": int(gate), "stare/w": 1.1,
                        "stare/m": 0.9, "loss/clip_frac_low": 0.01, "loss/clip_frac_high": 0.02,
                        "time/step_s": 1.5, "tokens/s": 900.0})  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + '{"step": 7, "entr')
    # A kill during the write of step 7 leaves a torn last line.
    (out / "transcripts.jsonl").write_text(
        "".join(line + "\n" for line in lines) + lines[0][: len(lines[0]) // 2]
    )


def main() -> None:
    tok = build_tokenizer(HERE / "tokenizer")
    tok = PreTrainedTokenizerFast.from_pretrained(HERE / "tokenizer")  # what readers will load
    clean, drifted = doctor_fixtures(tok)
    (HERE / "doctor_clean.jsonl").write_text("".join(e.to_json() + "\n" for e in clean))
    (HERE / "doctor_drifted.jsonl").write_text("".join(e.to_json() + "\n" for e in drifted))
    build_run(tok, HERE / "run")
    print("fixtures written to", HERE)


if __name__ == "__main__":
    main()
