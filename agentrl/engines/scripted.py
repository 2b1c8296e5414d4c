"""A scripted engine for tests: replays given completions as if a model had sampled them.

It honours the same stopping rules as a real engine (stop token ids, stop strings, stop conditions,
``max_tokens``), so
a runner test sees exactly the truncation a model would have produced, and it keeps a weight version
counter so weight-sync code can be tested without a model.

A reply is one of:
- a list of token ids (each gets ``default_logprob``);
- a ``(token_ids, logprobs)`` pair;
- a string, encoded with the tokenizer (``add_special_tokens=False``; ``<|im_end|>`` in the text
  becomes the end-of-turn id because it is an added token);
- ``None``: the engine gives up on this request (``finish_reason="abort"``), to test failure paths.

The script is a sequence of replies consumed in call order, or a callable
``f(prompt_ids, call_index) -> reply`` (``call_index`` counts prompts across all ``generate`` calls).
A reply that ends before any stop rule fires finishes with ``"stop"``, ``stop_reason=None`` and
``info["script_end"] = True`` (a replay cannot know what the model would have written next).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from agentrl.engines.base import Completion, SamplingParams, Weights, per_prompt_params, weight_items
from agentrl.models.stopping import StopStringMatcher, token_decoder

Reply = Sequence[int] | tuple[Sequence[int], Sequence[float]] | str | None


class ScriptedEngine:
    """Replays scripted replies; see the module docstring for the reply forms."""

    def __init__(
        self,
        script: Sequence[Reply] | Callable[[list[int], int], Reply],
        tokenizer: Any = None,
        default_logprob: float = -1.0,
    ) -> None:
        self.script = script
        self.tokenizer = tokenizer
        self.default_logprob = default_logprob
        self.calls: list[tuple[list[int], SamplingParams]] = []
        """Every prompt served, with its parameters, in order (for test assertions)."""
        self.loaded: list[Mapping[str, torch.Tensor]] = []
        """Every state dict passed to ``load_weights``."""
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Weights) -> int:
        self.loaded.append(dict(weight_items(weights)))
        self._version += 1
        return self._version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        plist = per_prompt_params(prompts, params)
        out = []
        for prompt, sp in zip(prompts, plist):
            index = len(self.calls)
            self.calls.append((list(prompt), sp))
            out.append(self._replay(self._reply(list(prompt), index), sp))
        return out

    def _reply(self, prompt: list[int], index: int) -> Reply:
        if callable(self.script):
            return self.script(prompt, index)
        if index >= len(self.script):
            raise IndexError(
                f"ScriptedEngine: the script has {len(self.script)} replies; call {index} asked for one more"
            )
        return self.script[index]

    def _ids_and_logprobs(self, reply: Reply) -> tuple[list[int], list[float]]:
        if isinstance(reply, str):
            if self.tokenizer is None:
                raise ValueError("ScriptedEngine: string replies need a tokenizer")
            ids = self.tokenizer.encode(reply, add_special_tokens=False)
            return ids, [self.default_logprob] * len(ids)
        if isinstance(reply, tuple) and len(reply) == 2 and not isinstance(reply[0], int):
            ids, lps = list(reply[0]), [float(x) for x in reply[1]]
            if len(ids) != len(lps):
                raise ValueError(f"ScriptedEngine: {len(ids)} token ids but {len(lps)} logprobs")
            return ids, lps
        ids = [int(t) for t in reply]  # type: ignore[union-attr]
        return ids, [self.default_logprob] * len(ids)

    def _replay(self, reply: Reply, sp: SamplingParams) -> Completion:
        if reply is None:
            return Completion([], [], "abort", weight_version=self._version, info={"scripted": True})
        ids, lps = self._ids_and_logprobs(reply)
        matcher = None
        if sp.stop or sp.stop_conditions:
            if self.tokenizer is None:
                raise ValueError("ScriptedEngine: stop strings and conditions need a tokenizer")
            matcher = StopStringMatcher(sp.stop, token_decoder(self.tokenizer), sp.stop_conditions)
        kept: list[int] = []
        for token in ids:
            if len(kept) >= sp.max_tokens:
                return self._done(kept, lps, "length", None)
            kept.append(token)
            if token in sp.stop_token_ids:
                return self._done(kept, lps, "stop", token)
            if matcher is not None and (hit := matcher.match(kept)) is not None:
                return self._done(kept, lps, "stop", hit)
        if len(kept) >= sp.max_tokens:
            return self._done(kept, lps, "length", None)
        return self._done(kept, lps, "stop", None, script_end=True)

    def _done(
        self, kept: list[int], lps: list[float], reason: str, stop: int | str | None, **info: Any
    ) -> Completion:
        return Completion(
            token_ids=kept,
            logprobs=lps[: len(kept)],
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=stop,
            weight_version=self._version,
            info={"scripted": True, **info},
        )
