"""Where a run's policy entropy sits: in the answer, or in text written after it.

A Short-CoT reward reads the last ``\\boxed{...}`` of a turn and ignores whatever follows it, so
a policy can write free text after its answer at no cost, and that text counts in the batch's
token-mean entropy like any other policy token. This script splits each policy turn of a run's
transcripts at the end of its last balanced ``\\boxed{...}`` and reports the mean sampling surprisal
(-log p of the sampled token under the rollout policy, an unbiased estimate of the token
entropy) of three parts: the tokens up to and including the answer's closing brace, the tokens
after it, and the end-of-turn token.

    .venv/bin/python bench/answer_tail.py runs/study_real/short_cot_smollm2 --from-step 80

It reads ``METHOD/sSEED/transcripts.jsonl`` under the study's output directory (the run
directories, not the committed records, which hold no transcripts) and decodes token ids with the
tokenizer given (default: the model's of the first run's ``config.yaml``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

BOXED = re.compile(r"\\boxed\{")


def answer_end(text: str) -> int | None:
    """The index just past the closing brace of the last balanced ``\\boxed{...}``, or None."""
    starts = [m.end() for m in BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return i + 1
    return None


def split_turn(tok, token_ids: list[int], logprobs: list[float], eos: set[int]) -> dict[str, list]:
    """The surprisals of one policy turn, by part: ``answer`` (up to the answer's end, or all of
    the turn when it has no answer), ``after`` and ``eos``."""
    text = tok.decode([t for t in token_ids if t not in eos])
    end = answer_end(text)
    parts: dict[str, list] = {"answer": [], "after": [], "eos": []}
    for k, (t, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        if t in eos:
            parts["eos"].append(-lp)
            continue
        before = len(tok.decode([x for x in token_ids[:k] if x not in eos]))
        parts["after" if end is not None and before >= end else "answer"].append(-lp)
    return parts


def run_parts(tok, transcripts: Path, from_step: int, eos: set[int]) -> dict[str, list]:
    total: dict[str, list] = {"answer": [], "after": [], "eos": []}
    episodes = with_tail = 0
    for line in transcripts.read_text().splitlines():
        ep = json.loads(line)
        if ep["step"] < from_step:
            continue
        episodes += 1
        tail = False
        for seg in ep["segments"]:
            if seg["role"] == "policy" and seg.get("logprobs"):
                parts = split_turn(tok, seg["token_ids"], seg["logprobs"], eos)
                tail |= bool(parts["after"])
                for k, v in parts.items():
                    total[k] += v
        with_tail += tail
    total["episodes"] = [episodes, with_tail]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "study_dir", type=Path, help="a study family's output, e.g. runs/study_real/short_cot_smollm2"
    )
    ap.add_argument("--from-step", type=int, default=80, help="count episodes of this step and later")
    ap.add_argument("--tokenizer", help="a tokenizer directory (default: the first run's model)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    runs = sorted(args.study_dir.glob("*/s*/transcripts.jsonl"))
    if not runs:
        raise SystemExit(f"no METHOD/sSEED/transcripts.jsonl under {args.study_dir}")
    if args.tokenizer is None:
        import yaml

        from agentrl.models import resolve_model_path

        model = yaml.safe_load((runs[0].parent / "config.yaml").read_text())["model"]
        args.tokenizer = resolve_model_path(model["tokenizer"] or model["path"])
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    eos = {tok.eos_token_id} | set(getattr(tok, "all_special_ids", []))
    print(f"steps >= {args.from_step}; mean surprisal in nats (tokens)")
    print(
        "| run | episodes with text after the answer | up to the answer | after it | end token | share of surprisal after |"
    )
    print("|---|---|---|---|---|---|")
    for path in runs:
        p = run_parts(tok, path, args.from_step, eos)
        n, tail = p.pop("episodes")
        if n == 0:
            continue  # a run not yet past --from-step
        mean = {k: (sum(v) / len(v) if v else 0.0, len(v)) for k, v in p.items()}
        share = sum(p["after"]) / max(1e-12, sum(sum(v) for v in p.values()))
        cells = " | ".join(f"{m:.3f} ({c})" for m, c in mean.values())
        print(
            f"| {path.parent.parent.name} s{path.parent.name[1:]} | {tail / max(1, n):.0%} of {n} | {cells} | {share:.0%} |"
        )


if __name__ == "__main__":
    main()
