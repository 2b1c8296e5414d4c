"""A colocated vLLM engine of tensor parallelism 2 over two trainer ranks, on the stand-in vllm
(``fake_vllm.py``), for tests/parallel/test_engine_group.py.

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/colocated_tp.py OUT.json key=value ...

Each rank builds its ``Trainer`` (so its engine through ``build.build_engine``), runs one training
step and an evaluation; rank 0 writes every rank's record: the engine's constructor kwargs and
torchrun variables, its generation calls (prompts, seeds), its weight-update calls, and the episodes
the step trained on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from tests.helpers import fake_vllm

fake_vllm.install()

from agentrl.assembly import make_trainer  # noqa: E402
from agentrl.config import load_config  # noqa: E402
from agentrl.parallel import ranks  # noqa: E402
from tests.helpers.configs import exit_driver  # noqa: E402


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    trainer = make_trainer(load_config(None, overrides), log=lambda *_: None)
    step = trainer.train_step(0)
    evaluation = trainer.evaluate()
    mine = {
        "rank": trainer.rank,
        "engine": type(trainer.engine).__name__,
        "llm": fake_vllm.RECORD["llm"],
        "generate": fake_vllm.RECORD["generate"],
        "rpc": fake_vllm.RECORD["rpc"],
        "episodes": [e.token_ids() for e in step.episodes],
        "eval_tasks": evaluation["eval/tasks"],
        "version": trainer.engine.version,
    }
    everyone = ranks.gather_to_rank0(mine)
    if trainer.rank == 0:
        Path(out).write_text(json.dumps(everyone))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    exit_driver()  # with main's objects still alive (configs.exit_driver)


if __name__ == "__main__":
    main()
