"""HF engine (sampling maths, logprob parity with a teacher-forced forward, seeding, stopping, weight
loading) and the scripted engine."""

from __future__ import annotations

import math
import re

import pytest
import torch

from agentrl.engines.base import Engine, SamplingParams
from agentrl.engines.hf import HFEngine, sample_next
from agentrl.engines.lean_decode import LeanDecoder
from agentrl.engines.scripted import ScriptedEngine
from agentrl.models.stopping import StopStringMatcher, token_decoder

PROMPT_TEXTS = [
    "1",
    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return",
    "Alice has 12 apples. She buys 7 more at the store and gives 3 to Bob. How many apples?",
    "x",
]


def prompts_of(tok) -> list[list[int]]:
    ps = [tok.encode(t, add_special_tokens=False) for t in PROMPT_TEXTS]
    assert len({len(p) for p in ps}) >= 4  # really different lengths
    return ps


# -- the sampling step --------------------------------------------------------------------------
def one_row(probs, temperature=1.0, top_k=0, top_p=1.0, u=0.0):
    logits = torch.tensor([probs]).log()
    return sample_next(
        logits, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([u])
    )


def test_sample_next_hand_computed_cases():
    p = [0.5, 0.3, 0.2]
    # Plain sampling: CDF [0.5, 0.8, 1.0]; u=0.6 falls in token 1's interval, logprob log 0.3.
    tok, lp = one_row(p, u=0.6)
    assert tok.item() == 1 and lp.item() == pytest.approx(math.log(0.3), abs=1e-6)
    # top_k=2 renormalises {0.5, 0.3} to {0.625, 0.375}; u=0.7 > 0.625 picks token 1.
    tok, lp = one_row(p, top_k=2, u=0.7)
    assert tok.item() == 1 and lp.item() == pytest.approx(math.log(0.375), abs=1e-6)
    # top_p=0.6: mass before tokens is [0, 0.5, 0.8] -> keep 0 and 1 (0.5 < 0.6); u=0.99 picks 1, not 2.
    tok, lp = one_row(p, top_p=0.6, u=0.99)
    assert tok.item() == 1 and lp.item() == pytest.approx(math.log(0.375), abs=1e-6)
    # top_p=0.5: token 1 has 0.5 before it, not < 0.5 -> only token 0 is left, logprob 0.
    tok, lp = one_row(p, top_p=0.5, u=0.99)
    assert tok.item() == 0 and lp.item() == pytest.approx(0.0, abs=1e-6)
    # Temperature 0.5 squares the probabilities: [0.25, 0.09, 0.04] / 0.38; u=0.9 > (0.25+0.09)/0.38.
    tok, lp = one_row(p, temperature=0.5, u=0.9)
    assert tok.item() == 2 and lp.item() == pytest.approx(math.log(0.04 / 0.38), abs=1e-6)
    # Greedy: the argmax with logprob 0 by convention, whatever u is.
    tok, lp = one_row(p, temperature=0.0, u=0.99)
    assert tok.item() == 0 and lp.item() == 0.0


def test_sample_next_never_picks_a_filtered_or_zero_probability_token():
    logits = torch.tensor([[0.0, float("-inf"), 0.0, -1e9]]).repeat(4, 1)
    u = torch.tensor([0.0, 0.5, 0.999999, 1.0 - 2**-53], dtype=torch.float64)
    tok, lp = sample_next(logits, torch.ones(4), torch.zeros(4, dtype=torch.long), torch.ones(4), u)
    assert tok.tolist() == [0, 2, 2, 2]
    assert torch.allclose(lp, torch.full((4,), math.log(0.5)))


def test_sample_next_frequencies_match_the_distribution():
    # 40,000 draws from top_k=3 of [0.4, 0.3, 0.2, 0.1] -> [4/9, 3/9, 2/9, 0]; 3-sigma ~0.0075.
    n = 40_000
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log().repeat(n, 1)
    gen = torch.Generator().manual_seed(0)
    tok, _ = sample_next(
        logits,
        torch.ones(n),
        torch.full((n,), 3),
        torch.ones(n),
        torch.rand(n, generator=gen, dtype=torch.float64),
    )
    freq = torch.bincount(tok, minlength=4).double() / n
    assert torch.allclose(freq, torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0], dtype=torch.float64), atol=0.0075)


def test_sample_next_plain_hint_gives_the_general_result():
    """``plain=True`` (every row at temperature 1, no top-k/top-p) skips the temperature and filter
    steps; it must return exactly what the general path returns."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 50, generator=gen) * 3
    u = torch.rand(64, generator=gen, dtype=torch.float64)
    args = (logits, torch.ones(64), torch.zeros(64, dtype=torch.long), torch.ones(64), u)
    tok, lp = sample_next(*args)
    tok_plain, lp_plain = sample_next(*args, plain=True)
    tok_hint, lp_hint = sample_next(*args, filtered=False)
    assert torch.equal(tok, tok_plain) and torch.equal(lp, lp_plain)
    assert torch.equal(tok, tok_hint) and torch.equal(lp, lp_hint)


# -- logprob parity -----------------------------------------------------------------------------
def reference_logprobs(model, prompt, completion, temperature, top_k, top_p) -> list[float]:
    """Teacher-forced float32 forward of prompt+completion alone (no padding), then the sampling
    distribution built the plain way (float64, torch.topk, an explicit nucleus loop)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()  # (T, V): predicts each completion token
    out = []
    for row, token in zip(logits, completion):
        probs = (row / temperature).softmax(-1)
        if top_k:
            keep = torch.zeros_like(probs, dtype=torch.bool)
            keep[probs.topk(top_k).indices] = True
            probs = torch.where(keep, probs, 0.0)
            probs = probs / probs.sum()
        if top_p < 1:
            order = probs.argsort(descending=True).tolist()
            kept, mass = [], 0.0
            for i in order:
                if mass >= top_p:
                    break
                kept.append(i)
                mass += probs[i].item()
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[kept] = True
            probs = torch.where(mask, probs, 0.0)
            probs = probs / probs.sum()
        out.append(math.log(probs[token].item()) if probs[token] > 0 else float("-inf"))
    return out


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 40, 1.0), (0.8, 0, 0.9), (1.3, 100, 0.95)]
)
def test_logprobs_equal_teacher_forced_forward(peaky_policy, temperature, top_k, top_p):
    model, tok = peaky_policy
    engine = HFEngine(model, tok, max_batch_size=8)
    prompts = prompts_of(tok)
    sp = SamplingParams(max_tokens=24, temperature=temperature, top_k=top_k, top_p=top_p, seed=3)
    outs = engine.generate(prompts, sp)
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == len(out.logprobs) == 24 and out.finish_reason == "length"
        ref = reference_logprobs(model, prompt, out.token_ids, temperature, top_k, top_p)
        worst = max(worst, max(abs(a - b) for a, b in zip(out.logprobs, ref)))
    assert worst <= 1e-4


def test_greedy_is_argmax_with_zero_logprobs(peaky_policy):
    model, tok = peaky_policy
    prompt = prompts_of(tok)[1]
    out = HFEngine(model, tok).generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0]
    assert out.logprobs == [0.0] * 12
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    assert out.token_ids == logits.argmax(-1).tolist()


# -- seeding and batch independence -------------------------------------------------------------
def test_seeded_generation_is_reproducible(peaky_policy):
    model, tok = peaky_policy
    engine = HFEngine(model, tok)
    prompts = prompts_of(tok)
    sp = SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    a, b = engine.generate(prompts, sp), engine.generate(prompts, sp)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    c = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=1.0, seed=8))
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # Unseeded requests record the seed they drew: replaying it reproduces them.
    free = engine.generate(prompts[:1], SamplingParams(max_tokens=16))[0]
    again = engine.generate(prompts[:1], SamplingParams(max_tokens=16, seed=free.info["seed"]))[0]
    assert again.token_ids == free.token_ids


def test_completion_does_not_depend_on_the_batch(peaky_policy):
    """Each request alone equals the same request inside a padded batch of different lengths, with
    rows finishing at different steps (max_tokens 1..5) and split into batches of 2."""
    model, tok = peaky_policy
    prompts = prompts_of(tok)
    params = [SamplingParams(max_tokens=i + 1, temperature=1.0, seed=100 + i) for i in range(len(prompts))]
    batched = HFEngine(model, tok, max_batch_size=8).generate(prompts, params)
    split = HFEngine(model, tok, max_batch_size=2).generate(prompts, params)
    engine = HFEngine(model, tok)
    for prompt, sp, b, s in zip(prompts, params, batched, split):
        alone = engine.generate([prompt], sp)[0]
        assert b.token_ids == alone.token_ids == s.token_ids and len(alone.token_ids) == sp.max_tokens
        assert max(abs(x - y) for x, y in zip(b.logprobs, alone.logprobs)) < 1e-5


@pytest.mark.parametrize("lean", [True, False])
def test_identical_prompts_are_prefilled_once(peaky_policy, lean):
    """A GRPO group repeats one prompt: the prefill runs each distinct prompt once and repeats its
    cache rows, and every request still gets what it would get alone."""
    model, tok = peaky_policy
    p0, p1 = prompts_of(tok)[1:3]
    prompts = [p0, p1, p0, p0, p1]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=40 + i) for i in range(len(prompts))]
    engine = HFEngine(model, tok, lean_decode=lean)
    widths = []
    hook = model.register_forward_hook(
        lambda m, args, kw, out: widths.append(kw["input_ids"].shape), with_kwargs=True
    )
    try:
        batched = engine.generate(prompts, params)
    finally:
        hook.remove()
    assert widths[0][0] == 2  # the prefill: two distinct prompts
    for prompt, sp, b in zip(prompts, params, batched):
        alone = engine.generate([prompt], sp)[0]
        assert b.token_ids == alone.token_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, alone.logprobs)) < 1e-5


def test_mixed_params_in_one_batch(peaky_policy):
    model, tok = peaky_policy
    prompts = prompts_of(tok)[:3]
    params = [
        SamplingParams(max_tokens=5, temperature=0.0),
        SamplingParams(max_tokens=9, temperature=1.0, top_k=5, seed=1),
        SamplingParams(max_tokens=3, temperature=0.5, top_p=0.5, seed=2),
    ]
    outs = HFEngine(model, tok).generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [5, 9, 3]
    assert outs[0].logprobs == [0.0] * 5
    assert all(lp <= 0.0 for o in outs for lp in o.logprobs)
    ref = reference_logprobs(model, prompts[1], outs[1].token_ids, 1.0, 5, 1.0)
    assert max(abs(a - b) for a, b in zip(outs[1].logprobs, ref)) <= 1e-4


# -- stopping -----------------------------------------------------------------------------------
def test_stop_token_id_is_kept_and_ends_generation(peaky_policy):
    model, tok = peaky_policy
    engine = HFEngine(model, tok)
    prompt = prompts_of(tok)[3]
    free = engine.generate([prompt], SamplingParams(max_tokens=20, seed=5))[0]
    stop_id = free.token_ids[6]
    k = free.token_ids.index(stop_id)  # first occurrence (may be before position 6)
    out = engine.generate([prompt], SamplingParams(max_tokens=20, seed=5, stop_token_ids=(stop_id,)))[0]
    assert out.token_ids == free.token_ids[: k + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert free.finish_reason == "length" and free.stop_reason is None


def test_stop_string_keeps_the_completing_token(peaky_policy):
    model, tok = peaky_policy
    engine = HFEngine(model, tok)
    prompt = prompts_of(tok)[3]
    free = engine.generate([prompt], SamplingParams(max_tokens=30, seed=9))[0]
    pieces = [tok.decode([t]) for t in free.token_ids]
    k = next(
        i
        for i in range(4, 30)
        if pieces[i - 1].isascii() and pieces[i].isascii() and pieces[i - 1] and pieces[i].strip()
    )
    stop = pieces[k - 1][-1] + pieces[k].strip()[0]  # spans the boundary between tokens k-1 and k
    j = next(n for n in range(1, 31) if stop in tok.decode(free.token_ids[:n]))  # first token completing it
    out = engine.generate([prompt], SamplingParams(max_tokens=30, seed=9, stop=("never-there", stop)))[0]
    assert out.token_ids == free.token_ids[:j]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    with pytest.raises(ValueError, match="tokenizer"):
        HFEngine(model).generate([prompt], SamplingParams(stop=("x",)))


def test_stop_string_matcher_handles_characters_split_across_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok.encode("ab ж😀 cd", add_special_tokens=False)
    assert len(ids) > len("ab ж😀 cd")  # byte tokens: the two characters take several tokens
    matcher = StopStringMatcher(("ж😀",), token_decoder(tok))
    hits = [matcher.match(ids[:n]) for n in range(1, len(ids) + 1)]
    first = next(n for n in range(1, len(ids) + 1) if "ж😀" in tok.decode(ids[:n]))
    assert hits.index("ж😀") == first - 1 and all(h is None for h in hits[: first - 1])


def test_max_tokens_zero_and_empty_prompt(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    out = engine.generate([[5, 6]], SamplingParams(max_tokens=0))[0]
    assert out.token_ids == [] and out.finish_reason == "length"
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams())


# -- weights ------------------------------------------------------------------------------------
def test_load_weights_bumps_version_and_changes_outputs(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok)
    assert isinstance(engine, Engine) and engine.version == 0
    prompt = prompts_of(tok)[0]
    assert engine.generate([prompt], SamplingParams(max_tokens=3, seed=0))[0].weight_version == 0
    zero_head = {"lm_head.weight": torch.zeros_like(model.lm_head.weight)}
    assert engine.load_weights(zero_head) == 1 and engine.version == 1
    out = engine.generate([prompt], SamplingParams(max_tokens=3, seed=0))[0]
    # All-zero logits: the uniform distribution over 1024 tokens, logprob -ln 1024 = -6.931471805599453.
    assert out.weight_version == 1
    assert out.logprobs == pytest.approx([-math.log(1024)] * 3, abs=1e-6)
    with pytest.raises(KeyError, match="unknown"):
        engine.load_weights({"not.a.param": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights({"lm_head.weight": torch.zeros(3, 3)})
    assert engine.version == 1


def test_load_weights_takes_a_stream_one_tensor_at_a_time(tiny_policy):
    """The trainer streams (name, tensor) pairs (under FSDP2 each is gathered on demand): the engine
    copies each before asking for the next, so at most one streamed tensor is alive at a time."""
    import weakref

    model, tok = tiny_policy
    engine = HFEngine(model, tok, dtype="bfloat16")  # its own copy, so the stream really is copied in
    alive = []

    def stream():
        for name, p in model.named_parameters():
            t = torch.full_like(p, 0.5)
            ref = weakref.ref(t)
            yield name, t
            del t
            alive.append(sum(r() is not None for r in refs) + (ref() is not None))
            refs.append(ref)

    refs: list = []
    assert engine.load_weights(stream()) == 1
    assert all(float(p.detach().float().sub(0.5).abs().max()) == 0 for p in engine.model.parameters())
    assert max(alive) <= 1  # the engine kept no reference to an earlier tensor


def test_bfloat16_engine_keeps_its_own_copy(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine(model, tok, dtype="bfloat16")
    assert engine.model is not model and engine.model.dtype == torch.bfloat16 and model.dtype == torch.float32
    out = engine.generate(prompts_of(tok), SamplingParams(max_tokens=4, seed=0))
    assert all(len(o.token_ids) == 4 and all(math.isfinite(x) for x in o.logprobs) for o in out)
    engine.load_weights(model.state_dict())  # float32 weights are cast on copy
    assert engine.version == 1 and engine.model.dtype == torch.bfloat16
    assert HFEngine(model, tok, dtype="float32").model is model


# -- scripted engine ----------------------------------------------------------------------------
def test_scripted_engine_replays_and_stops(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(
        [[10, 11, 2, 12], ([20, 21, 22], [-0.1, -0.2, -0.3]), "The answer is 5.<|im_end|>", None, [7, 8]],
        tokenizer=tok,
    )
    assert isinstance(engine, Engine)
    sp = SamplingParams(max_tokens=2, stop_token_ids=(2,))
    a = engine.generate([[1], [1]], [SamplingParams(stop_token_ids=(2,)), sp])
    assert (a[0].token_ids, a[0].finish_reason, a[0].stop_reason) == ([10, 11, 2], "stop", 2)
    assert a[0].logprobs == [-1.0] * 3
    assert (a[1].token_ids, a[1].logprobs, a[1].finish_reason) == ([20, 21], [-0.1, -0.2], "length")
    b = engine.generate([[1], [1], [1]], SamplingParams(stop=("is",)))
    assert tok.decode(b[0].token_ids) == "The answer is" and b[0].stop_reason == "is"
    assert b[1].finish_reason == "abort" and b[1].token_ids == []
    assert (b[2].token_ids, b[2].finish_reason, b[2].stop_reason) == ([7, 8], "stop", None)
    assert b[2].info["script_end"] is True
    assert len(engine.calls) == 5
    with pytest.raises(IndexError, match="5 replies"):
        engine.generate([[1]], SamplingParams())
    assert engine.load_weights({}) == 1 and engine.generate.__self__.version == 1


def test_scripted_engine_with_a_function():
    engine = ScriptedEngine(lambda prompt, i: [*prompt[-1:], 100 + i, 2])
    outs = engine.generate([[5], [6]], SamplingParams(stop_token_ids=(2,)))
    assert [o.token_ids for o in outs] == [[5, 100, 2], [6, 101, 2]]
    engine.load_weights({})
    assert engine.generate([[9]], SamplingParams())[0].weight_version == 1


# -- the lean decode step (engines/lean_decode.py) -----------------------------------------------
def lean_and_loop_agree(model, tok, prompts, params) -> list:
    """The lean step, its products through MKL and through oneDNN's packed weights (engines/cpu_gemm.py),
    and the transformers loop give the same tokens, and log-probs within 1e-5; returns the lean
    engine's completions (MKL)."""
    slow = HFEngine(model, tok, max_batch_size=8, lean_decode=False)
    assert slow.decode_path == "transformers"
    b = slow.generate(prompts, params)
    out = []
    for gemm in ("mkl", "onednn"):
        lean = HFEngine(model, tok, max_batch_size=8, lean_decode=True, cpu_gemm=gemm)
        assert lean.decode_path == "lean" and lean.cpu_gemm == gemm
        a = lean.generate(prompts, params)
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
        out.append(a)
    return out[0]


def test_lean_decode_is_used_for_qwen2_and_matches_the_transformers_loop(peaky_policy):
    """Same completions and log-probs (within float rounding) as the transformers decode loop, with
    left padding (prompts of different lengths), grouped-query attention (4 heads over 2 KV heads)
    and batch compaction (rows stopping early at different steps)."""
    model, tok = peaky_policy
    assert model.config.num_attention_heads != model.config.num_key_value_heads  # GQA exercised
    prompts = prompts_of(tok)
    params = [
        SamplingParams(max_tokens=4 + 6 * i, temperature=1.0, seed=11 + i) for i in range(len(prompts))
    ]  # different lengths: finished rows are dropped from the batch part-way
    lean_and_loop_agree(model, tok, prompts, params)


@pytest.mark.parametrize("attention_bias", [False, True])
def test_lean_decode_matches_the_transformers_loop_on_a_llama_model(tiny_tokenizer, attention_bias):
    """A Llama-architecture model shaped like SmolLM2 (tied embeddings, grouped-query attention, rope
    theta 1e5), with and without biases on the four attention projections: the lean step picks it up
    and reproduces the transformers loop's completions and log-probs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e5,
        attention_bias=attention_bias, pad_token_id=tiny_tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)  # peaked next-token distributions (the head is the embedding)
        for layer in model.model.layers if attention_bias else []:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.o_proj):
                proj.bias.normal_(0.0, 0.5)
    prompts = prompts_of(tiny_tokenizer)
    params = [SamplingParams(max_tokens=4 + 5 * i, temperature=1.0, seed=3 + i) for i in range(len(prompts))]
    a = lean_and_loop_agree(model, tiny_tokenizer, prompts, params)
    assert len({t for x in a for t in x.token_ids}) > 5  # sampled, not one token repeated


def test_the_lean_step_is_the_default_only_where_it_is_faster(tiny_tokenizer, monkeypatch):
    """With MKL's products the lean step is 2.49x the transformers forward at hidden 128
    (bench/step_parts.py), 0.91x at SmolLM2's 576 on an AVX2 EPYC (bench/engine.py) and 1.17x on an
    Intel Xeon with AMX. By default (``lean_decode=None``) a SmolLM2-sized model takes the lean step
    where its products run faster through oneDNN (``cpu_gemm``: measured under "auto"), which only the
    lean step calls, or where the lean step measures faster here (``decode_probe``; faked here, measured
    for real in test_decode_probe.py); ``lean_decode=True`` still takes the lean step, ``False`` never does."""
    from agentrl.engines import decode_probe

    monkeypatch.setattr(decode_probe, "lean_is_faster", lambda model: (False, "faked: transformers"))
    from transformers import LlamaConfig, LlamaForCausalLM

    wide = LlamaForCausalLM(LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=576, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=9, num_key_value_heads=3))  # fmt: skip
    assert HFEngine(wide, cpu_gemm="mkl").decode_path == "transformers"
    assert HFEngine(wide, lean_decode=True, cpu_gemm="mkl").decode_path == "lean"
    assert HFEngine(wide, cpu_gemm="onednn").decode_path == "lean"
    auto = HFEngine(wide)  # the default: measured on this machine, and said how
    assert auto.cpu_gemm in ("mkl", "onednn")
    assert auto.decode_path == ("lean" if auto.cpu_gemm == "onednn" else "transformers")
    assert re.match(
        r"auto: .* ms through MKL and .* ms through oneDNN \(\d+\.\d+x; oneDNN from 1.5x\), measured",
        auto.cpu_gemm_why,
    )
    assert (
        HFEngine(wide, cpu_gemm="mkl").cpu_gemm_why
        == "set in rollout.cpu_gemm; decode path faked: transformers"
    )
    monkeypatch.setattr(decode_probe, "lean_is_faster", lambda model: (True, "faked: lean"))
    assert HFEngine(wide, cpu_gemm="mkl").decode_path == "lean"
    monkeypatch.setattr(decode_probe, "lean_is_faster", lambda model: (False, "faked: transformers"))
    narrow = LlamaForCausalLM(LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=128, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))  # fmt: skip
    assert HFEngine(narrow).decode_path == "lean"
    small = HFEngine(narrow, cpu_gemm="auto")
    assert small.cpu_gemm == "mkl" and "nothing measured" in small.cpu_gemm_why  # a small model
    assert HFEngine(narrow, lean_decode=False).decode_path == "transformers"
    assert HFEngine(narrow, lean_decode=False).cpu_gemm is None  # nothing measured for a step never taken
    assert HFEngine(narrow, dtype="bfloat16", cpu_gemm="auto").cpu_gemm is None  # float32 only
    with pytest.raises(
        ValueError, match=r"applies to a float32 engine on the CPU; this one is torch\.bfloat16"
    ):
        HFEngine(narrow, dtype="bfloat16", cpu_gemm="onednn")  # asked for where it cannot apply: said
    with pytest.raises(ValueError, match="this engine does not take that step"):
        HFEngine(narrow, lean_decode=False, cpu_gemm="onednn")
    with pytest.raises(ValueError, match="cpu_gemm='blas': choose one of auto, mkl, onednn"):
        HFEngine(narrow, cpu_gemm="blas")


def test_lean_decode_declines_models_it_does_not_reproduce(tiny_policy):
    from agentrl.engines.lean_decode import supports

    model, _ = tiny_policy
    assert supports(model)
    model.config.use_sliding_window = True
    assert not supports(model)
    assert HFEngine(model).decode_path == "transformers"
    model.config.use_sliding_window = False
    model.config.model_type = "llama"
    model.config.mlp_bias = True
    assert not supports(model)
    with pytest.raises(ValueError, match="Llama-style"):
        LeanDecoder(model, [], [], torch.zeros(1, 1, 1, 1), 0, 1)


def test_lean_decode_sees_weights_changed_in_place(peaky_policy):
    """A colocated trainer updates the shared model in place (optimizer steps, no ``load_weights``).
    The lean step packs the weights at the start of every batch, so the next batch uses the new
    weights: it matches the transformers loop after the change, and differs from before it."""
    model, tok = peaky_policy
    prompts = prompts_of(tok)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    lean = HFEngine(model, tok)
    slow = HFEngine(model, tok, lean_decode=False)
    before = lean.generate(prompts, params)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    after, reference = lean.generate(prompts, params), slow.generate(prompts, params)
    assert [a.token_ids for a in after] == [r.token_ids for r in reference]
    assert max(abs(x - y) for a, r in zip(after, reference) for x, y in zip(a.logprobs, r.logprobs)) < 1e-5
    assert [a.logprobs for a in after] != [b.logprobs for b in before]


def test_lean_decode_bfloat16_stays_close_to_the_transformers_loop(peaky_policy):
    """bfloat16: the lean step folds the norm weights into the matmuls, which rounds differently
    from transformers at bfloat16 precision, so only closeness is asserted (teacher-forced on the
    same tokens: the lean engine's log-probs against a bfloat16 forward of its own completions)."""
    model, tok = peaky_policy
    engine = HFEngine(model, tok, dtype="bfloat16")
    assert engine.decode_path == "lean"
    prompts = prompts_of(tok)
    outs = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=1.0, seed=9))
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(prompt) - 1 : -1].float()
        ref = logits.log_softmax(-1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
        assert max(abs(x - y) for x, y in zip(out.logprobs, ref.tolist())) < 0.15


@pytest.mark.parametrize("choice", ["mkl", "onednn"])
def test_rollout_cpu_gemm_reaches_the_engine(tiny_policy, choice):
    """``rollout.cpu_gemm`` is the engine's: a run's HF engine takes the library the config names."""
    from agentrl.assembly.components import local_engine
    from agentrl.config import load_config

    model, tok = tiny_policy
    engine = local_engine(load_config(None, [f"rollout.cpu_gemm={choice}"]), model, tok, "unused")
    assert engine.cpu_gemm == choice and engine.decode_path == "lean"
