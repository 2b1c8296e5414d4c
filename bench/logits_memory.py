"""Peak memory of the log-prob/entropy pass with the whole logits against the output head applied in
chunks (``trainer.chunked_head``), at a real vocabulary (Qwen3's 151,669 ids).

Each measurement runs in a fresh process: a one-layer Llama with that vocabulary (the logits'
memory does not depend on the depth), one sequence of T tokens, the pass with gradient (forward and
backward of log-probs and entropies, as the update runs it) or without (the old-log-prob pass). The
peak is the process's resident high-water mark during the pass (reset just before it through
/proc/self/clear_refs, Linux) above its resident memory just before it.

    .venv/bin/python bench/logits_memory.py                  # T = 2048 and 8192, both paths, grad and no grad
    .venv/bin/python bench/logits_memory.py --tokens 2048 --vocab 49152
    .venv/bin/python bench/logits_memory.py --smollm2 3   # time: whole vs chunked on SmolLM2-135M, 3 rounds

``--smollm2 N`` times the pass with gradient on the real SmolLM2-135M-Instruct (V = 49,152; ``agentrl
models install smollm2-135m-instruct``) over 16 episodes of 180 to 255 tokens, both paths
interleaved for N rounds: what the head in chunks costs where memory is not short.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
"""glibc maps every allocation over 128 KiB on its own and unmaps it when freed: the resident high-water
mark is then the live tensors' peak (with its default, growing threshold, freed blocks stay in the heap
and the mark overstates the peak)."""
BASELINE_VOCAB = 1024
"""The same pass at a 1 k vocabulary: the model's own share of the peak, to subtract."""


def _status_bytes(field: str) -> int:
    """A field of /proc/self/status (``VmRSS``: resident now; ``VmHWM``: its high-water mark)."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def measure(vocab: int, tokens: int, chunked: bool, grad: bool, hidden: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.episode import Episode, Segment
    from agentrl.training.batch import batch_forward, build_batch
    from agentrl.training.forward import output_head

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=tokens + 8)  # fmt: skip
    cfg._attn_implementation = "sdpa"  # no T × T attention matrix: what is left is the logits' share
    model = LlamaForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(1)
    ep = Episode(id="e", env="bench", task_id="t", seed=0, group="g")
    ep.add(Segment("prompt", 0, torch.randint(0, vocab, (16,), generator=g).tolist(), "p"))
    ids = torch.randint(0, vocab, (tokens - 16,), generator=g).tolist()
    ep.add(Segment("policy", 0, ids, "a", [-1.0] * len(ids), 0))
    batch = build_batch([ep], torch.ones(1), [1.0], pad_id=0)
    head = output_head(model) if chunked else None
    with open("/proc/self/clear_refs", "w") as f:  # the resident high-water mark restarts here
        f.write("5")
    before = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        lp, h = batch_forward(model, batch, 1, 1.0, grad=grad, share_prefix=False, head=head)
        if grad:
            (lp.sum() + h.sum()).backward()
    seconds = time.perf_counter() - t0
    peak = _status_bytes("VmHWM") - before
    return {
        "vocab": vocab,
        "tokens": tokens,
        "chunked": chunked,
        "grad": grad,
        "peak_bytes": peak,
        "seconds": seconds,
    }


def time_smollm2(rounds: int) -> None:
    import torch

    from agentrl.episode import Episode, Segment
    from agentrl.models import load_policy, resolve_model_path
    from agentrl.training.batch import batch_forward, build_batch
    from agentrl.training.forward import output_head

    model, _ = load_policy(resolve_model_path("pypi:smollm2-135m-instruct"))
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    episodes = []
    for i in range(16):
        ep = Episode(id=f"e{i}", env="bench", task_id=f"t{i // 8}", seed=i, group=f"g{i // 8}")
        ep.add(Segment("prompt", 0, torch.randint(0, vocab, (120,), generator=g).tolist(), "p"))
        ids = torch.randint(0, vocab, (60 + 5 * i,), generator=g).tolist()
        ep.add(Segment("policy", 0, ids, "a", [-1.0] * len(ids), 0))
        episodes.append(ep)
    batch = build_batch(episodes, torch.linspace(-1, 1, 16), [1.0] * 16, pad_id=0)
    paths = {"whole logits": None, "chunked head": output_head(model)}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(rounds):
        for name in list(paths) if r % 2 == 0 else list(paths)[::-1]:  # interleaved, alternating order
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            lp, h = batch_forward(model, batch, 16, 1.0, grad=True, share_prefix=False, head=paths[name])
            ((lp * batch.mask).sum() + (h * batch.mask).sum()).backward()
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        print(f"{name}: {', '.join(f'{t:.1f}' for t in ts)} s; mean {sum(ts) / len(ts):.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_669)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--smollm2", type=int, metavar="ROUNDS", help="time both paths on SmolLM2-135M instead")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one JSON measurement
    args = ap.parse_args()
    if args.smollm2:
        time_smollm2(args.smollm2)
        return
    if args.one:
        print(json.dumps(measure(**json.loads(args.one))))
        return
    rows = []
    for tokens in args.tokens:
        for grad in (True, False):
            base = None
            for vocab, chunked in ((BASELINE_VOCAB, False), (args.vocab, False), (args.vocab, True)):
                spec = {
                    "vocab": vocab,
                    "tokens": tokens,
                    "chunked": chunked,
                    "grad": grad,
                    "hidden": args.hidden,
                }
                out = subprocess.run(
                    [sys.executable, __file__, "--one", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    env=ENV,
                )
                if out.returncode:
                    print(out.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"the measurement {spec} failed")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                base = base or r  # the first of each pair: the model's own share
                r["above_baseline_bytes"] = r["peak_bytes"] - base["peak_bytes"]
                rows.append(r)
                label = "baseline" if r is base else "chunked head" if chunked else "whole logits"
                print(f"V={vocab:>7,} T={tokens:>5} {'grad   ' if grad else 'no grad'} {label:12s} "
                      f"peak {r['peak_bytes'] / 2**30:6.2f} GiB, above the baseline "
                      f"{r['above_baseline_bytes'] / 2**30:6.2f} GiB, {r['seconds']:6.1f} s", flush=True)  # fmt: skip
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
