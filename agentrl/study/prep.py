"""A family's preparation, shared by every run of it: the warm start (cached), the initial entropy H0
it is measured to have, the target entropy, and the warm start's held-out accuracy (``prep.json``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentrl.assembly import build, components, evaluate
from agentrl.assembly.policy import loaded_policy, start_policy
from agentrl.config import Config, load_config
from agentrl.env import Task
from agentrl.models import resolve_model_path
from agentrl.rollout.runner import EpisodeRequest
from agentrl.study import archive
from agentrl.study.spec import StudyConfig, family_overrides
from agentrl.training.batch import batch_forward, build_batch
from agentrl.training.evaluation import pass_at_k_curve


def probe_tasks(cfg: Config, study: StudyConfig) -> list[Task]:
    """The training prompts H0 is measured on (``target.probe``): an equal share of each RL seed's
    task list, or the first ``probe_prompts`` of the warm start's."""

    n = study.target.probe_prompts
    if study.target.probe == "sft_seed":
        return components.load_tasks(cfg, "train", seed=study.sft_seed)[:n]
    share = -(-n // len(study.seeds))  # ceil
    tasks = [t for s in study.seeds for t in components.load_tasks(cfg, "train", seed=s)[:share]]
    return tasks[:n]


def prepare_family(
    study: StudyConfig, family: str, log: Callable[[str], None] = print, report_only: bool = False
) -> dict[str, Any]:
    """Warm start (cached), the initial entropy H0, H_tgt, and the warm start's held-out accuracy.
    Cached in ``OUTPUT/FAMILY/prep.json`` (keyed by the warm start's cache key and the probe
    settings). ``report_only``: a cached (or archived) measurement is returned without building the
    warm start, which only the runs and the probe need."""
    cfg = load_config(study.families[family], family_overrides(study, family))
    base = resolve_model_path(cfg.model.path)
    key = _prep_key(study, build.warm_start_dir(cfg, base))
    if report_only:
        cached = _cached_prep(study, family, key, build.warm_start_dir(cfg, base), log)
        if cached is not None:
            return {**cached, "tokenizer": base}
    components.apply_threads(cfg, log)  # run.threads of the overrides: the warm start and the probe too
    policy = start_policy(cfg, log)
    path = policy.path
    cached = _cached_prep(study, family, key, path, log)
    if cached is not None:
        return {**cached, "tokenizer": base}
    prep_file = Path(study.output_dir) / family / "prep.json"
    digest = weights_digest(path)
    t0 = time.perf_counter()
    model, tokenizer, engine = loaded_policy(cfg, policy)
    model.eval()
    episodes, h0, h0_branching = _probe_entropy(cfg, study, model, engine, tokenizer)
    h_tgt = study.target.value if study.target.rule == "fixed" else study.target.scale * h0
    test = components.load_tasks(cfg, cfg.eval.split)[: study.eval_tasks]
    metrics, eval_episodes = evaluate(cfg, engine, tokenizer, test, k=study.eval_k)
    extra = extra_evaluations(
        study.families[family], family_overrides(study, family), study.eval_sampling, engine, tokenizer, test
    )
    prep = {
        "key": key,
        "family": family,
        "config": study.families[family],
        "policy": path,
        "h0": h0,
        "h0_branching": h0_branching,
        "target_entropy": h_tgt,
        "probe_episodes": len(episodes),
        "probe_reward": sum(e.reward for e in episodes) / max(len(episodes), 1),
        "initial_eval": metrics,
        "initial_extra_evals": extra,
        "initial_pass_curve": pass_at_k_curve(eval_episodes, study.eval_k),
        "sft": _sft_record(path),
        "policy_sha256": digest,
        "seconds": time.perf_counter() - t0,
    }
    prep_file.parent.mkdir(parents=True, exist_ok=True)
    prep_file.write_text(json.dumps(prep, indent=1))
    if study.archive_dir:
        archive.archive_prep(study.archive_dir, family, prep_file)
    log(
        f"{family}: H0 = {h0:.4f} nats (branching {h0_branching:.3f}), H_tgt = {h_tgt:.4f}; probe reward "
        f"{prep['probe_reward']:.3f}; warm start held-out mean@{study.eval_k} {metrics['eval/mean@k']:.3f}, "
        f"pass@{study.eval_k} {metrics['eval/pass@k']:.3f}"
    )
    return {**prep, "tokenizer": base}


def extra_evaluations(
    config: str,
    overrides: list[str],
    sampling: dict[str, list[str]],
    engine: Any,
    tokenizer: Any,
    tasks: list[Task],
) -> dict[str, dict[str, float]]:
    """The held-out metrics at each of a study's ``eval_sampling`` settings (``eval.*`` overrides
    after ``overrides``), by name."""
    out = {}
    for name, over in sampling.items():
        cfg = load_config(config, [*overrides, *over])
        out[name] = evaluate(cfg, engine, tokenizer, tasks, k=cfg.eval.k)[0]
    return out


def _prep_key(study: StudyConfig, warm_start: str) -> dict[str, Any]:
    """What a family's measurement depends on. The warm start by its cache key (its directory's
    name), not its path: a record made on another machine, with another cache root, is the same."""
    target = asdict(study.target)
    if target["probe"] == "sft_seed":  # the rule before the option existed: keep its cached results
        del target["probe"]
    else:
        target["seeds"] = list(study.seeds)
    return {
        "policy": Path(warm_start).name,
        "target": target,
        "eval": [study.eval_k, study.eval_tasks],
        "version": 3,
        **({"eval_sampling": study.eval_sampling} if study.eval_sampling else {}),  # older records' keys stay
    }


def _cached_prep(
    study: StudyConfig, family: str, key: dict, path: str, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """The family's ``prep.json`` (restored from the archive when the run directories are new) if it
    was measured with ``key``; a warning when the warm start at ``path`` has other weights."""
    prep_file = Path(study.output_dir) / family / "prep.json"
    if study.archive_dir and archive.restore_prep(study.archive_dir, family, prep_file):
        log(f"{family}: the warm start's measurements restored from the archive {study.archive_dir}")
    if not prep_file.exists():
        return None
    prep = json.loads(prep_file.read_text())
    if prep.get("key") != key:
        return None
    digest = weights_digest(path)
    if digest is not None and prep.get("policy_sha256", digest) != digest:
        log(
            f"WARNING {family}: the warm start rebuilt here ({path}, SHA-256 {digest}) differs from the "
            f"one the study measured (SHA-256 {prep['policy_sha256']}); the report names the runs that "
            "start from it"
        )
    return {**prep, "policy": path}


def _probe_entropy(
    cfg: Config, study: StudyConfig, model: Any, engine: Any, tokenizer: Any
) -> tuple[list[Any], float, float]:
    """Fresh episodes on the probe prompts; their policy tokens' mean entropy H0 and its branching
    (top 10 %) part."""
    import torch

    tasks = probe_tasks(cfg, study)
    runner = build.build_runner(cfg, engine, tokenizer, seed=study.sft_seed + 7)
    G = cfg.rollout.group_size
    try:
        reqs = [
            EpisodeRequest(t, seed=i * G + j, group=f"probe{i}", episode_id=f"probe-{i}-{j}")
            for i, t in enumerate(tasks)
            for j in range(G)
        ]
        episodes = [e for e in runner.run(reqs) if not e.failed]
    finally:
        runner.close()
    batch = build_batch(
        episodes, torch.zeros(len(episodes)), [1.0] * len(episodes), tokenizer.pad_token_id or 0
    )
    with torch.no_grad():
        _, ent = batch_forward(model, batch, cfg.trainer.micro_batch_size, cfg.rollout.temperature)
    h0 = float((ent * batch.mask).sum() / batch.mask.sum().clamp(min=1))
    policy_ent = ent[batch.mask > 0]  # the same "branching" as entropy/branching: the top 10 % of tokens
    h0_branching = float(policy_ent.topk(max(1, int(0.1 * policy_ent.numel()))).values.mean())
    return episodes, h0, h0_branching


def weights_digest(path: str) -> str | None:
    """SHA-256 of a local model directory's weights; None for a hub name."""
    return archive.weights_sha256(path) if Path(path).is_dir() else None


def _sft_record(path: str) -> dict[str, Any]:
    """What the warm start's SFT did (``sft_result.json``), without the per-step losses."""
    f = Path(path) / "sft_result.json"
    if not f.exists():
        return {}
    rec = json.loads(f.read_text())
    rec.pop("losses", None)
    return rec
