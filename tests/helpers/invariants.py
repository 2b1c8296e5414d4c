"""Invariants every recorded episode must satisfy."""

from __future__ import annotations

from agentrl.episode import Episode


def check_invariants(ep: Episode, tokenizer) -> None:
    """Every episode: decode(all ids) == concatenated segment texts; mask == role is policy."""
    ids = ep.token_ids()
    assert tokenizer.decode(ids, skip_special_tokens=False) == ep.text()
    for seg in ep.segments:
        assert tokenizer.decode(seg.token_ids, skip_special_tokens=False) == seg.text
    assert ep.loss_mask() == [int(r == "policy") for r in ep.roles()]
    assert Episode.from_json(ep.to_json()) == ep
