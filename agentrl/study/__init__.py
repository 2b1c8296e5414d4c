"""``agentrl study CONFIG``: the entropy-stability study, one command from configs to a report.

Several methods (GRPO-ds, DAPO, STARE variants and controllers, ...) train on the same task families
with the same seeds, warm starts, data and budgets; the report (``study/report/``) compares their
entropy, reward, length and held-out accuracy.

What is shared and what varies:
- **One warm start per family**, made with ``sft.seed`` fixed (``study.sft_seed``), so every
  method and RL seed starts from the same weights (and it is cached: a rerun skips SFT).
- **One target entropy per family**: ``target.rule = initial`` measures the warm start's token-mean
  entropy H0 over the policy tokens of fresh rollouts on training prompts (one exact forward pass
  over ``target.probe_prompts × group_size`` episodes) and sets H_tgt = ``target.scale`` × H0:
  "hold the entropy the policy starts with". ``rule = fixed`` uses ``target.value``.
- **RL seeds** change the rollout sampling and task order, the same for every method.

Execution: every run is its own subprocess (a crash marks that run failed and the study goes on;
its log is in ``RUN/log.txt``), ``parallel`` at a time, each with ``cores / parallel`` torch threads.
A finished run leaves ``result.json`` and is not rerun, so a killed study resumes where it stopped.
Every run starts as a resume (``run.resume=true``): a run cut short continues from its newest
checkpoint (every ``checkpoint_every`` steps), or starts over when it has none, its partial lines cut.
"""

from agentrl.study.prep import prepare_family, probe_tasks
from agentrl.study.runs import run_one, run_study
from agentrl.study.spec import Reduced, RunSpec, StudyConfig, TargetRule, family_overrides, load_study, plan

__all__ = [
    "Reduced",
    "RunSpec",
    "StudyConfig",
    "TargetRule",
    "family_overrides",
    "load_study",
    "plan",
    "prepare_family",
    "probe_tasks",
    "run_one",
    "run_study",
]
