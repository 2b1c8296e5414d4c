"""Transcript writing/reading: append-only, crash-tolerant, streaming; the --filter language."""

from __future__ import annotations

import time
import tracemalloc
import types
import warnings
from pathlib import Path

import pytest

from agentrl.episode import Episode, Segment
from agentrl.errors import Failure
from agentrl.transcripts import (
    TranscriptWarning,
    TranscriptWriter,
    iter_episodes,
    iter_records,
    parse_filter,
    read_episode_at,
    read_metrics,
)
from agentrl.views.run_tokenizer import tokenizer_candidates
from tests.helpers import DATA

RUN = DATA / "transcripts" / "run"


def make_ep(i: int, step: int = 0, reward: float = 0.0, **kw) -> Episode:
    ep = Episode(id=f"ep-{i}", env="calc", task_id=f"t{i % 7}", step=step, reward=reward, **kw)
    ep.add(Segment("prompt", 0, [1, 2, 3], "abc"))
    ep.add(Segment("policy", 0, [4, 5], "de", logprobs=[-0.1, -0.2], weight_version=0))
    return ep


def test_writer_round_trip_and_append(tmp_path):
    path = tmp_path / "run" / "transcripts.jsonl"
    with TranscriptWriter(path) as w:
        assert w.write([make_ep(0, step=1), make_ep(1, step=1)]) == 2
    with TranscriptWriter(path) as w:  # a resumed run appends
        w.write([make_ep(2, step=2, overlays={"weight": [None] * 3 + [1.1, 1.0]})])
    eps = list(iter_episodes(path))
    assert [e.id for e in eps] == ["ep-0", "ep-1", "ep-2"]
    assert eps[2].to_dict() == make_ep(2, step=2, overlays={"weight": [None] * 3 + [1.1, 1.0]}).to_dict()


def test_torn_last_line_is_skipped_with_a_warning_and_sealed_by_the_writer(tmp_path):
    path = tmp_path / "transcripts.jsonl"
    with TranscriptWriter(path) as w:
        w.write([make_ep(0), make_ep(1)])
    line = make_ep(2).to_json()
    with open(path, "a") as f:
        f.write(line[: len(line) // 2])  # a kill in the middle of a write
    with pytest.warns(TranscriptWarning, match="torn last line"):
        assert [e.id for e in iter_episodes(path)] == ["ep-0", "ep-1"]
    with TranscriptWriter(path) as w:  # restart: the torn bytes stay, new lines start clean
        w.write([make_ep(3)])
    with pytest.warns(TranscriptWarning, match="unreadable line"):
        assert [e.id for e in iter_episodes(path)] == ["ep-0", "ep-1", "ep-3"]


def test_step_and_episode_selection_do_not_confuse_prefixes(tmp_path):
    path = tmp_path / "t.jsonl"
    with TranscriptWriter(path) as w:
        w.write([make_ep(i, step=s) for i, s in enumerate([1, 10, 1, 11, 2])])
    assert [e.id for e in iter_episodes(path, step=1)] == ["ep-0", "ep-2"]  # not step 10 or 11
    assert [e.id for e in iter_episodes(path, episode="ep-1")] == ["ep-1"]  # not ep-10...
    offsets = [off for off, d in iter_records(path) if d["id"] == "ep-3"]
    assert read_episode_at(path, offsets[0]).step == 11


def test_filter_language():
    ok = make_ep(0, step=3, reward=0.25, stop_reason="max_turns")
    ok.failure = Failure("tool", "boom")
    ok.reward_components = {"correct": 0.0}
    clean = make_ep(1, step=4, reward=1.0, stop_reason="answered")
    f = parse_filter("reward<0.5,stop_reason=max_turns,failure=tool")
    assert f(ok) and not f(clean)
    assert parse_filter("failure=none")(clean) and not parse_filter("failure=none")(ok)
    assert parse_filter("failure=any")(ok) and not parse_filter("failure=any")(clean)
    assert parse_filter("step>=4")(clean) and not parse_filter("step>=4")(ok)
    assert parse_filter("reward.correct=0")(ok) and not parse_filter("reward.correct=0")(
        clean
    )  # missing != 0
    assert parse_filter("id~ep-")(ok) and parse_filter("stop!=answered")(ok)
    assert parse_filter("tokens=5,turns=1,policy_tokens=2")(ok)  # 3 prompt + 2 policy tokens, one turn
    assert parse_filter(None) is None and parse_filter("  ") is None
    # Values are data, never code: this is just a string that matches nothing.
    assert not parse_filter("env=__import__('os').system('false')")(ok)
    for bad in ("bogus=1", "reward", "reward<abc", "reward==1"):
        with pytest.raises(ValueError):
            parse_filter(bad)(ok)


def test_fixture_run_reads_with_torn_lines():
    with pytest.warns(TranscriptWarning):
        eps = list(iter_episodes(RUN))
    assert len(eps) == 48  # 6 steps x 4 groups x 2, the torn 49th line skipped
    with pytest.warns(TranscriptWarning):
        failed = list(iter_episodes(RUN, filter="failure=tool"))
    assert [e.id for e in failed] == ["t23+20-s4-g1-1"] and failed[0].step == 4
    with pytest.warns(TranscriptWarning, match="torn last line"):
        rows = read_metrics(RUN)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # config.yaml's model.path is relative to the run directory
    assert str(RUN.resolve().parent / "tokenizer") in [
        str(Path(c).resolve()) for c in tokenizer_candidates(RUN)
    ]


def test_streaming_lookup_in_a_large_file_is_lazy_and_small(tmp_path):
    path = tmp_path / "big.jsonl"
    # 20k lines from one serialized template (Episode.to_json costs ~250 us; this test is about reading).
    template = (
        make_ep(0, step=0).to_json().replace('"id":"ep-0"', '"id":"ep-{i}"').replace('"step":0', '"step":{s}')
    )
    assert template.count("{i}") == 1 and template.count("{s}") == 1
    template = template.replace("{", "{{").replace("}", "}}").replace("{{i}}", "{i}").replace("{{s}}", "{s}")
    with open(path, "w") as f:
        for s in range(20):
            f.write("".join(template.format(i=s * 1000 + i, s=s) + "\n" for i in range(1000)))
    size = path.stat().st_size
    assert size > 5_000_000
    it = iter_episodes(path, episode="ep-12345")
    assert isinstance(it, types.GeneratorType)
    tracemalloc.start()
    t0 = time.perf_counter()
    found = list(it)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [e.id for e in found] == ["ep-12345"] and found[0].step == 12
    # Only lines containing the id are parsed: a full read would hold ~size bytes.
    assert peak < size / 20, (peak, size)
    assert elapsed < 5.0, elapsed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn lines here
        first = next(iter_episodes(path, step=7))
    assert first.id == "ep-7000"
