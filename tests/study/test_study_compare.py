"""bench/study_compare.py pairs two studies' runs by method and seed and says which changes the seeds
support."""

import importlib.util
import json

from tests.helpers import ROOT


def load():
    spec = importlib.util.spec_from_file_location("study_compare", ROOT / "bench" / "study_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(path, h0, runs):
    """A study's summary.json as its report writes it: per method, one record per finished seed."""
    methods: dict[str, list[dict]] = {}
    for method, seed, h_ratio, mean_at_k in runs:
        methods.setdefault(method, []).append(
            {"seed": seed, "h_ratio": h_ratio, "in_band": 0.5, "final_entropy_answer": "NaN",
             "mean_at_k": mean_at_k, "pass_at_k": 0.9}
        )  # fmt: skip
    path.write_text(json.dumps({"fam": {"prep": {"h0": h0}, "methods": methods}}))
    return path


def test_runs_are_paired_by_method_and_seed_and_only_where_both_finished(tmp_path):
    sc = load()
    before = summary(
        tmp_path / "a.json", 0.84, [("grpo", 0, 0.1, 0.60), ("grpo", 1, 0.2, 0.70), ("stare", 0, 1.5, 0.6)]
    )
    after = summary(
        tmp_path / "b.json", 0.83, [("grpo", 0, 0.3, 0.65), ("grpo", 1, 0.5, 0.76), ("grpo", 2, 9.0, 0.0)]
    )
    lines = sc.compare(sc.load(before), sc.load(after), ("a", "b"))
    rows = [x for x in lines if x.startswith("| grpo |")]
    assert rows[0].startswith("| grpo | 0 | 0.100 → 0.300 | 50 % → 50 % | – → – | 0.600 → 0.650 |")
    assert len(rows) == 3  # seeds 0 and 1, then the change; seed 2 and stare have no pair
    change = rows[2].split(" | ")
    assert change[1] == "+0.250 ± 0.071 (2/2 seeds > 0)"  # entropy / H0: 0.2 and 0.3, t = 5 < 12.7 (df 1)
    assert change[2] == "+0 pp ± 0 (0/2 seeds > 0)"  # the same in-band fraction: no change, not supported
    assert change[3] == "–"  # entropy to the answer: recorded by neither
    assert change[4] == "+0.055 ± 0.007 (not testable at n = 2)"  # accuracy: ≥ 5 seeds
    assert not any("stare" in x for x in lines)
