"""vLLM worker extension: new policy weights in place, in buckets, without touching the disk; and a
read-back of what the worker serves.

Loaded inside vLLM's worker processes through ``LLM(worker_extension_cls=...)``; ``VLLMEngine`` calls
it with ``llm.collective_rpc``. Weights travel as safetensors blobs (tensors sent through vLLM's RPC
arrive as nested lists). One update is:

- ``agentrl_begin_weights``: vLLM's layerwise reload begins (``initialize_layerwise_reload``: each
  layer's kernel tensors are set aside, the layer is restored to checkpoint format on the meta
  device, and its weight loaders buffer what arrives);
- ``agentrl_load_bucket(blob)``, once per bucket: the model's own ``load_weights`` with checkpoint
  names (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``). A layer is processed (kernel
  layout; on CPU the linear layers are prepacked) and copied into its kernel tensors as soon as all
  its elements have arrived, whichever buckets they came in. On CUDA, with the trainer's tensors on
  a GPU of the same node, ``agentrl_load_bucket_ipc`` takes CUDA IPC handles instead of a blob (the
  worker copies from the trainer's GPU memory; what has run on a GPU: docs/scaling.md);
- ``agentrl_finish_weights``: ``finalize_layerwise_reload`` (layers that received nothing get their
  kernel tensors back; attention layers are processed last).

Why not ``reload_weights`` once per bucket: in vLLM 0.32 each call is a whole begin-load-finish
cycle, and a layer that gets only part of its elements in a call (q and k in one bucket, v in the
next) is processed with the missing part uninitialised (``torch.empty``). For the same reason an
update must carry all parts of a fused layer or none: ``agentrl_finish_weights`` refuses one that
sent, say, ``q_proj`` and ``v_proj`` but not ``k_proj`` (it raises after finishing the reload, so
the engine can take a complete update next; LoRA ``target_modules`` must cover a fused layer's parts
together on vLLM).

``agentrl_fingerprint`` checksums the live weights (``engines.fingerprint.tensor_checksum``'s format) with
tensor parallelism 1: a checkpoint tensor that vLLM fused is the matching row slice of the fused
parameter (offsets from the layer's ``output_sizes``), an embedding or head the first
``org_vocab_size`` rows (vLLM pads the vocabulary). A linear weight that vLLM's CPU backend has
prepacked and removed (an empty ``weight``) is read through the layer's own kernel: multiplying
one-hot rows by it gives its columns exactly (products with 0 and 1, sums with zeros).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from agentrl.engines.fingerprint import checksum, sample_indices, tensor_checksum


class WeightSyncExtension:
    """Mixed into vLLM's worker class (it provides ``model_runner``, ``vllm_config``, ``reload_weights``)."""

    def agentrl_load_weights(self, blob: bytes) -> int:
        """A whole update in one call; returns how many tensors."""
        self.agentrl_begin_weights()
        n = self.agentrl_load_bucket(blob)
        self.agentrl_finish_weights()
        return n

    def agentrl_begin_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._agentrl_loaded: set[str] = set()
        with set_current_vllm_config(self._config()):
            initialize_layerwise_reload(self._model())

    def agentrl_load_bucket(self, blob: bytes) -> int:
        """Load a safetensors blob of checkpoint-format weights; returns how many tensors."""
        from safetensors.torch import load

        return self._load(load(blob))

    def agentrl_load_bucket_tensors(self, items: list[tuple[str, torch.Tensor]]) -> int:
        """A bucket as the tensors themselves, from an engine in this process (vLLM's
        ``external_launcher`` runs its worker in the trainer's rank: ``collective_rpc`` is a call)."""
        return self._load(dict(items))

    def agentrl_load_bucket_ipc(self, blob: bytes) -> int:
        """A bucket as CUDA IPC handles (``cuda_ipc_blob``, from a trainer on this node): the
        trainer's GPU memory is opened here and the model's loaders copy from it, with no host round
        trip. The handles name the sender's device by its index there; it is replaced by the index of
        the same GPU (by UUID) in this worker."""
        state = open_cuda_ipc_blob(blob)
        n = self._load(state)
        torch.cuda.synchronize()  # copied before the sender may free or overwrite its tensors
        return n

    def _load(self, state: dict[str, torch.Tensor]) -> int:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self._config()), torch.no_grad():
            self._model().load_weights(iter(state.items()))
        self._agentrl_loaded.update(state)
        return len(state)

    def agentrl_finish_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self._model()
        with set_current_vllm_config(self._config()):
            finalize_layerwise_reload(model, self._config().model_config)
            _retie_head(model, self._config().model_config)
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        runner.reset_lora_state()  # as vLLM's own reload_weights does after reloading
        runner.reset_encoder_cache()
        runner.reset_mm_cache()
        partial = _partial_fused(model, self._agentrl_loaded)
        if partial:  # finalized first, so the engine is usable again (after a complete update)
            raise ValueError(
                "a weight update must carry every part of a layer vLLM fuses, or none: missing "
                f"{partial[:6]}{' ...' if len(partial) > 6 else ''}; the layers it reached now hold "
                "undefined values (with LoRA on vLLM, target all of q_proj/k_proj/v_proj and all of "
                "gate_proj/up_proj, or none of them)"
            )

    def agentrl_fingerprint(self, names: list[str]) -> dict[str, str]:
        """Checksums of the live weights for checkpoint ``names`` ("" for a name it cannot place)."""
        from vllm.distributed import get_tensor_model_parallel_world_size

        if get_tensor_model_parallel_world_size() != 1:
            raise NotImplementedError(
                "weight fingerprints read whole tensors: tensor_parallel_size > 1 is not supported "
                "(set rollout.sync.verify=off)"
            )
        model = self._model()
        with torch.inference_mode():
            return {name: live_checksum(model, name) for name in names}

    def _model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _config(self) -> Any:
        return self.vllm_config  # type: ignore[attr-defined]


def _retie_head(model: Any, model_config: Any) -> None:
    """Tied embeddings (SmolLM2, Llama 3.2, Qwen2.5 up to 3B): vLLM ties the output head to the
    embedding by sharing one parameter, and a checkpoint of such a model has no ``lm_head.weight``.
    The layerwise reload gives a layer that received nothing its old kernel tensors back, so the head
    kept serving the old embedding after an update (found by the sync's probe on SmolLM2 on CPU:
    every tensor's checksum matched, the log-probs were off by 0.21). Share the parameter again and
    redo the head's post-load step (on CPU it prepacks the GEMM weight)."""
    if not getattr(model_config.hf_config, "tie_word_embeddings", False):
        return
    head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if head is None or embed is None:
        raise NotImplementedError(
            f"{type(model).__name__} ties its word embeddings but has no lm_head / model.embed_tokens: "
            "agentrl cannot re-tie them after a weight update"
        )
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)


def open_cuda_ipc_blob(blob: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a ``cuda_ipc_blob``, opened in this process (views of the sender's GPU memory:
    copy from them before answering the sender). A blob may hold a copy per GPU (``cuda_ipc_blob``
    of several lists, for an engine's tensor-parallel workers): this process opens the copy on its
    own current GPU, else the first it can see, so no worker opens memory on another worker's GPU
    (which would make a CUDA context of its own there). The handles name the sender's device by its
    index there; it is replaced by the index of the same GPU (by UUID) here."""
    copies = pickle.loads(blob)
    local = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
    mine = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    seen = [(uuid, handles) for uuid, handles in copies if uuid in local]
    if not seen:
        raise RuntimeError(
            f"the trainer's GPU {copies[0][0]} is not visible to this process (it sees {sorted(local)}): CUDA "
            "IPC needs the sender and the receiver on one node with that GPU visible to both"
        )
    uuid, handles = next(((u, h) for u, h in seen if u == mine), seen[0])
    state = {}
    for name, (rebuild, args) in handles:
        args = list(args)
        args[6] = local[uuid]  # rebuild_cuda_tensor's storage_device
        state[name] = rebuild(*args)
    return state


def cuda_ipc_blob(*copies: list[tuple[str, torch.Tensor]]) -> bytes:
    """Each list of CUDA tensors (one list per GPU: the same tensors' copies) as pickled CUDA IPC
    handles (``torch.multiprocessing.reductions.reduce_tensor``) with its GPU's UUID. The caller keeps
    the tensors alive (and unchanged) until every receiver has copied them."""
    from torch.multiprocessing.reductions import reduce_tensor

    out = []
    for tensors in copies:
        device = tensors[0][1].device
        if any(t.device != device or not t.is_contiguous() for _, t in tensors):
            raise ValueError("cuda_ipc_blob: each list's tensors must be contiguous and on one CUDA device")
        torch.cuda.current_stream(device).synchronize()  # written before another process reads them
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        out.append((uuid, [(name, reduce_tensor(t)) for name, t in tensors]))
    return pickle.dumps(out)


def _packed(model: Any) -> dict[str, list[str]]:
    """Fused layer name -> the checkpoint layers fused into it (``qkv_proj`` -> q, k, v)."""
    mapping = getattr(model, "packed_modules_mapping", None) or {}
    return {fused: list(parts) for fused, parts in mapping.items() if list(parts) != [fused]}


def _partial_fused(model: Any, loaded: set[str]) -> list[str]:
    """The names missing from ``loaded`` for fused layers it has only some parts of."""
    missing = set()
    for name in loaded:
        module, _, param = name.rpartition(".")
        for parts in _packed(model).values():
            for part in parts:
                if module.endswith("." + part):
                    stem = module[: -len(part)]
                    missing |= {f"{stem}{p}.{param}" for p in parts} - loaded
    return sorted(missing)


def live_checksum(model: Any, name: str) -> str:
    """``tensor_checksum`` of the live weight vLLM holds for checkpoint tensor ``name`` ("" when it
    holds none)."""
    module, _, param = name.rpartition(".")
    offset, rows = 0, None
    for fused, parts in _packed(model).items():
        for k, part in enumerate(parts):
            if module.endswith("." + part):
                module = module[: -len(part)] + fused
                layer = model.get_submodule(module)
                offset, rows = sum(layer.output_sizes[:k]), layer.output_sizes[k]
    try:
        layer = model.get_submodule(module)
        t = layer.get_parameter(param)
    except AttributeError:
        return ""
    if rows is None and hasattr(layer, "org_vocab_size"):  # embeddings and head: padded rows
        rows = layer.org_vocab_size
    if t.numel() == 0 and param == "weight":  # prepacked by the CPU backend: read through the kernel
        return _kernel_checksum(layer, name, offset, rows)
    return tensor_checksum(name, t.narrow(0, offset, rows) if rows is not None else t)


def _kernel_checksum(layer: Any, name: str, offset: int, rows: int | None) -> str:
    """The sampled elements of rows ``offset .. offset + rows`` of a linear layer's weight, read by
    running its kernel on one-hot inputs: y = e_c W^T holds column c of W exactly."""
    cols = int(layer.input_size)  # tensor parallelism 1: the whole layer
    rows = int(layer.output_size) if rows is None else rows
    idx = sample_indices(name, rows * cols)
    r, c = idx // cols, idx % cols
    unique, where = torch.unique(c, return_inverse=True)
    onehot = torch.zeros(len(unique), cols, dtype=layer.params_dtype)
    onehot[torch.arange(len(unique)), unique] = 1
    out = layer.quant_method.apply(layer, onehot, None)  # [len(unique), out features]
    return checksum((rows, cols), out[where, offset + r])
