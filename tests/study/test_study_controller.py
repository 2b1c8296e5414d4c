"""bench/study_controller.py reads a study's records step by step: entropy windows, the steps the PI
controller sat at its ceiling (from the run's own bounds), and the final reward paired by seed."""

import importlib.util
import json

import yaml

from tests.helpers import ROOT


def load():
    spec = importlib.util.spec_from_file_location("study_controller", ROOT / "bench" / "study_controller.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(root, method, seed, rows, stare):
    run = root / "fam" / method / f"s{seed}"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"stare": stare}}))


def test_full_strength_is_the_runs_own_ceiling_and_rewards_are_paired_by_seed(tmp_path):
    pi = {"controller": "pi", "pi": {"W_max": 2.0, "M_min": 0.5}}
    for seed, reward in ((0, 0.5), (1, 0.7)):
        _record(tmp_path, "base", seed, [{"step": s, "entropy/mean": 0.1 * s, "reward/mean": reward}
                                          for s in range(12)], {"controller": "gate"})  # fmt: skip
        rows = [{"step": s, "entropy/mean": 1.0, "reward/mean": reward - 0.2,
                 # the ceiling at steps 0-5 (two before the warm-up's end), w at it but m not at step 6
                 **({"stare/w": 2.0, "stare/m": 0.5 if s != 6 else 0.6} if s < 7 else {"stare/w": 1.5, "stare/m": 0.7})}
                for s in range(12)]  # fmt: skip
        rows[11].pop("stare/w")  # a step that did not update
        _record(tmp_path, "pi", seed, rows, pi)
    text = "\n".join(load().report(tmp_path, "fam", "base", warmup=2, last=4))
    assert (
        "| base | 0 | 0.45 1.05 | 0.20 0.30 0.40 0.50 0.60 0.70 0.80 0.90 1.00 1.10 | – | – | 0.500 |" in text
    ), text
    assert "| pi | 1 | 1.00 1.00 | " + " ".join(["1.00"] * 10) + " | 4 of 9 | 0 of 3 | 0.500 |" in text, (
        text
    )  # steps 2-5 of the 9 that updated
    assert "- `pi`: -0.200 ± 0.000 (0/2 seeds > 0) **supported**" in text, text
