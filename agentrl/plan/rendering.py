"""The text ``agentrl plan`` prints: the placement, each budget's terms against its capacity, the
verdict, and for a plan that does not fit its largest terms and what shrinks them."""

from __future__ import annotations

from agentrl.parallel.placement import Placement
from agentrl.parallel.placement import render as render_placement
from agentrl.plan.budgets import Budget, Plan
from agentrl.plan.terms import Term

ADVICE = {
    "activations": "model.gradient_checkpointing=true or a smaller trainer.micro_batch_size",
    "logits": "a smaller trainer.micro_batch_size (or shorter rollout.max_episode_tokens)",
    "HF engine KV": "fewer rollout.max_concurrent_episodes or shorter rollout.max_episode_tokens",
    "HF engine weights": "rollout.dtype=bfloat16, or rollout.workers > 0 to put the engines on other GPUs",
    "HF engine packed": "rollout.dtype=bfloat16, or rollout.workers > 0 to put the engines on other GPUs",
    "AdamW": "trainer.strategy=fsdp2 over more GPUs, trainer.fsdp.cpu_offload=true, or model.lora.rank > 0",
    "gradients": "trainer.strategy=fsdp2 over more GPUs, or model.lora.rank > 0",
    "policy weights": "trainer.strategy=fsdp2 over more GPUs (fewer trainer.fsdp.replicas), or cpu_offload",
    "unsharded gradient": "trainer.fsdp.grad_reduce=micro_batch",
    "KL reference": "algorithm.kl_coef=0, or LoRA (the reference is then the base model itself)",
    "vLLM weights": (
        "a larger rollout.vllm.tensor_parallel_size, a higher rollout.vllm.gpu_memory_utilization if "
        "the trainer has room, rollout.dtype=bfloat16 (if fp32), or rollout.workers > 0 to put the "
        "engines on other GPUs"
    ),
    "vLLM KV cache": (
        "shorter rollout.max_episode_tokens, a larger rollout.vllm.tensor_parallel_size, or a higher "
        "rollout.vllm.gpu_memory_utilization if the trainer has room"
    ),
    "bf16 weight copies": "trainer.strategy=fsdp2 (its mixed precision shards them)",
    "gathered parameters": "trainer.fsdp.reshard_after_forward=true",
    "DDP gradient": "trainer.strategy=fsdp2",
    "CUDA context": "fixed; a lower rollout.vllm.gpu_memory_utilization leaves the trainer more (colocated vLLM)",
}


def _term_line(t: Term) -> str:
    return f"  {t.name:42s} {t.gib:7.2f}   {t.how}"


def _budget_lines(b: Budget) -> list[str]:
    """A budget's terms, their total against its capacity, and its own verdict."""
    verdict = "fits" if b.fits else "DOES NOT FIT"
    return [
        f"{b.name} budget: {b.how} = {b.capacity_gib:.2f} GiB",
        *(_term_line(t) for t in b.terms),
        f"  {'total':42s} {b.total_gib:7.2f}   of {b.capacity_gib:.2f} GiB: {verdict} ({b.free_gib:+.2f} GiB)",
    ]


def launch_command(where: Placement) -> str:
    """The torchrun line that starts this placement's trainer ranks."""
    L = where.launch
    nodes = f"--nnodes {L.nodes} " if L.nodes > 1 else ""
    rdzv = "--rdzv_endpoint HOST:PORT " if L.nodes > 1 else ""
    return f"torchrun {nodes}--nproc_per_node {L.ranks_per_node} {rdzv}-m agentrl.cli train CONFIG"


def verdict(p: Plan) -> str:
    """The overall verdict, naming each budget that is exceeded and by how much, and the placement's
    problems."""
    if p.placement is not None and not p.placement.ok:
        keys = ", ".join(dict.fromkeys(q.key for q in p.placement.problems))
        return f"verdict: REFUSED: the placement cannot work (change {keys}; the REFUSED lines above say why)"
    if p.fits:
        each = ", ".join(
            f"{b.name} {b.total_gib:.2f} of {b.capacity_gib:.2f} GiB" for b in p.budgets + p.worker_budgets
        )
        return f"verdict: fits, every budget holds ({each})"
    every = p.budgets + p.worker_budgets
    over = [
        f"the {b.name}'s budget is exceeded: {b.total_gib:.2f} GiB > {b.capacity_gib:.2f} GiB ({b.how})"
        for b in every
        if not b.fits
    ]
    held = [f"the {b.name}'s fits ({b.total_gib:.2f} of {b.capacity_gib:.2f} GiB)" for b in every if b.fits]
    return "verdict: DOES NOT FIT: " + "; ".join(over + held)


def _advice_lines(p: Plan) -> list[str]:
    """For each exceeded budget its largest terms and what shrinks them, then the settings that
    would make the plan fit."""
    lines = []
    for b in (b for b in p.budgets + p.worker_budgets if not b.fits):
        lines += ["", f"largest terms, and what shrinks them ({b.name}'s budget):"]
        for t in sorted(b.terms, key=lambda t: -t.bytes)[:3]:
            advice = next((v for k, v in ADVICE.items() if t.name.startswith(k)), "")
            lines.append(f"  {t.name} ({t.gib:.1f} GiB): {advice}")
    if p.hints:
        lines += ["", "settings that would make it fit (the engine's own working memory not counted):"]
        lines += [f"  {h}" for h in p.hints]
    return lines


def render(p: Plan) -> str:
    a = p.arch
    lines = [
        f"model: {a.name}, {a.params / 1e9:.2f} B parameters ({a.layers} layers, hidden {a.hidden}, "
        f"vocab {a.vocab:,})" + (f"; LoRA adapters {a.lora_params / 1e6:.1f} M" if a.lora_params else ""),
        f"layout: {p.layout}",
        "",
        *([*render_placement(p.placement, launch_command(p.placement)), ""] if p.placement else []),
        f"{'per GPU, ' + str(len(p.budgets)) + ' budget(s)':44s} {'GiB':>7s}   how",
    ]
    for b in p.budgets:
        lines += _budget_lines(b)
    if p.worker_budgets:
        lines += ["", f"{'a GPU of rollout workers alone, ' + str(len(p.worker_budgets)) + ' budget(s)':44s}"]
        for b in p.worker_budgets:
            lines += _budget_lines(b)
    if p.host:
        lines += ["", "host memory per node", *(_term_line(t) for t in p.host)]
    lines += [""] + [f"note: {n}" for n in p.notes]
    lines.append(verdict(p))
    return "\n".join(lines + (_advice_lines(p) if not p.fits else []))
