"""agentrl inspect without a browser: the page's embedded data, self-containment, sampling."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from agentrl.episode import Episode, Segment
from agentrl.transcripts import TranscriptWarning, iter_episodes
from agentrl.views.viewer.page import (
    PieceDecoder,
    build_data,
    episode_payload,
    inspect_command,
    render_html,
    sample_rows,
    selection_cutoffs,
)
from tests.helpers import DATA
from tests.helpers.configs import small_config

RUN = DATA / "transcripts" / "run"


class _Scan(HTMLParser):
    """Collects the embedded JSON and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.json_blobs: list[str] = []
        self.urls: list[str] = []
        self._in_json = False

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        self._in_json = tag == "script" and d.get("type") == "application/json"
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data):
        if self._in_json:
            self.json_blobs.append(data)

    def handle_endtag(self, tag):
        self._in_json = False


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[str, dict]:
    out = tmp_path_factory.mktemp("inspect") / "run.html"
    assert inspect_command(str(RUN), output=str(out)) == 0  # warnings go on the page and the console
    html = out.read_text()
    scan = _Scan()
    scan.feed(html)
    assert len(scan.json_blobs) == 1 and scan.urls == []
    return html, json.loads(scan.json_blobs[0])


def test_page_is_self_contained(page):
    html, _ = page
    assert not re.search(r"https?://", html)  # no CDN, no fonts, no SVG namespace URL
    assert "default-src 'none'" in html  # the CSP forbids any request the page might still try
    assert "/*__CSS__*/" not in html and "/*__JS__*/" not in html and "__DATA__" not in html
    assert "<script src" not in html and "<link" not in html


def test_embedded_data_matches_the_run(page):
    _, data = page
    with pytest.warns(TranscriptWarning):
        eps = {e.id: e for e in iter_episodes(RUN)}
    assert data["sampling"]["total"] == 48 and len(data["episodes"]) == 48 == len(data["tokens"])
    assert data["metrics_source"] == "metrics.jsonl" and [m["step"] for m in data["metrics"]] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert any("torn last line" in w for w in data["warnings"])
    assert data["tokenizer"] is not None
    row = next(r for r in data["episodes"] if r["failure"])
    assert row["id"] == "t23+20-s4-g1-1" and row["failure"] == "tool" and row["stop"] == "error"
    for row, tok in zip(data["episodes"], data["tokens"]):
        ep = eps[row["id"]]
        assert tok["id"] == ep.id
        assert len(tok["pieces"]) == len(ep.token_ids())
        assert "".join(tok["pieces"]) == ep.text()  # the tokenizer pieces rebuild the exact text
        assert [s[0] for s in tok["segments"]] == [s.role for s in ep.segments]
        assert row["policy_tokens"] == ep.num_policy_tokens and row["turns"] == ep.num_turns
        assert tok["overlays"]["weight"] == [
            None if w is None else round(w, 4) for w in ep.overlays["weight"]
        ]
        assert row["selected"] == sum(1 for x in ep.overlays["selected"] if x)


def test_sampling_keeps_failures_and_spreads_over_steps():
    rows = [
        {"step": s, "failure": "tool" if i % 25 == 0 else None, "id": f"{s}-{i}"}
        for s in range(4)
        for i in range(50)
    ]
    kept, note = sample_rows(rows, 20)
    # 8 failed episodes (i = 0 and 25 in each of 4 steps) are all kept; 12 more, 3 per step.
    assert len(kept) == 20 and sum(1 for r in kept if r["failure"]) == 8
    assert [sum(1 for r in kept if r["step"] == s and not r["failure"]) for s in range(4)] == [3, 3, 3, 3]
    assert "20 of 200 episodes" in note and "8 of 8 failed" in note
    assert sample_rows(rows[:5], 20) == (rows[:5], "all 5 episodes")


def test_piece_decoder_without_tokenizer_splits_text_evenly():
    assert PieceDecoder(None).pieces([1, 2, 3], "abcdefg") == ["ab", "cd", "efg"]


def test_selection_cutoffs_are_the_lowest_selected_surprisal():
    payloads = [
        {
            "overlays": {"selected": [0, 1, 1, -1, None], "logp_old": [-5.0, -2.0, -3.0, -4.0, None]},
            "engine_logp": [],
        }
    ]
    # L+ tokens have surprisal 2 and 3 -> cutoff 2; the only L- token has surprisal 4.
    assert selection_cutoffs(payloads, [{"step": 7}]) == {"7": {"plus": 2.0, "minus": 4.0}}


def test_script_closing_text_in_data_cannot_break_the_page(tmp_path):
    ep = Episode(id="x</script><script>alert(1)</script>", env="e", task_id="t", step=1)
    ep.add(Segment("tool", 0, [1, 2], "</script><!--"))
    (tmp_path / "transcripts.jsonl").write_text(ep.to_json() + "\n")
    html = render_html(build_data(str(tmp_path)))
    assert html.count("</script>") == 2  # only the data tag's and the code tag's own
    blob = html.split('id="agentrl-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(blob)["episodes"][0]["id"] == ep.id


def test_unknown_and_malformed_overlay_keys_are_tolerated():
    ep = Episode(id="e", env="x", task_id="t")
    ep.add(Segment("prompt", 0, [1], "a"))
    ep.add(Segment("policy", 0, [2, 3], "bc", logprobs=[-1.0, -2.0]))
    # "trained" is not a v1 key (kept as an extra); "weight" has the wrong length (dropped, not fatal).
    ep.overlays = {"trained": [None, 1.0, 0.0], "weight": [1.0]}
    p = episode_payload(ep, PieceDecoder(None))
    assert p["overlays"] == {"trained": [None, 1.0, 0.0]}
    assert p["engine_logp"] == [None, -1.0, -2.0] and p["pieces"] == ["a", "b", "c"]


def test_every_curve_name_is_a_metric_the_trainer_writes(tmp_path, tiny_model_dir):
    """The viewer's, the plots' and the summary's names (metrics.CURVES) against a real STARE run with
    evaluation: a renamed metric breaks this test instead of silently emptying a curve."""
    import json

    from agentrl.assembly import make_trainer
    from agentrl.training.metrics import CURVES
    from tests.helpers.jsonl import lines

    cfg = small_config(tmp_path, tiny_model_dir, "algorithm.name=stare", "trainer.eval_every=1", "eval.k=1",
                       "eval.num_tasks=2")  # fmt: skip
    make_trainer(cfg, log=lambda *_: None).train()
    written = set().union(*(json.loads(x) for x in lines(tmp_path / "run" / "metrics.jsonl")))
    env_specific = {CURVES["correct"]}  # a reward component named "correct" (test_chatter has none)
    assert set(CURVES.values()) - env_specific - written == set()
