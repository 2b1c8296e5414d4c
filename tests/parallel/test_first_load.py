"""FSDP2's first load read per rank (``parallel/shard_reads.py``) gives every rank exactly the shards
rank 0's broadcast gives: ``bench/first_load.py`` on 3 gloo ranks (dim-0 chunks of unequal size:
1024 and 128 rows over 3), from a bfloat16 checkpoint into float32 shards (the cast each rank makes
is the one rank 0's load made). The trainer's own use of it is proven against one process by
test_sharding.py's FSDP2 and HSDP comparisons, whose checkpoints every rank can read."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import ROOT
from tests.helpers.configs import TORCHRUN_ENV, torchrun_prefix


@pytest.mark.slow  # one torchrun launch of 3 ranks
def test_per_rank_shards_equal_the_broadcasts_bit_for_bit(tmp_path):
    out = tmp_path / "out.json"
    args = ["--preset", "h128-L8", "--layers", "2", "--checkpoint-dtype", "bfloat16", "--out", str(out)]
    proc = subprocess.run(
        [*torchrun_prefix(3), str(ROOT / "bench" / "first_load.py"), *args],
        env=TORCHRUN_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world"] == 3 and result["same_shards"]
    assert result["broadcast_sent_bytes"] == 2 * result["model_bytes"]  # rank 0 sends W - 1 copies


def test_the_checkpoint_a_rank_reads_is_local_or_fetched_into_its_nodes_hub_cache(
    tmp_path, tiny_model_dir, monkeypatch
):
    import huggingface_hub

    from agentrl.parallel import shard_reads

    assert shard_reads.local_checkpoint(str(tiny_model_dir)) == str(tiny_model_dir)
    assert shard_reads.local_checkpoint(str(tmp_path)) is None  # a directory without safetensors files
    fetched: list[str] = []

    def snapshot(repo, allow_patterns):
        fetched.append(repo)
        if repo == "org/missing":
            raise huggingface_hub.errors.LocalEntryNotFoundError("offline and not cached")
        return str(tiny_model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert shard_reads.local_checkpoint("Qwen/Qwen2.5-7B") == str(tiny_model_dir)
    assert shard_reads.local_checkpoint("org/missing") is None  # rank 0 then broadcasts
    assert fetched == ["Qwen/Qwen2.5-7B", "org/missing"]
    assert shard_reads.shard_source(str(tiny_model_dir)) is None  # one process: nothing to share
