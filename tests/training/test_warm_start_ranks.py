"""The SFT warm start under torchrun (``build.policy_path``, ``tests/helpers/warm_start_ranks.py`` on
2 gloo ranks): rank 0 trains it once while the other ranks wait past the collectives' timeout, then
every rank reads it; a node that cannot see rank 0's directory trains its own; a failure on rank 0
stops rank 1 at once. Before, every rank trained the same warm start and then ran ``rmtree`` and
``os.replace`` on the one cache directory the others were loading from."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import HELPERS
from tests.helpers.configs import TORCHRUN_ENV, torchrun_prefix
from tests.helpers.warm_start_ranks import SFT_S

pytestmark = pytest.mark.slow  # one torchrun launch, ~25 s


@pytest.fixture(scope="module")
def ranks_said(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("warm")
    proc = subprocess.run(
        [*torchrun_prefix(2), str(HELPERS / "warm_start_ranks.py"), str(out), str(tiny_model_dir)],
        env=TORCHRUN_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "out.json").read_text())


def test_rank_0_trains_the_warm_start_once_and_every_rank_reads_it(ranks_said):
    zero, one = (r["shared"] for r in ranks_said)
    assert "error" not in zero and "error" not in one
    assert zero["path"] == one["path"] and zero["path"].startswith("shared/shared/warmstart/")
    assert [line.split()[0] for line in ranks_said[0]["trained"] if line][:1] == ["0"]
    assert one["s"] >= SFT_S - 0.5  # rank 1 waited past the 3 s collective timeout
    assert zero["left"] == one["left"] and len(zero["left"]) == 1  # no temporary directory left


def test_a_node_that_cannot_see_rank_0s_cache_trains_its_own(ranks_said):
    trained = [line.split() for line in ranks_said[0]["trained"] if line]
    assert trained == [["0", ranks_said[0]["trained"][0].split()[1]], ["0", "node0"], ["1", "node1"]]
    zero, one = (r["node_local"] for r in ranks_said)
    assert zero["path"].startswith("node_local/rank0/") and one["path"].startswith("node_local/rank1/")


def test_a_warm_start_that_fails_on_rank_0_stops_rank_1_at_once(ranks_said):
    zero, one = (r["fails"] for r in ranks_said)
    assert zero["error"] == "RuntimeError" and "do not fit rollout.max_episode_tokens" in zero["message"]
    assert one["error"] == "RuntimeError" and one["s"] < 2.0
    assert (
        "the SFT warm start failed on another rank" in one["message"]
        and "rank 0: RuntimeError" in one["message"]
    )
