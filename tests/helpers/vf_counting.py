"""An infinite verifiers 0.4.0 taskset (``INFINITE = True``, a generator, as TextArena's is) for the
verifiers adapter's tests: task i asks for i + 1. Imported only in .venv-verifiers."""

import itertools

import verifiers.v1 as vf


class CountData(vf.TaskData):
    answer: str


class CountTask(vf.Task[CountData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: CountData, trace: vf.Trace) -> float:
        return float(task.answer in (trace.last_reply or ""))


class CountTaskset(vf.Taskset[CountTask]):
    INFINITE = True

    def load(self):
        for i in itertools.count():
            yield CountTask(
                CountData(id=str(i), prompt=f"What is {i} + 1?", answer=str(i + 1)), self.config.task
            )


__all__ = ["CountTaskset"]
