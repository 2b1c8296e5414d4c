"""Bucketed weight sync and its proof (agentrl/sync/weight_sync.py): buckets give the engine exactly what a
whole-state sync gives (HF engine, LoRA merged weights, a Ray pool, FSDP2 on two ranks); the
fingerprint names a tensor the engine serves wrongly and the probe catches what the samples miss;
``verify`` first/off; a stuck engine raises within the time limit; the trainer logs the sync and
stops on a wrong engine."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from agentrl.assembly import make_trainer
from agentrl.config.schema import LoraConfig
from agentrl.engines.base import SamplingParams
from agentrl.engines.fingerprint import probe_ids, sample_indices, splitmix64, tensor_checksum
from agentrl.engines.hf import HFEngine
from agentrl.engines.scripted import ScriptedEngine
from agentrl.models import load_policy
from agentrl.sync.weight_sync import (
    MiB,
    PolicyProbe,
    SyncSettings,
    WeightSyncError,
    pack_buckets,
    sync_weights,
)
from agentrl.timeouts import WaitTimeout
from agentrl.training import lora
from tests.helpers import HELPERS
from tests.helpers.configs import TORCHRUN_ENV, ray_config, small_config, torchrun_prefix
from tests.helpers.jsonl import lines

SMALL = 0.05  # MiB: 52,428 bytes, less than the embedding (1024 × 128 × 4 = 524,288 bytes)


def probe_of(model: torch.nn.Module) -> PolicyProbe:
    return PolicyProbe(model, torch.device("cpu"), "float32", lambda m: None)


def perturbed(model_dir: Path, seed: int = 1) -> torch.nn.Module:
    """The tiny policy with every parameter moved (what an update does)."""
    model, _ = load_policy(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return model


def engine_for(model_dir: Path, dtype: str | None = None) -> HFEngine:
    model, tok = load_policy(model_dir)
    return HFEngine(model, tok, dtype=dtype)


def params(model: torch.nn.Module):
    return ((n, p.detach()) for n, p in model.named_parameters())


def assert_same_state(a: HFEngine, b: HFEngine) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    assert [n for n in sa if not torch.equal(sa[n], sb[n])] == []


# -- the pieces -----------------------------------------------------------------------------------
def test_pack_buckets_keeps_order_and_puts_a_big_tensor_alone():
    # float32 sizes 40, 80, 1200, 20, 20 bytes into buckets of 100: 40 + 80 > 100 splits a | b;
    # c (1200) is alone; d + e = 40 fit together
    sizes = {"a": 10, "b": 20, "c": 300, "d": 5, "e": 5}
    taken: list[str] = []

    def stream():
        for n, k in sizes.items():
            taken.append(n)
            yield n, torch.zeros(k)

    buckets = pack_buckets(stream(), 100)
    first = next(buckets)
    assert [n for n, _ in first] == ["a"] and taken == ["a", "b"]  # lazy: b did not fit, a goes
    assert [[n for n, _ in b] for b in buckets] == [["b"], ["c"], ["d", "e"]]
    assert [[n for n, _ in b] for b in pack_buckets(stream(), 10**9)] == [["a", "b", "c", "d", "e"]]


def test_samples_and_probe_are_deterministic():
    # SplitMix64 seeded with 0 (Vigna's reference splitmix64.c): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4,
    # 0x06c45d188009454f
    assert [int(x) for x in splitmix64(0, 3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert torch.equal(sample_indices("w", 300), torch.arange(300))  # small: every element
    idx = sample_indices("model.layers.0.mlp.up_proj.weight", 448 * 128)
    assert len(idx) == 512 and int(idx.min()) >= 0 and int(idx.max()) < 448 * 128
    assert torch.equal(idx, sample_indices("model.layers.0.mlp.up_proj.weight", 448 * 128))
    assert not torch.equal(idx, sample_indices("model.layers.1.mlp.up_proj.weight", 448 * 128))
    ids = probe_ids(1024, 32)
    assert ids == probe_ids(1024, 32) and len(ids) == 32 and all(0 <= i < 1024 for i in ids)
    # a non-contiguous view is sampled like its contiguous copy; a cast changes the checksum
    t = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    assert tensor_checksum("x", t.T) == tensor_checksum("x", t.T.contiguous())
    assert tensor_checksum("x", t) != tensor_checksum("x", t.to(torch.bfloat16))


def test_an_engine_without_bucketed_receive_is_refused(tiny_policy):
    model, _ = tiny_policy
    with pytest.raises(TypeError, match="ScriptedEngine cannot take a bucketed"):
        sync_weights(ScriptedEngine([]), params(model), SyncSettings(), probe_of(model))


# -- bucketed == whole, and the proof ---------------------------------------------------------------
@pytest.mark.parametrize("bucket_mb", [SMALL, 0.3, 1.0, 1e6])
def test_bucketed_sync_equals_whole_state_sync(tiny_model_dir, bucket_mb):
    trainer_model = perturbed(tiny_model_dir)
    whole, bucketed = engine_for(tiny_model_dir), engine_for(tiny_model_dir)
    whole.load_weights(params(trainer_model))
    report = sync_weights(
        bucketed, params(trainer_model), SyncSettings(bucket_mb=bucket_mb), probe_of(trainer_model)
    )
    assert_same_state(whole, bucketed)
    sizes = [sum(t.numel() * 4 for _, t in b) for b in pack_buckets(params(trainer_model), bucket_mb * MiB)]
    assert report.buckets == len(sizes) and report.largest_bucket_bytes == max(sizes)
    assert report.bytes == 4 * sum(p.numel() for p in trainer_model.parameters())
    assert report.buckets > 1 or bucket_mb >= 1.0  # the small sizes really split the model
    assert report.verified and report.version == bucketed.version == 1
    assert report.probe_max_abs_diff == 0.0  # the same float32 weights, the same forward
    m = report.metrics()
    assert m["sync/verified"] == 1.0 and m["sync/buckets"] == report.buckets and m["time/sync_s"] > 0


def lora_policy(model_dir: Path) -> torch.nn.Module:
    """A peft policy whose adapters have moved (B ≠ 0), so the merged weights differ from the base."""
    model, _ = load_policy(model_dir)
    peft = lora.apply(model, LoraConfig(rank=4, alpha=8.0), seed=0)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return peft


@pytest.mark.parametrize("bucket_mb", [SMALL, 1e6])
def test_after_a_level_2_sleep_lora_sends_every_weight(tiny_model_dir, bucket_mb):
    """vLLM's level-2 sleep discards every engine weight (it backs up buffers only), so the adapted
    layers alone would leave embeddings, norms, the head and the other projections as garbage: here
    the engine's weights are all overwritten, as a level-2 wake leaves them. The full stream gives
    the engine exactly the merged policy; the adapted layers alone leave it serving garbage, which
    the proof names."""
    peft = lora_policy(tiny_model_dir)
    want = engine_for(tiny_model_dir)
    want.load_weights(lora.merged_weights(peft))

    def woken() -> HFEngine:
        engine = engine_for(tiny_model_dir)
        with torch.no_grad():
            for p in engine.model.parameters():
                p.fill_(3.0)
        return engine

    full = lora.merged_buckets(peft, bucket_mb * MiB, None, torch.device("cpu"), full=True)
    names = [
        n
        for b in lora.merged_buckets(peft, bucket_mb * MiB, None, torch.device("cpu"), full=True)
        for n, _ in b
    ]
    assert names == [n for n, _ in engine_for(tiny_model_dir).model.named_parameters()]  # each weight once
    engine = woken()
    report = sync_weights(
        engine, (t for b in full for t in b), SyncSettings(bucket_mb=bucket_mb), probe_of(peft)
    )
    assert_same_state(want, engine) and report.probe_max_abs_diff < 1e-4
    adapted_only = (
        t for b in lora.merged_buckets(peft, bucket_mb * MiB, None, torch.device("cpu")) for t in b
    )
    with pytest.raises(WeightSyncError, match="does not serve the trainer's weights"):
        sync_weights(woken(), adapted_only, SyncSettings(bucket_mb=bucket_mb), probe_of(peft))


def test_the_weight_push_asks_for_every_weight_after_a_level_2_sleep():
    from agentrl.assembly.records import push_settings
    from agentrl.config import Config
    from agentrl.training.weight_push import WeightPush

    asked: list[bool] = []

    class Learner:
        def engine_buckets(self, bucket_bytes, dtype, full=False):
            asked.append(full)
            return iter([])

    for level in (1, 2):
        cfg = Config()
        cfg.trainer.bf16 = False  # auto is decided by a run's start (assembly/precision.py)
        cfg.rollout.colocate.sleep, cfg.rollout.colocate.sleep_level = True, level
        push = WeightPush(push_settings(cfg), Learner(), engine=None)
        push.settings = lambda: (SyncSettings(), None)  # type: ignore[method-assign]
        with pytest.raises(TypeError):  # no engine: the buckets were asked for first
            push.sync()
    assert asked == [False, True]


@pytest.mark.parametrize("bucket_mb", [SMALL, 1e6])
def test_lora_merged_weights_bucketed_equals_whole(tiny_model_dir, bucket_mb):
    peft = lora_policy(tiny_model_dir)
    whole, bucketed = engine_for(tiny_model_dir), engine_for(tiny_model_dir)
    whole.load_weights(lora.merged_weights(peft))
    report = sync_weights(
        bucketed, lora.merged_weights(peft), SyncSettings(bucket_mb=bucket_mb), probe_of(peft)
    )
    assert_same_state(whole, bucketed)
    # 2 layers × 7 adapted projections; the engine's policy is the peft forward's (merged in fp32)
    assert report.tensors == 14 and report.probe_max_abs_diff < 1e-4
    base = engine_for(tiny_model_dir).model.state_dict()
    moved = [n for n, t in bucketed.model.state_dict().items() if not torch.equal(t, base[n])]
    assert len(moved) == 14 and all(n.endswith("proj.weight") for n in moved)


class Corrupting(HFEngine):
    """Adds noise to one tensor after loading it, from its ``after``-th update on."""

    def __init__(self, model, tok, name: str, after: int = 1, **kw) -> None:
        super().__init__(model, tok, **kw)
        self.name, self.after = name, after

    def load_weight_bucket(self, bucket) -> None:
        bucket = list(bucket)
        super().load_weight_bucket(bucket)
        if self.version + 1 >= self.after and self.name in dict(bucket):
            with torch.no_grad():
                p = self.model.get_parameter(self.name)
                p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_fingerprint_names_exactly_the_corrupted_tensor(tiny_model_dir, dtype):
    trainer_model = perturbed(tiny_model_dir)
    # a correct sync into a bfloat16 engine matches: the trainer casts its samples to the engine's dtype
    ok = engine_for(tiny_model_dir, dtype)
    ok_report = sync_weights(
        ok, params(trainer_model), SyncSettings(bucket_mb=SMALL), probe_of(trainer_model)
    )
    assert ok_report.verified and ok_report.probe_max_abs_diff < (5e-2 if dtype else 1e-6)
    name = "model.layers.1.mlp.down_proj.weight"
    model, tok = load_policy(tiny_model_dir)
    bad = Corrupting(model, tok, name, dtype=dtype)
    with pytest.raises(WeightSyncError) as err:
        sync_weights(bad, params(trainer_model), SyncSettings(bucket_mb=SMALL), probe_of(trainer_model))
    msg = str(err.value)
    n = len(list(trainer_model.parameters()))
    assert f"Corrupting does not serve the trainer's weights: 1 of {n} tensors differ" in msg
    assert f"({name})" in msg


def test_the_probe_catches_a_wrong_tensor_that_was_not_synced(tiny_model_dir):
    """With LoRA only the adapted layers are synced and checksummed; a wrong final norm in the engine
    (never synced) leaves every checksum right, and only the probe sees it."""
    peft = lora_policy(tiny_model_dir)
    engine = engine_for(tiny_model_dir)
    with torch.no_grad():
        engine.model.model.norm.weight.mul_(1.5)
    with pytest.raises(WeightSyncError, match=r"all 14 tensors' sampled checksums match, but the probe's"):
        sync_weights(engine, lora.merged_weights(peft), SyncSettings(), probe_of(peft))


@pytest.mark.parametrize(
    ("verify", "checks"), [("every", [True, True]), ("first", [True, False]), ("off", [False, False])]
)
def test_verify_every_first_off(tiny_model_dir, verify, checks):
    """The engine corrupts a tensor from its second update on: ``every`` stops there, ``first``
    checked only the first sync and lets the second pass, ``off`` never checks."""
    trainer_model = perturbed(tiny_model_dir)
    model, tok = load_policy(tiny_model_dir)
    engine = Corrupting(model, tok, "lm_head.weight", after=2)
    settings = SyncSettings(verify=verify)
    first = sync_weights(engine, params(trainer_model), settings, probe_of(trainer_model))
    assert first.verified == checks[0] and ("sync/probe_max_abs_diff" in first.metrics()) == checks[0]
    if checks[1]:
        with pytest.raises(WeightSyncError, match=r"\(lm_head.weight\)"):
            sync_weights(engine, params(trainer_model), settings, probe_of(trainer_model))
    else:
        second = sync_weights(engine, params(trainer_model), settings, probe_of(trainer_model))
        assert not second.verified and second.metrics()["sync/verified"] == 0.0
        assert "sync/probe_max_abs_diff" not in second.metrics()


class Stuck(HFEngine):
    """Blocks in one method until released."""

    def __init__(self, model, tok, where: str) -> None:
        super().__init__(model, tok)
        self.where, self.release = where, threading.Event()

    def load_weight_bucket(self, bucket) -> None:
        if self.where == "load_weight_bucket":
            self.release.wait()
        super().load_weight_bucket(bucket)

    def fingerprint(self, names, probe_ids):
        if self.where == "fingerprint":
            self.release.wait()
        return super().fingerprint(names, probe_ids)


@pytest.mark.parametrize(
    ("where", "step"),
    [
        ("load_weight_bucket", "loading bucket 1 (0.5 MiB: model.embed_tokens.weight)"),
        ("fingerprint", "fingerprinting 27 tensors"),
    ],
)
def test_a_stuck_engine_raises_within_the_time_limit(tiny_model_dir, where, step):
    trainer_model = perturbed(tiny_model_dir)
    model, tok = load_policy(tiny_model_dir)
    engine = Stuck(model, tok, where)
    t0 = time.monotonic()
    try:
        with pytest.raises(WaitTimeout) as err:
            sync_weights(
                engine,
                params(trainer_model),
                SyncSettings(bucket_mb=SMALL, timeout_s=1.0),
                probe_of(trainer_model),
            )
        waited = time.monotonic() - t0
    finally:
        engine.release.set()  # let the abandoned thread end
    assert 1.0 <= waited < 3.0
    msg = str(err.value)
    assert f"weight sync into Stuck: {step}" in msg and "timeouts.weight_sync_s=1s" in msg, msg


# -- in the trainer ---------------------------------------------------------------------------------
def test_trainer_logs_the_sync_and_stops_on_a_wrong_engine(tmp_path, tiny_model_dir, monkeypatch):
    cfg = small_config(tmp_path, tiny_model_dir, "rollout.sync.bucket_mb=0.3")
    trainer = make_trainer(cfg, log=lambda *_: None)
    trainer.train()
    rows = [json.loads(line) for line in lines(tmp_path / "run" / "metrics.jsonl")]
    n_bytes = 4 * sum(p.numel() for p in trainer.model.parameters())
    buckets = len(list(pack_buckets(params(trainer.model), 0.3 * MiB)))
    for r in rows:
        assert r["sync/verified"] == 1.0 and r["sync/bytes"] == n_bytes and r["sync/buckets"] == buckets
        assert r["sync/probe_max_abs_diff"] < 1e-3 and r["time/sync_s"] > 0
    assert buckets > 1

    cfg = small_config(tmp_path / "bad", tiny_model_dir)
    trainer = make_trainer(cfg, log=lambda *_: None)
    real = trainer.engine.load_weight_bucket

    def dropping_v_proj(bucket):  # a transport that loses one tensor
        real([(n, t) for n, t in bucket if n != "model.layers.0.self_attn.v_proj.weight"])

    monkeypatch.setattr(trainer.engine, "load_weight_bucket", dropping_v_proj)
    with pytest.raises(
        WeightSyncError, match=r"1 of 27 tensors differ.*\(model.layers.0.self_attn.v_proj.weight\)"
    ):
        trainer.train()


def test_lora_trainer_names_merged_tensors_dropped_on_the_way(tmp_path, tiny_model_dir, monkeypatch):
    cfg = small_config(
        tmp_path, tiny_model_dir, "model.lora.rank=4", "model.lora.alpha=64", "trainer.lr=1e-2"
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    out = trainer.train_step(0)  # an update: the adapters move, merged ≠ base
    assert out.metrics["sync/verified"] == 1.0 and out.metrics["sync/bytes"] > 0
    real = trainer.engine.load_weight_bucket
    dropped = ["model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    monkeypatch.setattr(
        trainer.engine, "load_weight_bucket", lambda b: real([(n, t) for n, t in b if n not in dropped])
    )
    with torch.no_grad():  # another update's worth of movement (every adapted layer's B changes)
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.01)
    with pytest.raises(WeightSyncError) as err:
        trainer.weights.push()
    assert f"2 of 14 tensors differ from the trainer's ({dropped[0]}, {dropped[1]})" in str(err.value)


# -- a Ray pool -------------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.slow  # 25-56 s: in the full tier (.ci/run), not the fast one
def test_ray_pool_bucketed_equals_whole_and_a_replaced_worker_has_the_weights(
    ray_local, tmp_path, tiny_model_dir
):
    ray = ray_local
    from agentrl.assembly import components

    cfg = ray_config(tmp_path, tiny_model_dir)
    pool = components.rollout_pool(cfg, str(tiny_model_dir), workers=2)
    try:
        trainer_model = perturbed(tiny_model_dir)
        names = [n for n, _ in trainer_model.named_parameters()]
        ids = probe_ids(1024, 64)
        report = sync_weights(
            pool, params(trainer_model), SyncSettings(bucket_mb=SMALL), probe_of(trainer_model)
        )
        assert report.verified and report.buckets > 1 and pool.version == 1
        bucketed = pool.fingerprint(names, ids)
        pool.load_weights(params(load_policy(tiny_model_dir)[0]))  # back to the base, then the whole state
        pool.load_weights(params(trainer_model))
        whole = pool.fingerprint(names, ids)
        # per worker, the same weights bit for bit: every checksum and every probe log-prob equal
        assert [(f.checksums, f.probe_logprobs) for f in bucketed] == [
            (f.checksums, f.probe_logprobs) for f in whole
        ]
        assert [f.source.split(" (")[0] for f in whole] == ["rollout worker 0", "rollout worker 1"]
        # while an update is half done, nothing is submitted to the workers: a generate waits for it
        pool.begin_weight_update()
        pool.load_weight_bucket(list(params(trainer_model))[:3])
        gen = threading.Thread(target=pool.generate, args=([[5, 6, 7]], SamplingParams(max_tokens=2)))
        gen.start()
        gen.join(timeout=1.0)
        assert gen.is_alive()
        pool.finish_weight_update()
        gen.join(timeout=60)
        assert not gen.is_alive()
        # a replaced worker copies the current weights from a live one
        dead = pool.workers[1]
        ray.kill(dead, no_restart=True)
        deadline = time.monotonic() + 60  # ray.kill is asynchronous: a call may still land before the death
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(dead.pid.remote(), timeout=60)
                time.sleep(0.1)
        pool._replace_dead()
        assert pool.workers[1] is not dead
        again = sync_weights(pool, iter(()), SyncSettings(), probe_of(trainer_model))  # an empty update
        assert again.verified and again.tensors == 0
        assert pool.fingerprint(names, ids)[1].checksums == whole[1].checksums
    finally:
        pool.shutdown()


# -- the broadcast transport (rollout.sync.transport=broadcast) ---------------------------------------
def test_a_bucket_broadcast_over_gloo_arrives_bit_for_bit_in_order():
    """Two ranks in two threads of this process, gloo on the CPU: three dtypes in one bucket (one flat
    buffer each) come back as the same (name, tensor) pairs in the same order; the store tells which
    ranks began to join."""
    from agentrl.sync import weight_group

    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    bucket = [
        ("a", torch.randn(3, 4, generator=g)),
        ("b", torch.randn(5, generator=g).to(torch.bfloat16)),
        ("c", torch.arange(6).reshape(2, 3)),
        ("d", torch.randn(2, 1, 2, generator=g)),
    ]
    store = weight_group.host_store("127.0.0.1", 2, 30.0)
    got: dict = {}

    def rank1() -> None:
        try:
            client = weight_group.client_store("127.0.0.1", store.port, 1, 30.0)
            group = weight_group.make_group(client, 1, 2, cpu, 30.0)
            got["bucket"] = weight_group.receive_bucket(group, weight_group.layout(bucket), cpu, 30.0)
        except BaseException as e:
            got["error"] = e

    t = threading.Thread(target=rank1, daemon=True)
    t.start()
    group = weight_group.make_group(store, 0, 2, cpu, 30.0)
    weight_group.send_bucket(group, bucket, cpu, 30.0)
    t.join(timeout=60)
    assert "error" not in got, got.get("error")
    assert [n for n, _ in got["bucket"]] == ["a", "b", "c", "d"]
    for (_, want), (_, have) in zip(bucket, got["bucket"]):
        assert have.dtype == want.dtype and have.shape == want.shape and torch.equal(have, want)
    assert weight_group.joined(store, [1, 2]) == [True, False]


def test_broadcast_needs_ray_workers(tmp_path, tiny_model_dir):
    from agentrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.sync.transport=broadcast .* rollout.workers=0"):
        small_config(tmp_path, tiny_model_dir, "rollout.sync.transport=broadcast")


@pytest.mark.ray
@pytest.mark.slow  # 25-56 s: in the full tier (.ci/run), not the fast one
def test_ray_pool_broadcast_equals_object_store_and_a_replaced_worker_rejoins(
    ray_local, tmp_path, tiny_model_dir
):
    ray = ray_local
    from agentrl.assembly import components

    cfg = ray_config(
        tmp_path, tiny_model_dir, "rollout.sync.transport=broadcast", "timeouts.weight_sync_s=120"
    )
    pool = components.rollout_pool(cfg, str(tiny_model_dir), workers=2)
    try:
        trainer_model = perturbed(tiny_model_dir)
        names = [n for n, _ in trainer_model.named_parameters()]
        ids = probe_ids(1024, 64)
        settings = SyncSettings(bucket_mb=SMALL, timeout_s=120)
        report = sync_weights(pool, params(trainer_model), settings, probe_of(trainer_model))
        assert report.verified and report.buckets > 1 and pool.version == 1
        assert (
            pool.weights.end("broadcast").group is not None
            and pool.weights.end("broadcast").members == pool.workers
        )  # it went by the group
        broadcast = pool.fingerprint(names, ids)
        pool.weights.transport = "object_store"  # the same weights through Ray's object store
        pool.load_weights(params(load_policy(tiny_model_dir)[0]))
        pool.load_weights(params(trainer_model))
        stored = pool.fingerprint(names, ids)
        # per worker, the same weights bit for bit: every checksum and every probe log-prob equal
        assert [(f.checksums, f.probe_logprobs) for f in broadcast] == [
            (f.checksums, f.probe_logprobs) for f in stored
        ]
        assert len(stored) == 2 and len(stored[0].checksums) == len(names)
        # worker 1 dies and is replaced: the next broadcast sync builds a new group that includes it
        pool.weights.transport = "broadcast"
        dead, old_group = pool.workers[1], pool.weights.end("broadcast").group
        ray.kill(dead, no_restart=True)
        deadline = time.monotonic() + 60  # ray.kill is asynchronous: a call may still land before the death
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(dead.pid.remote(), timeout=60)
                time.sleep(0.1)
        pool._replace_dead()
        assert pool.workers[1] is not dead
        second = perturbed(tiny_model_dir, seed=2)
        again = sync_weights(pool, params(second), settings, probe_of(second))
        assert again.verified and again.tensors == len(names) and pool.version == 4
        assert (
            pool.weights.end("broadcast").group is not old_group
            and pool.weights.end("broadcast").members[1] is pool.workers[1]
        )
        moved = pool.fingerprint(names, ids)
        assert moved[0].checksums == moved[1].checksums != stored[1].checksums
    finally:
        pool.shutdown()


@pytest.mark.ray
@pytest.mark.slow  # 25-56 s: in the full tier (.ci/run), not the fast one
def test_ray_pool_broadcast_names_a_worker_that_never_joins(ray_local, tmp_path, tiny_model_dir):
    ray = ray_local
    from agentrl.assembly import components
    from agentrl.rollout.ray_worker import RolloutWorker

    class NeverJoins(RolloutWorker):  # defined here, so Ray ships it to the worker by value
        def join_weight_group(self, *args: object) -> int:
            time.sleep(3600)
            return -1

    limit = 10.0  # the join may take half: 5 s
    cfg = ray_config(
        tmp_path, tiny_model_dir, "rollout.sync.transport=broadcast", f"timeouts.weight_sync_s={limit}"
    )
    pool = components.rollout_pool(cfg, str(tiny_model_dir), workers=2)
    try:
        pool._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(NeverJoins)
        ray.kill(pool.workers[1], no_restart=True)
        time.sleep(1.0)  # ray.kill is asynchronous
        pool._replace_dead()  # worker 1 is now one that never joins
        model = perturbed(tiny_model_dir)
        t0 = time.monotonic()
        with pytest.raises(WaitTimeout) as err:
            sync_weights(pool, params(model), SyncSettings(bucket_mb=SMALL, timeout_s=limit), probe_of(model))
        took = time.monotonic() - t0
        assert limit / 2 <= took < limit / 2 + 5.0, took  # named before the sync's own limit
        msg = str(err.value)
        assert "rollout workers [1] joining the weight-sync group" in msg, msg
        assert "half of timeouts.weight_sync_s=10s" in msg and "killed them" in msg, msg
        assert pool.weights.end("broadcast").group is None and pool.version == 0  # nothing half-built is kept
        assert pool.weights.lock.acquire(blocking=False)  # the failed update let go of the lock
        pool.weights.lock.release()
        # the pool is not wedged: the killed worker is replaced by one that joins, and the next sync
        # (once worker 0's abandoned join has timed out, up to 10 s after it began: the sync's clock
        # here allows for that wait; the join itself still has 5 s) builds a new group and verifies
        pool._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        pool._replace_dead()
        report = sync_weights(
            pool, params(model), SyncSettings(bucket_mb=SMALL, timeout_s=60), probe_of(model)
        )
        assert report.verified and pool.version == 1 and pool.weights.end("broadcast").members == pool.workers
    finally:
        pool.shutdown()


# -- FSDP2 on two ranks -------------------------------------------------------------------------------
@pytest.mark.slow
def test_fsdp2_bucketed_gather_in_the_engines_dtype_equals_the_per_parameter_transfer(
    tmp_path, tiny_model_dir
):
    """One launch of two ranks, three variants: full weights into a float32 engine and into a
    bfloat16 one, and LoRA's merged weights. Each rank's engine after the trainer's push (each bucket
    gathered by one all-gather, in the engine's dtype) equals, bit for bit, a copy fed the
    transfer it replaces (one full_tensor() per parameter in float32, cast by the engine)."""
    out = tmp_path / "sync.json"
    overrides = [
        f"model.path={tiny_model_dir}",
        "run.device=cpu",
        "trainer.strategy=fsdp2",
        "trainer.micro_batch_size=1",
        "logging.tensorboard=false",
        "logging.plots=false",
    ]
    variants = {
        "fp32": [],
        "bf16_engine": ["rollout.dtype=bfloat16"],
        "lora": ["model.lora.rank=4"],
    }
    proc = subprocess.run(
        [
            *torchrun_prefix(2),
            str(HELPERS / "sharded_sync.py"),
            str(out),
            *overrides,
            "--variants",
            json.dumps(variants),
        ],
        env={**TORCHRUN_ENV, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(out.read_text())
    for name, ranks in found.items():
        assert len(ranks) == 2
        for r in ranks:
            assert r["differ"] == [] and r["moved"] > 0, name  # the same bytes, and they changed
            # full weights: every tensor moved (into bfloat16 some small steps round away);
            # LoRA: the adapted layers' merged weights only
            assert name != "fp32" or r["moved"] == r["tensors"]
            assert name != "lora" or r["moved"] < r["tensors"]
            assert r["verified"] == 1.0 and r["buckets"] > 1, name
            if name == "lora":  # W, A and B of a bucket's layers gathered together, in float32
                assert len(r["gathers"]) == r["buckets"] and set(r["gathers"]) == {"torch.float32"}
            else:  # one collective per bucket, in the engine's dtype
                dtype = "torch.bfloat16" if name == "bf16_engine" else "torch.float32"
                assert r["gathers"] == [dtype] * int(r["buckets"]) and r["engine_dtype"] == dtype, name
            limit = 0.5 if name == "bf16_engine" else 1e-3
            assert r["probe_max_abs_diff"] < limit, name


def test_the_settings_come_from_the_config(tmp_path, tiny_model_dir):
    from agentrl.assembly.records import sync_settings

    cfg = small_config(
        tmp_path, tiny_model_dir, "rollout.sync.bucket_mb=8", "rollout.sync.verify=first",
        "rollout.sync.probe_tokens=5", "rollout.sync.probe_atol=0.01", "timeouts.weight_sync_s=42",
    )  # fmt: skip
    assert sync_settings(cfg) == SyncSettings(8.0, "first", 5, 0.01, 42.0)
    # the default tolerance: 1e-3 when both sides compute in float32, 0.5 when one is 16-bit
    assert SyncSettings().atol("float32", "float32") == 1e-3
    assert SyncSettings().atol("bfloat16", "float32") == 0.5
    assert SyncSettings(probe_atol=0.2).atol("float32", "float32") == 0.2


def test_a_buckets_samples_are_read_back_once(monkeypatch):
    """``sampled_many`` takes the same values as ``sampled`` one tensor at a time, with one copy
    back to the host per device instead of one per tensor."""
    from agentrl.engines.fingerprint import sampled, sampled_many

    g = torch.Generator().manual_seed(0)
    bucket = [
        ("w", torch.randn(40, 30, generator=g)),
        ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("t", torch.randn(30, 40, generator=g).t()),  # not contiguous
        ("e", torch.zeros(0)),
    ]
    one_by_one = [sampled(n, t) for n, t in bucket]
    reads = []
    real = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    together = sampled_many(bucket)
    assert len(reads) == 1
    for a, b in zip(together, one_by_one):
        assert a.dtype == b.dtype and torch.equal(a, b)
