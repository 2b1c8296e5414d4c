"""A verifiers 0.4.0 taskset for the verifiers adapter's tests (taskset id ``tests.helpers.vf_taskset``):
36 sums, a reward for the right number, and a metric that raises when
``AGENTRL_TEST_VF_RAISE`` is set. Imported only in .venv-verifiers (scripts/test_verifiers.sh)."""

import os

import verifiers.v1 as vf

ROWS = [(f"What is {a} + {b}?", str(a + b)) for a in range(1, 7) for b in range(1, 7)]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(task.answer in (trace.last_reply or ""))

    @vf.metric
    async def fragile(self, task: SumData) -> float:
        if os.environ.get("AGENTRL_TEST_VF_RAISE"):
            raise RuntimeError("this reward function fell over")
        return 0.0


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for i, (question, answer) in enumerate(ROWS):
            data = SumData(id=str(i), prompt=question, system_prompt="Answer with the number.", answer=answer)
            yield SumTask(data, self.config.task)


__all__ = ["SumTaskset"]
