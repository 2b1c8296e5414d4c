"""vLLM on a real checkpoint (run by scripts/test_vllm.sh in .venv-vllm): SmolLM2-135M-Instruct, as
``agentrl models install smollm2-135m-instruct`` converted it (scripts/test.sh runs that first, in
.venv; .venv-vllm reads the converted directory from the cache). Without it the tests skip and say
why. vLLM loads the checkpoint, its log-probs equal a transformers forward's, and a bucketed weight
sync of a moved policy is verified (checksums of every tensor and the probe's log-probs)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from agentrl.engines.base import SamplingParams
from agentrl.models import load_policy

# beside test_vllm_engine.py's group: scripts/test_vllm.sh's two workers build the two engines at once
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm_beside_the_tiny_engine")]
vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: run scripts/test_vllm.sh")

# read at import, before the test session's private cache is set: where `agentrl models install` put it
REAL_CACHE = Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    found = sorted((REAL_CACHE / "gguf").glob("SmolLM2-135M-Instruct.Q4_1-*/config.json"))
    if not found:
        pytest.skip(
            f"SmolLM2-135M-Instruct is not converted under {REAL_CACHE}/gguf "
            "(agentrl models install smollm2-135m-instruct, in .venv)"
        )
    return found[-1].parent


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    """vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, read when the engine
    starts): an engine core in a process of its own takes ~28 s more to start on 2 cores (it imports
    vLLM and torch again), and test_vllm_engine.py's engine runs vLLM's default, the core in its own
    process, so the calls that cross processes (weight buckets, checksums) are tested there."""
    import vllm.envs
    from vllm.v1.engine.core_client import InprocClient

    from agentrl.engines.vllm import VLLMEngine

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # vLLM's triton dispatcher reads every torch.distributed attribute, deprecated ones too
        warnings.filterwarnings("ignore", "`torch.distributed.reduce_op` is deprecated", FutureWarning)
        eng = VLLMEngine(str(smollm2_dir), dtype="float32", max_model_len=512)
    vllm.envs.disable_envs_cache()  # an in-process core froze this process's vLLM settings: engines after it read them again
    assert isinstance(eng.llm.llm_engine.engine_core, InprocClient)
    yield eng
    del eng.llm


def chat(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tok.encode(rendered, add_special_tokens=False)


def test_vllm_serves_smollm2_with_the_logprobs_of_a_transformers_forward(engine, smollm2_dir):
    model, tok = load_policy(smollm2_dir)
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    prompts = [chat(tok, "What is 17 + 25?"), chat(tok, "A box holds 12 eggs. How many eggs are in 3 boxes?")]
    outs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=1.0, seed=4))
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == len(out.logprobs) > 0
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        want = logits.log_softmax(-1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(out.logprobs), want, rtol=0, atol=1e-3)
    assert any(tok.decode(o.token_ids).strip() for o in outs)  # it writes text, not padding


def test_a_bucketed_sync_of_smollm2_is_verified(engine, smollm2_dir):
    """Every parameter moved (what an update does), sent in 64 MiB buckets: the engine's checksums
    of every tensor equal the trainer's, and its probe log-probs equal the trainer's forward."""
    from agentrl.engines.fingerprint import probe_ids, tensor_checksum
    from agentrl.sync.weight_sync import PolicyProbe, SyncSettings, sync_weights

    model, _ = load_policy(smollm2_dir)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.002 * torch.randn(p.shape, generator=g))
    probe = PolicyProbe(model, torch.device("cpu"), "float32", lambda m: None)
    v = engine.version
    report = sync_weights(
        engine, ((n, p.detach()) for n, p in model.named_parameters()), SyncSettings(bucket_mb=64), probe
    )
    assert report.verified and report.buckets >= 8 and engine.version == v + 1
    assert report.probe_max_abs_diff < 1e-3
    names = [n for n, _ in model.named_parameters()]
    (fp,) = engine.fingerprint(names, probe_ids(model.config.vocab_size, 64))
    assert fp.checksums == {n: tensor_checksum(n, p) for n, p in model.named_parameters()}
