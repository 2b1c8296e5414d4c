"""How long a rank waits for another (``tests/helpers/rank_waits.py`` on 2 gloo ranks whose
collectives time out after 3 s): past ``timeouts.collective_s`` where the wait is rightly longer (a
slow rank's episodes, rank 0 starting its Ray pool), and not at all where another rank has already
failed (a failed pool start, a failed weight bucket): every rank then stops at once, naming it."""

from __future__ import annotations

import pytest

from tests.helpers.configs import torchrun_record
from tests.helpers.rank_waits import SLOW_S

pytestmark = pytest.mark.slow  # one torchrun launch of ~25 s for all five cases


@pytest.fixture(scope="module")
def waits(tmp_path_factory):
    return torchrun_record("rank_waits.py", tmp_path_factory.mktemp("waits") / "out.json", [])


def test_a_fast_rank_waits_for_the_slowest_ranks_episodes_past_the_collective_timeout(waits):
    """Every colocated tp = 1 config runs episodes on every rank: rank 0, done first, waits in the
    gather for rank 1's share with timeouts.data_wait_s, not collective_s."""
    assert [w["episodes"].get("ok") for w in waits] == [[0, 1, 2, 3]] * 2
    assert waits[0]["episodes"]["s"] >= SLOW_S - 0.5


def test_the_other_ranks_wait_for_rank_0s_pool_at_a_barrier_of_its_own(waits):
    assert [w["pool"].get("ok") for w in waits] == ["pool", None]
    assert "error" not in waits[1]["pool"] and waits[1]["pool"]["s"] >= SLOW_S - 0.5


def test_a_failed_start_on_rank_0_stops_the_others_at_once_naming_it(waits):
    zero, one = waits[0]["pool_fails"], waits[1]["pool_fails"]
    assert zero["error"] == "ValueError" and "no GPU left for rollout worker 3" in zero["message"]
    assert one["error"] == "RuntimeError" and one["s"] < 2.0
    assert "the pool failed on another rank" in one["message"]
    assert "rank 0: ValueError: no GPU left for rollout worker 3" in one["message"]


def test_a_start_past_the_barriers_limit_names_the_setting(waits):
    one = waits[1]["pool_hangs"]
    assert one["error"] == "CollectiveError" and "timeouts.x=0.5s" in one["message"]


def test_a_rank_that_fails_a_weight_bucket_stops_every_rank_at_once(waits):
    """Rank 0's engine fails at bucket 2; rank 1 would otherwise wait in bucket 3's collective until
    the group's timeout (NCCL's watchdog on a GPU: an abort after timeouts.collective_s)."""
    zero, one = waits[0]["sync_fails"], waits[1]["sync_fails"]
    assert zero["error"] == "WeightSyncError" and "the engine's worker died" in zero["message"]
    assert one["error"] == "WeightSyncError" and one["s"] < 2.0
    assert "another rank failed (rank 0: WeightSyncError: " in one["message"]
    assert "loading bucket 2" in one["message"]
