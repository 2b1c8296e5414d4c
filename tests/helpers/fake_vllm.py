"""A stand-in ``vllm`` module that records what agentrl asks of it: the ``LLM`` constructor's kwargs
(with the torchrun variables of the process), every ``generate`` call's prompts and seeds, and every
``collective_rpc``. Its generations are a deterministic function of the seed and prompt, in the
model's vocabulary. ``install()`` puts it in ``sys.modules`` (before agentrl imports vllm)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import random
import sys
import types
from pathlib import Path
from typing import Any

RECORD: dict[str, Any] = {"llm": None, "generate": [], "rpc": []}
STEP_HOOKS: list[Any] = []
"""Called with no arguments at every ``llm_engine.step()`` (a test records the calling thread's state)."""


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class TokensPrompt(dict):
    pass


class _Step:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


class _Output:
    def __init__(self, ids: list[int]) -> None:
        self.token_ids = ids
        self.logprobs = [{t: _Step(-1.0)} for t in ids]
        self.finish_reason, self.stop_reason = "length", None


class _Result:
    def __init__(self, prompt: list[int], ids: list[int]) -> None:
        self.prompt_token_ids, self.outputs = prompt, [_Output(ids)]


class _RequestOutput(_Result):
    finished = True

    def __init__(self, request_id: str, prompt: list[int], ids: list[int]) -> None:
        super().__init__(prompt, ids)
        self.request_id = request_id


class _Engine:
    """``LLM.llm_engine``: ``add_request`` queues, ``step`` finishes every queued request at once."""

    def __init__(self, vocab: int) -> None:
        self.vocab, self.pending = vocab, list[tuple[str, list[int], Any]]()

    def add_request(self, request_id: str, prompt: Any, sp: Any) -> None:
        self.pending.append((request_id, list(prompt["prompt_token_ids"]), sp))

    def step(self) -> list[_RequestOutput]:
        for hook in STEP_HOOKS:
            hook()
        done, self.pending = self.pending, []
        return [
            _RequestOutput(rid, ids, [random.Random(hash((sp.seed, *ids))).randrange(self.vocab)])
            for rid, ids, sp in done
        ]


class LLM:
    def __init__(self, **kwargs: Any) -> None:
        env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        RECORD["llm"] = {"kwargs": {k: v for k, v in kwargs.items() if _plain(v)}, "env": env}
        config = Path(kwargs["model"]) / "config.json"
        self.vocab = json.loads(config.read_text())["vocab_size"]
        self.llm_engine = _Engine(self.vocab)

    def generate(
        self, prompts: list[Any], sampling_params: list[Any], use_tqdm: bool = False
    ) -> list[_Result]:
        out, call = [], []
        for prompt, sp in zip(prompts, sampling_params):
            ids = list(prompt["prompt_token_ids"])
            rng = random.Random(hash((sp.seed, tuple(ids))))
            out.append(_Result(ids, [rng.randrange(self.vocab) for _ in range(min(sp.max_tokens, 4))]))
            call.append({"prompt": ids, "seed": sp.seed, "max_tokens": sp.max_tokens})
        RECORD["generate"].append(call)
        return out

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        names = [n for n, _ in args[0]] if method == "agentrl_load_bucket_tensors" else []
        RECORD["rpc"].append([method, names])
        return [None]

    def reset_prefix_cache(self) -> None:
        RECORD["rpc"].append(["reset_prefix_cache", []])


def _plain(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool, type(None)))


def install() -> types.ModuleType:
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # find_spec finds it
    module.LLM = LLM  # type: ignore[attr-defined]
    module.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    module.inputs = types.SimpleNamespace(TokensPrompt=TokensPrompt)  # type: ignore[attr-defined]
    sys.modules["vllm"] = module
    return module
