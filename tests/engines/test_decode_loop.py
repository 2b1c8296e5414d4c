"""The HF engine's static decode loop (``engines/decode_loop.py`` over ``engines/lean_decode.py``): the
same completions as the transformers loop whatever the poll interval, a step that never reads the
device from the host and keeps its shapes (so it can be a CUDA graph), the batch size from the
memory budget, and transformers' current cache API (no deprecation warning)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agentrl.engines import hf
from agentrl.engines.base import SamplingParams
from agentrl.engines.decode_loop import DecodeState, decode_step
from agentrl.engines.hf import HFEngine
from agentrl.engines.lean_decode import LeanDecoder
from agentrl.engines.lean_weights import PackedWeights
from tests.helpers.decode_cases import TEXTS, mixed_requests, same


@pytest.mark.parametrize("poll_every", [1, 3, 16])
def test_the_static_loop_equals_the_transformers_loop(peaky_policy, poll_every):
    """float32: identical tokens, finish and stop reasons, log-probs within 1e-5, with prompt sharing,
    compaction, greedy and filtered rows, stop ids and a stop string; reading the tokens back every
    1, 3 or 16 steps changes nothing (what a row samples past its end is cut exactly)."""
    model, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    slow = HFEngine(model, tok, lean_decode=False)
    reference = slow.generate(prompts, params)
    # a stop string the reference met in row 3's text, so it ends that row early in both loops
    text = tok.decode(reference[3].token_ids[2:6])
    assert text, "the reference produced no text to stop on"
    params[3] = SamplingParams(**{**params[3].__dict__, "stop": (text[: max(1, len(text) // 2)],)})
    reference = slow.generate(prompts, params)
    assert reference[3].finish_reason == "stop" and isinstance(reference[3].stop_reason, str)
    assert {c.finish_reason for c in reference} == {"stop", "length"}
    static = HFEngine(model, tok, lean_decode=True, poll_every=poll_every)
    assert static.decode_path == "lean"
    same(static.generate(prompts, params), reference)


def fresh_step(model, tok, rows: int = 3, gemm: str = "mkl", fold: bool | None = None):
    """A prefilled batch of ``rows`` prompts and its ``DecodeState`` and ``LeanDecoder`` (its products
    through ``gemm``; rotate_half folded into the q/k GEMM as on CUDA with ``fold``, swapped in the
    step as on the CPU without, the device's own choice with None)."""
    engine = HFEngine(model, tok, lean_decode=True)
    prompts = [tok.encode(t, add_special_tokens=False) for t in TEXTS[:rows]]
    params = [SamplingParams(max_tokens=8, temperature=1.0, top_k=5 * i, seed=i) for i in range(rows)]
    batch = [engine._request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    logits, mask, positions, cache = engine._prefill(batch)
    uniforms = torch.rand(rows, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    state = DecodeState.start(logits, positions, uniforms, params, filtered=True, plain=False)
    packed = None if fold is None else PackedWeights(model, rows if gemm == "onednn" else None, fold)
    return state, LeanDecoder.from_cache(model, cache, mask, 8, gemm, packed)


@pytest.mark.slow
@pytest.mark.parametrize("fold", [True, False], ids=["rotation-folded", "halves-swapped"])
def test_one_decode_step_compiles_into_one_graph(peaky_policy, fold):
    """``torch.compile(fullgraph=True)`` fails on any host read (``.item()``, ``.tolist()``,
    ``bool(tensor)``) or data-dependent shape inside the step: the precondition of a CUDA graph,
    checked on the CPU, with the rotation as CUDA packs it and as the CPU does. The compiled step
    computes what the eager one does."""
    model, tok = peaky_policy
    with torch.inference_mode():
        eager_state, eager_lean = fresh_step(model, tok, fold=fold)
        state, lean = fresh_step(model, tok, fold=fold)
        compiled = torch.compile(decode_step, fullgraph=True, backend="eager", dynamic=False)
        for _ in range(2):
            decode_step(eager_state, eager_lean)
            compiled(state, lean)
    assert torch.equal(state.tokens, eager_state.tokens) and int(state.step) == 2
    assert torch.allclose(state.logprobs, eager_state.logprobs) and torch.equal(
        state.positions, eager_state.positions
    )


class ShapeLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = tuple(
            tuple(o.shape) for o in (out if isinstance(out, (tuple, list)) else [out]) if hasattr(o, "shape")
        )
        self.ops.append((str(func), shapes))
        return out


@pytest.mark.parametrize(("gemm", "fold"), [("mkl", False), ("onednn", False), ("mkl", True)])
def test_a_step_keeps_its_shapes_and_never_reads_the_device(peaky_policy, monkeypatch, gemm, fold):
    """Two consecutive steps run the same operations on the same shapes (a CUDA graph replays one
    recording), and none of them reads a tensor back to the host, with the products through MKL or
    through oneDNN's packed weights (engines/cpu_gemm.py), and with the rotation folded into the
    q/k GEMM as CUDA packs it."""
    model, tok = peaky_policy
    with torch.inference_mode():
        state, lean = fresh_step(model, tok, gemm=gemm, fold=fold)
        for name in ("item", "tolist", "__bool__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, lambda *a, _n=name, **k: pytest.fail(f"host read: {_n}"))
        logs = []
        for _ in range(2):
            with ShapeLog() as log:
                decode_step(state, lean)
            logs.append(log.ops)
    assert logs[0] == logs[1] and len(logs[0]) > 50


READS_THE_DEVICE = ("_local_scalar_dense", "nonzero", "index_put", "masked_select", "unique", "_to_copy")
"""aten ops that wait for a CUDA device (a scalar or a data-dependent size read back, or a copy to
the host); the GPU check found 60 per batch in the packing (an index assignment per layer)."""


def test_packing_the_weights_reads_nothing_back(peaky_policy):
    """A batch's ``LeanDecoder`` packs every layer without an op that waits for the device, with the
    rotation folded in (as on CUDA) or not; the rotated q/k columns equal transformers'
    ``rotate_half`` head by head, exactly, and so do the swapped halves times the signed sin."""
    from transformers.models.llama.modeling_llama import rotate_half

    from agentrl.engines.lean_weights import _rotate_half_columns, half_swap

    model, tok = peaky_policy
    with torch.inference_mode():
        _, lean = fresh_step(model, tok)
        with ShapeLog() as log:
            LeanDecoder(model, lean.keys, lean.values, lean.bias, lean.length, 16)
            PackedWeights(model, fold_rotation=True)
    assert [op for op, _ in log.ops if op.split(".")[1] in READS_THE_DEVICE] == []
    y, sin = torch.randn(5, 7 * 16), torch.randn(7 * 16)
    rotated = rotate_half(y.view(5, 7, 16)).view(5, -1)
    assert torch.equal(_rotate_half_columns(y, 7, 16), rotated)
    signed = sin.view(7, 2, 8) * torch.tensor([-1.0, 1.0])[:, None]
    assert torch.equal(y[:, half_swap(7, 16)] * signed.flatten(), rotated * sin)


def test_the_folded_and_the_swapped_rotation_give_the_same_steps(peaky_policy):
    """The rotation folded into the q/k GEMM (CUDA's packing) and the halves swapped in the step (the
    CPU's) give the same tokens and, within float32 rounding, the same logits, step after step; the
    swapped packing holds no rotated columns."""
    model, tok = peaky_policy
    with torch.inference_mode():
        runs = [fresh_step(model, tok, fold=fold) for fold in (True, False)]
        for _ in range(4):
            logits = [lean.step(state.tokens[:, 0], state.positions).clone() for state, lean in runs]
            assert torch.allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    folded, swapped = (lean.layers[0].qkv_width for _, lean in runs)
    nH, nKV, D = runs[0][1].packed.shape
    assert (folded, swapped) == ((2 * nH + 3 * nKV) * D, (nH + 2 * nKV) * D)


def test_the_batch_is_as_large_as_the_memory_budget_allows(peaky_policy, monkeypatch):
    """No fixed 64-row split: rows decode together as far as the KV budget holds them. The test model
    (hidden 128, 2 layers, 2 KV heads of 32) holds 2 layers · 2 · 2 · 32 · 4 bytes = 1 KiB per
    token; 80 rows of a 10-token prompt and 6 new tokens take 16 KiB each."""
    model, tok = peaky_policy
    engine = HFEngine(model, tok)
    requests = [engine._request(i, [5] * 10, SamplingParams(max_tokens=6)) for i in range(80)]
    assert engine.batch_rows(requests) == 80
    monkeypatch.setattr(hf, "kv_budget_bytes", lambda device: 20 * 16 * 1024)
    assert engine.batch_rows(requests) == 20
    assert HFEngine(model, tok, max_batch_size=16).batch_rows(requests) == 16
    sizes = []
    real = engine._run_batch
    monkeypatch.setattr(engine, "_run_batch", lambda batch: sizes.append(len(batch)) or real(batch))
    outs = engine.generate([[5] * 10] * 80, SamplingParams(max_tokens=6, seed=1))
    assert sizes == [20, 20, 20, 20] and all(len(o.token_ids) == 6 for o in outs)


def test_the_engine_and_the_shared_prefix_forward_warn_nothing(peaky_policy):
    """transformers 5.24 deprecates ``past_key_values=`` with a FutureWarning on every call: the
    engine (both decode paths) and the trainer's shared-prefix forward use ``cache=``."""
    from agentrl.training.forward import suffix_logits

    model, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for lean in (True, False):
            HFEngine(model, tok, lean_decode=lean).generate(prompts[:3], params[:3])
        ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 10, 11]])
        with torch.no_grad():
            suffix_logits(model, ids, 3)
