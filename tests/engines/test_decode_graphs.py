"""The decode step's kept CUDA graphs (``engines/decode_graphs.py``) and the engine's kept packed weights
(``engines/lean_weights.py``), on the CPU: a recording stand-in for ``StepGraph`` runs each step
eagerly and fails if any tensor the step reads has moved since its capture, which is what a real
graph's replay would silently get wrong."""

from __future__ import annotations

import copy
import weakref

import pytest
import torch

from agentrl.engines import hf
from agentrl.engines.base import SamplingParams
from agentrl.engines.decode_graphs import GraphPool, columns_bucket, rows_bucket
from agentrl.engines.hf import HFEngine
from agentrl.engines.lean_weights import PackedWeights, weights_key
from tests.helpers.decode_cases import mixed_requests, same


def addresses(state, lean) -> list[int]:
    """The address of every tensor a decode step reads or writes: the decode state, the KV buffers,
    the column, the rotary tables, the workspace, the packed weights and the model's embedding."""
    tensors = [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
    tensors += [*lean.keys, *lean.values, lean.bias, lean.col, lean.cos, lean.sin, lean.embed]
    tensors += [v for v in vars(lean.ws).values() if isinstance(v, torch.Tensor)]
    for gemm in [g for layer in lean.layers for g in layer.gemms()] + [lean.head]:
        tensors += [t for t in (gemm.w_t, gemm.packed, gemm.bias) if t is not None]
    return [t.data_ptr() for t in tensors]


class Pools:
    """CUDA graph memory pools as PyTorch's caching allocator keeps them: a pool lives while a graph
    captured into it does, and a capture into one whose graphs were all freed fails (the allocator's
    internal assert, ``use_count > 0``, met on an H200 under an engine-wide pool)."""

    def __init__(self) -> None:
        self.made, self.graphs, self.released = 0, {}, set()

    def new(self) -> tuple[str, int]:
        self.made += 1
        return ("pool", self.made)

    def capture(self, graph: object, pool: tuple[str, int]) -> None:
        assert pool not in self.released, f"a capture into {pool}, whose graphs were all freed"
        self.graphs[pool] = self.graphs.get(pool, 0) + 1
        weakref.finalize(graph, self._free, pool)

    def _free(self, pool: tuple[str, int]) -> None:
        self.graphs[pool] -= 1
        if not self.graphs[pool]:
            self.released.add(pool)


class RecordingGraph:
    """``StepGraph``'s stand-in: records each capture (and its memory pool), then calls the step
    eagerly at every replay after checking that nothing it reads has moved."""

    def __init__(self, fn, device, pool) -> None:
        self.fn, self.captured = fn, addresses(*fn.args[:2])
        self.rows = fn.args[0].logits.shape[0]
        self.replays = 0
        POOLS.capture(self, pool)
        CAPTURES.append(self)

    def __call__(self) -> None:
        assert addresses(*self.fn.args[:2]) == self.captured, "a tensor the graph reads has moved"
        self.replays += 1
        self.fn()


CAPTURES: list[RecordingGraph] = []
POOLS = Pools()


@pytest.fixture
def graph_engine(peaky_policy):
    """An engine on its own copy of the model whose lean loop runs through a ``GraphPool`` of
    recording graphs, as a CUDA engine's does through real ones."""
    model, tok = peaky_policy
    engine = HFEngine(copy.deepcopy(model), tok, lean_decode=True, poll_every=3)
    global POOLS
    POOLS = Pools()
    engine._graphs = GraphPool(capture=RecordingGraph, new_pool=lambda: POOLS.new())
    CAPTURES.clear()
    return engine


def test_buckets_are_powers_of_two():
    assert [rows_bucket(n) for n in (1, 2, 3, 5, 8, 9, 128)] == [1, 2, 4, 8, 8, 16, 128]
    assert [columns_bucket(n) for n in (1, 128, 129, 1000)] == [128, 128, 256, 1024]


@pytest.mark.parametrize("rows", [8, 5])
def test_the_kept_graphs_give_the_per_batch_loop_s_completions(peaky_policy, graph_engine, rows):
    """float32: the bucket graphs (the whole capacity attended, padding rows when 5 rows run in the
    bucket of 8, the live rows moved to smaller buckets as they finish) give the tokens, ends and
    log-probs (within 1e-5) of the per-batch loop; one capture per bucket visited."""
    model, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    prompts, params = prompts[:rows], params[:rows]
    reference = HFEngine(model, tok, lean_decode=True, poll_every=3).generate(prompts, params)
    same(graph_engine.generate(prompts, params), reference)
    (arena,) = graph_engine._graphs.arenas
    assert torch.isfinite(arena.state.logits[:8]).all(), "a padding row's numbers are not finite"
    buckets = [g.rows for g in CAPTURES]
    assert buckets[0] == 8 and buckets == sorted(buckets, reverse=True) and len(set(buckets)) == len(buckets)
    assert len(buckets) > 1, "no row finished early enough to move the batch to a smaller bucket"


def test_a_second_batch_and_a_weight_sync_capture_nothing(peaky_policy, graph_engine):
    """The graphs outlive their batch: a second batch of the same shape replays them, and after a
    weight sync (``load_weights``) the packed weights are refreshed in place, so the same graphs give
    what a new engine on the new weights gives."""
    model, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    first = graph_engine.generate(prompts, params)
    captured = list(CAPTURES)
    same(graph_engine.generate(prompts, params), first)
    assert captured == CAPTURES
    new = {
        n: p + 0.05 * torch.randn_like(p) for n, p in model.state_dict().items() if n.endswith("proj.weight")
    }
    graph_engine.load_weights(new)
    synced = graph_engine.generate(prompts, params)
    assert captured == CAPTURES, "a weight sync made the engine capture again"
    moved = copy.deepcopy(model)
    moved.load_state_dict(new, strict=False)
    same(synced, HFEngine(moved, tok, lean_decode=True).generate(prompts, params))
    assert [c.token_ids for c in synced] != [c.token_ids for c in first]


def test_a_moved_parameter_drops_the_graphs(graph_engine, peaky_policy):
    """A parameter at a new address (reassigned, not written in place) cannot be read by the old
    graphs: the engine captures again and follows the new weights."""
    _, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    graph_engine.generate(prompts[:2], params[:2])
    before = len(CAPTURES)
    embed = graph_engine.model.get_input_embeddings()
    embed.weight = torch.nn.Parameter(embed.weight.detach() * 1.5, requires_grad=False)
    after = graph_engine.generate(prompts[:2], params[:2])
    assert len(CAPTURES) > before
    fresh = HFEngine(copy.deepcopy(graph_engine.model), tok, lean_decode=True).generate(
        prompts[:2], params[:2]
    )
    same(after, fresh)


def test_packed_weights_are_kept_until_a_weight_changes(peaky_policy, monkeypatch):
    """Without graphs too (the CPU): a batch reuses the packed weights while no parameter was written;
    an optimizer step (in place) makes the next batch pack again, into the same tensors, and the
    engine then generates what a new engine does."""
    model, tok = peaky_policy
    engine = HFEngine(model, tok, lean_decode=True)
    prompts, params = mixed_requests(tok)
    refreshes = []
    refresh = PackedWeights.refresh
    monkeypatch.setattr(PackedWeights, "refresh", lambda self, m: (refreshes.append(1), refresh(self, m)))
    engine.generate(prompts, params)
    packed = engine._packed
    head = packed.head.w_t.data_ptr()
    engine.generate(prompts, params)
    assert engine._packed is packed and refreshes == []
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)
    torch.optim.SGD([model.lm_head.weight], lr=0.5).step()
    assert not packed.current(model)
    stepped = engine.generate(prompts, params)
    assert refreshes == [1] and engine._packed is packed and packed.head.w_t.data_ptr() == head
    same(stepped, HFEngine(copy.deepcopy(model), tok, lean_decode=True).generate(prompts, params))


def test_parameters_without_a_version_counter_are_never_assumed_unchanged(peaky_policy):
    """Inference tensors track no in-place writes: their weights key is None and never current."""
    model, _ = peaky_policy
    with torch.inference_mode():
        frozen = copy.deepcopy(model)
        for p in frozen.parameters():
            p.data = p.data.clone()
    assert weights_key(model) is not None
    assert weights_key(frozen) is None and not PackedWeights(frozen).current(frozen)


def test_graph_batches_take_a_whole_bucket(graph_engine, monkeypatch):
    """With graphs, a batch is as many rows as a bucket of rows and columns the budget holds, or as a
    kept arena of its columns holds: the test model keeps 1 KiB per token, a 10-token prompt and 6
    new tokens take the 128-column bucket."""
    requests = [graph_engine._request(i, [5] * 10, SamplingParams(max_tokens=6)) for i in range(80)]
    monkeypatch.setattr(hf, "kv_budget_bytes", lambda device: 20 * 128 * 1024)
    assert graph_engine.batch_rows(requests) == 16
    monkeypatch.setattr(hf, "kv_budget_bytes", lambda device: 200 * 128 * 1024)
    assert graph_engine.batch_rows(requests) == 80
    graph_engine.generate([r.prompt for r in requests[:64]], SamplingParams(max_tokens=6))
    monkeypatch.setattr(hf, "kv_budget_bytes", lambda device: 20 * 128 * 1024)  # the arena took memory
    assert graph_engine.batch_rows(requests) == 64, "a kept arena's rows cost nothing more"


def test_calls_from_two_threads_take_turns_at_the_kept_state(peaky_policy, graph_engine):
    """The packed weights and the graph arenas are one per engine: two threads generating at once
    each get what a call alone gets."""
    from concurrent.futures import ThreadPoolExecutor

    _, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    alone = graph_engine.generate(prompts, params)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: graph_engine.generate(prompts, params), range(2)))
    for result in results:
        same(result, alone)


def test_an_arena_replaced_for_more_stop_ids_keeps_its_rows(peaky_policy, graph_engine):
    """A batch of the same columns that needs more stop ids than the kept arena has replaces it with
    one that still holds the old arena's rows (so a later large batch does not allocate again)."""
    _, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    graph_engine.generate(prompts, params)
    (first,) = graph_engine._graphs.arenas
    stops = SamplingParams(max_tokens=5, stop_token_ids=tuple(range(900, 906)), seed=1)
    graph_engine.generate(prompts[:2], [stops, stops])
    (second,) = graph_engine._graphs.arenas
    assert second is not first and second.columns == first.columns
    assert (first.rows, first.stops, second.rows, second.stops) == (8, 4, 8, 8)


def test_an_arena_replaced_for_more_rows_captures_into_a_pool_of_its_own(peaky_policy, graph_engine):
    """A larger batch of the same columns replaces the kept arena, freeing every graph of its memory
    pool: the new arena's graphs go into a new pool, never the freed one's (a capture there fails the
    allocator's assert; seen on an H200 when an engine kept one pool for all its graphs)."""
    _, tok = peaky_policy
    prompts, params = mixed_requests(tok)
    graph_engine.generate(prompts[:2], params[:2])
    (small,) = graph_engine._graphs.arenas
    first_pool = small.pool
    del small
    CAPTURES.clear()  # the arena alone holds its graphs
    big = graph_engine.generate(prompts, params)
    (large,) = graph_engine._graphs.arenas
    assert (large.rows, large.pool) == (8, ("pool", 2))
    assert POOLS.released == {first_pool}, "the replaced arena's graphs were not freed"
    same(big, HFEngine(copy.deepcopy(graph_engine.model), tok, lean_decode=True).generate(prompts, params))
