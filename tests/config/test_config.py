"""The config schema and loader: presets load, overrides parse, bad configs fail with useful messages."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from agentrl import dataclass_tree
from agentrl.algorithms import METHODS, WEIGHTINGS
from agentrl.config import (
    CONFIG_FILE,
    DOC_BEGIN,
    DOC_END,
    Config,
    ConfigError,
    config_from_dict,
    config_to_yaml,
    describe_config,
    load_config,
    save_config,
    weighting_name,
)
from tests.helpers import ROOT

STUDY_FILES = sorted((ROOT / "configs").rglob("study*.yaml"))  # `agentrl study` configs
CONFIG_FILES = sorted(set((ROOT / "configs").rglob("*.yaml")) - set(STUDY_FILES))


def _error(path=None, overrides=(), data=None) -> str:
    with pytest.raises(ConfigError) as info:
        if data is not None:
            config_from_dict(data, overrides)
        else:
            load_config(path, overrides)
    return str(info.value)


# ------------------------------------------------------------------------------------- loading
def test_defaults_validate_and_resolve():
    cfg = load_config(None)
    assert isinstance(cfg, Config)
    assert cfg.algorithm.name == "grpo"
    # grpo preset: clip 0.2/0.2, seq-mean-token-mean, grpo advantage, no dynamic sampling
    assert (cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (0.2, 0.2)
    assert cfg.algorithm.loss_agg == "seq-mean-token-mean"
    assert cfg.algorithm.advantage == "grpo"
    assert cfg.algorithm.dynamic_sampling is False
    assert cfg.run.output_dir == "runs/quickstart"
    assert cfg.model.tokenizer is None  # the tokenizer saved with the weights
    # overlong L_max = min(4 turns × 256, 2048) = 1024; L_cache = 1024 // 5 = 204
    assert (cfg.algorithm.overlong.max_length, cfg.algorithm.overlong.cache_length) == (1024, 204)


def test_void_turn_masking_is_for_multi_turn_runs_unless_set():
    assert load_config(ROOT / "configs/short_cot_cpu.yaml").algorithm.void_turn_masking is False
    assert load_config(ROOT / "configs/tool_use_cpu.yaml").algorithm.void_turn_masking is True
    single = load_config(ROOT / "configs/short_cot_cpu.yaml", ["algorithm.void_turn_masking=true"])
    assert single.algorithm.void_turn_masking is True


def test_resolved_config_has_no_none_in_preset_fields():
    for name, method in METHODS.items():
        alg = load_config(None, [f"algorithm.name={name}"]).algorithm
        for key in method.preset:
            section, _, leaf = key.rpartition(".")
            value = getattr(getattr(alg, section) if section else alg, leaf)
            assert value == method.preset[key], (name, key)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_file_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    assert load_config(None, [f"run.name={cfg.run.name}"]) != cfg, f"{path} changes nothing"


@pytest.mark.parametrize("path", STUDY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_study_config_and_each_of_its_runs_loads(path):
    from agentrl.study import load_study, plan

    for reduced in (False, True):
        study = load_study(path, reduced=reduced)
        runs = plan(study, {f: 0.5 for f in study.families})
        methods = len(study.methods) + len(study.extra_methods)
        assert len(runs) == len(study.seeds) * len(study.families) * methods
        for spec in runs:
            cfg = load_config(ROOT / study.families[spec.family], spec.overrides)
            assert cfg.trainer.total_steps == study.steps and cfg.run.seed == spec.seed
            assert cfg.algorithm.stare.target_entropy == 0.5 and cfg.sft.seed == study.sft_seed


def test_config_files_exist():
    assert ROOT / "configs" / "quickstart.yaml" in CONFIG_FILES


def test_quickstart_values():
    cfg = load_config(ROOT / "configs" / "quickstart.yaml")
    assert cfg.model.path == "tiny:h128-L8"
    assert cfg.env.name == "calculator"
    assert weighting_name(cfg) == "stare"
    # stare = GRPO-ds base: clip-higher, token-mean, dynamic sampling
    assert (cfg.algorithm.clip_high, cfg.algorithm.loss_agg, cfg.algorithm.dynamic_sampling) == (
        0.28,
        "token-mean",
        True,
    )


# ------------------------------------------------------------------------------------ overrides
def test_dotted_overrides_parse_types():
    cfg = load_config(
        None,
        [
            "trainer.total_steps=20",
            "trainer.lr=1e-5",  # plain YAML would read 1e-5 as a string
            "logging.wandb=true",
            "trainer.betas=[0.9, 0.95]",
            "env.options.foo=1",
            "env.options.nested={a: 2, b: [1, 2]}",
            "algorithm.stare.W=2.0",
            "trainer.max_wall_minutes=5",  # int accepted for a float field
            "model.attn_implementation=sdpa",
            "run.name=7",  # a number accepted for a str field
            "algorithm.dual_clip=null",
        ],
    )
    assert cfg.trainer.total_steps == 20 and type(cfg.trainer.total_steps) is int
    assert cfg.trainer.lr == 1e-5 and type(cfg.trainer.lr) is float
    assert cfg.logging.wandb is True
    assert cfg.trainer.betas == (0.9, 0.95)
    assert cfg.env.options == {"foo": 1, "nested": {"a": 2, "b": [1, 2]}}
    assert cfg.algorithm.stare.W == 2.0
    assert cfg.trainer.max_wall_minutes == 5.0 and type(cfg.trainer.max_wall_minutes) is float
    assert cfg.model.attn_implementation == "sdpa"
    assert cfg.run.name == "7" and cfg.run.output_dir == "runs/7"
    assert cfg.algorithm.dual_clip is None


def test_overrides_apply_in_order_over_the_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("trainer:\n  total_steps: 5\n  lr: 1e-5\nenv:\n  options: {a: 1}\n")
    cfg = load_config(f, ["trainer.total_steps=6", "trainer.total_steps=7", "env.options.b=2"])
    assert cfg.trainer.total_steps == 7
    assert cfg.trainer.lr == 1e-5  # OmegaConf's YAML reads 1e-5 as a float (plain YAML 1.1 would not)
    assert cfg.env.options == {"a": 1, "b": 2}  # mappings merge deeply


def test_empty_file_is_defaults(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing\n")
    assert load_config(f) == load_config(None)


# -------------------------------------------------------------------------------------- presets
def test_dapo_preset_and_explicit_value_wins():
    cfg = load_config(None, ["algorithm.name=dapo"])
    assert cfg.algorithm.dynamic_sampling is True
    assert cfg.algorithm.clip_high == 0.28
    assert cfg.algorithm.loss_agg == "token-mean"
    assert cfg.algorithm.overlong.enabled is True
    cfg = load_config(
        None, ["algorithm.name=dapo", "algorithm.clip_high=0.3", "algorithm.dynamic_sampling=false"]
    )
    assert cfg.algorithm.clip_high == 0.3
    assert cfg.algorithm.dynamic_sampling is False
    assert cfg.algorithm.clip_low == 0.2  # the untouched preset fields still come from the preset


def test_explicit_value_in_file_wins_over_preset_from_override(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("algorithm:\n  loss_agg: seq-mean-token-sum\n")
    cfg = load_config(f, ["algorithm.name=dr_grpo"])
    assert cfg.algorithm.advantage == "dr_grpo"
    assert cfg.algorithm.loss_agg == "seq-mean-token-sum"


def test_presets_follow_algorithms_md():
    by_name = {n: load_config(None, [f"algorithm.name={n}"]).algorithm for n in METHODS}
    assert by_name["dr_grpo"].advantage == "dr_grpo"
    assert by_name["dr_grpo"].loss_agg == "seq-mean-token-sum-norm"
    assert by_name["kl_cov"].ratio_clip is False  # §5: KL-Cov has no ratio clip
    for name in ("stare", "steer", "stapo", "clip_cov", "kl_cov", "high_entropy"):
        a = by_name[name]  # GRPO-ds base: DAPO's loss + dynamic sampling, no overlong shaping
        assert (a.clip_low, a.clip_high, a.loss_agg, a.dynamic_sampling) == (0.2, 0.28, "token-mean", True), (
            name
        )
        assert a.overlong.enabled is False, name
    assert set(METHODS) == {"grpo", "dr_grpo", "rloo", "dapo", *(set(WEIGHTINGS) - {"none"})}


def test_weighting_name():
    got = {n: weighting_name(load_config(None, [f"algorithm.name={n}"])) for n in METHODS}
    assert got == {n: (n if n in WEIGHTINGS else "none") for n in METHODS}
    assert got["grpo"] == got["dapo"] == got["dr_grpo"] == got["rloo"] == "none"


# ---------------------------------------------------------------------------------------- errors
def test_unknown_key_did_you_mean_and_valid_keys():
    msg = _error(overrides=["trainer.totl_steps=20"])
    assert msg.startswith("unknown key 'trainer.totl_steps' — did you mean 'trainer.total_steps'?")
    assert "Valid keys in 'trainer': betas, bf16," in msg
    assert "[from override 'trainer.totl_steps=20']" in msg


def test_unknown_key_suggests_other_section():
    msg = _error(overrides=["trainer.group_size=4"])
    assert "did you mean 'rollout.group_size'?" in msg


def test_unknown_section():
    msg = _error(overrides=["trainr.total_steps=3"])
    assert msg.startswith(
        "unknown section 'trainr' — did you mean 'trainer'? Valid sections: algorithm, data,"
    )


def test_unknown_key_in_file_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("rollout:\n  grup_size: 4\n")
    msg = _error(f)
    assert "unknown key 'rollout.grup_size' — did you mean 'rollout.group_size'?" in msg
    assert f"[in {f}]" in msg


def test_wrong_type():
    assert _error(overrides=["trainer.total_steps=abc"]).startswith(
        "trainer.total_steps must be int, got 'abc' (str)"
    )
    assert "trainer.total_steps must be int, got 1.5 (float)" in _error(overrides=["trainer.total_steps=1.5"])
    assert "rollout.group_size must be int, got True (bool)" in _error(overrides=["rollout.group_size=true"])
    assert "algorithm.clip_high must be float or null, got 'x' (str)" in _error(
        overrides=["algorithm.clip_high=x"]
    )
    assert "trainer.betas must be [float, float], got [0.9] (list)" in _error(
        overrides=["trainer.betas=[0.9]"]
    )
    assert "env.options must be mapping, got 3 (int)" in _error(overrides=["env.options=3"])
    assert "section 'trainer' must be a mapping of keys, got 3 (int)" in _error(overrides=["trainer=3"])


def test_invalid_choice_did_you_mean_and_valid_list():
    msg = _error(overrides=["algorithm.name=grp"])
    assert msg.startswith(
        "algorithm.name='grp' is not a valid choice; did you mean 'grpo'? Valid: clip_cov, dapo,"
    )
    builtin = "clip_cov, dapo, dr_grpo, grpo, high_entropy, kl_cov, rloo, stapo, stare, steer"
    assert all(name in msg for name in builtin.split(", "))  # (and any method a test registered)
    assert "did you mean 'C2'?" in _error(overrides=["algorithm.stare.variant=c2"])
    assert "Valid: batch, micro" in _error(overrides=["algorithm.stare.scope=global"])


def test_out_of_range():
    assert _error(overrides=["rollout.group_size=0"]).startswith("rollout.group_size must be >= 1, got 0")
    assert "rollout.top_p must be in (0, 1], got 1.5" in _error(overrides=["rollout.top_p=1.5"])
    assert "algorithm.stare.M must be in [0, 1], got 1.2" in _error(overrides=["algorithm.stare.M=1.2"])
    assert "trainer.betas must be in [0, 1), got (0.9, 1.0)" in _error(overrides=["trainer.betas=[0.9, 1.0]"])
    assert "algorithm.clip_low must be in [0, 1), got 1.0" in _error(overrides=["algorithm.clip_low=1.0"])


def test_all_problems_reported_at_once():
    msg = _error(overrides=["trainer.total_steps=x", "rollout.grup_size=2", "algorithm.name=nope"])
    assert msg.startswith("3 problems in the config:")
    assert "trainer.total_steps" in msg and "rollout.grup_size" in msg and "algorithm.name='nope'" in msg


def test_cross_field_rules():
    assert "sandbox.allow_unisolated=true" in _error(overrides=["sandbox.backend=unisolated"])
    load_config(None, ["sandbox.backend=unisolated", "sandbox.allow_unisolated=true"])
    assert "data.path is required when data.source='file'" in _error(overrides=["data.source=file"])
    assert "must be divisible by trainer.mini_batches_per_step=3" in _error(
        overrides=["rollout.prompts_per_step=8", "trainer.mini_batches_per_step=3"]
    )
    assert "rollout.group_size >= 2" in _error(overrides=["algorithm.name=dapo", "rollout.group_size=1"])
    # a method's own rules (its record's ``check``) apply when it is the selected method
    assert "algorithm.clip_cov.lb=6.0 must not exceed algorithm.clip_cov.ub=5.0" in _error(
        overrides=["algorithm.name=clip_cov", "algorithm.clip_cov.lb=6"]
    )
    load_config(None, ["algorithm.name=grpo", "algorithm.clip_cov.lb=6"])  # an unused section is inert
    assert "algorithm.stare.W=2.0 must not exceed algorithm.stare.adaptive.W_max=1.5" in _error(
        overrides=["algorithm.name=stare", "algorithm.stare.controller=adaptive", "algorithm.stare.W=2"]
    )
    load_config(None, ["algorithm.name=stare", "algorithm.stare.W=2"])  # the gate has no upper limit on W


def test_bad_override_syntax_and_interpolation():
    assert "must look like key=value" in _error(overrides=["trainer.total_steps"])
    assert "must look like key=value" in _error(overrides=["trainer..total_steps=3"])
    assert "interpolation" in _error(overrides=["run.output_dir=${run.name}/x"])


def test_missing_file_suggests_neighbour(tmp_path):
    (tmp_path / "quickstart.yaml").write_text("")
    msg = _error(tmp_path / "quickstrt.yaml")
    assert msg.startswith(f"config file not found: '{tmp_path / 'quickstrt.yaml'}' — did you mean")
    assert "quickstart.yaml" in msg


def test_yaml_syntax_error_and_non_mapping(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("trainer: [unclosed\n")
    assert _error(f).startswith(f"cannot parse {f}")
    f.write_text("- a\n- b\n")
    assert "must hold a mapping" in _error(f)


# ----------------------------------------------------------------------------------- round trip
def test_save_load_round_trip(tmp_path):
    cfg = load_config(
        ROOT / "configs" / "quickstart.yaml", ["env.options.x=[1, 2]", "trainer.betas=[0.8, 0.9]"]
    )
    path = save_config(cfg, tmp_path / "run")
    assert path == tmp_path / "run" / CONFIG_FILE
    assert load_config(path) == cfg
    assert load_config(tmp_path / "run") == cfg  # a run directory means its config.yaml
    assert config_to_yaml(load_config(path)) == config_to_yaml(cfg)


def test_config_to_yaml_is_plain_yaml():
    import yaml

    data = yaml.safe_load(config_to_yaml(load_config(None)))
    assert data["trainer"]["betas"] == [0.9, 0.999]
    assert data["trainer"]["lr"] == 1e-6
    assert config_from_dict(data) == load_config(None)


# ---------------------------------------------------------------------------------------- docs
def _all_classes(cls):
    yield cls
    for f in dataclasses.fields(cls):
        tp = dataclass_tree.hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _all_classes(tp)


def test_every_field_has_a_docstring():
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in _all_classes(Config)
        for f in dataclasses.fields(cls)
        if not dataclass_tree.field_docs(cls).get(f.name)
    ]
    assert not missing, missing


@pytest.mark.slow
def test_docs_are_up_to_date():
    # in a fresh interpreter: the built-in methods only (tests register methods of their own)
    fresh = subprocess.run(
        [sys.executable, "-m", "agentrl.config"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    text = (ROOT / "docs" / "configuration.md").read_text()
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    assert text[start:end].strip() == fresh.strip(), (
        "docs/configuration.md is stale: run `python -m agentrl.config --write-doc docs/configuration.md`"
    )


def test_describe_config_lists_every_key():
    table = describe_config()
    for path in dataclass_tree.leaf_paths(Config):
        assert f"| `{path}` |" in table, path
    assert "| `algorithm.clip_high` | float or null, >= 0 | *from the preset* |" in table


def test_an_empty_mapping_override_clears_a_presets_mapping():
    """Switching the quickstart to a data file: its calculator knobs must go, and {} says so (it
    merged into nothing before, and null is not a mapping)."""
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", ["data.options={}"])
    assert cfg.data.options == {}
    kept = load_config(ROOT / "configs" / "quickstart.yaml", ["data.options.x=1"])
    assert kept.data.options == {"n_operands": 2, "max_value": 20, "x": 1}  # a key still merges


def test_cpu_gemm_onednn_outside_a_float32_hf_engine_is_refused_before_work():
    """oneDNN's products are the float32 HF engine's on the CPU; asked for elsewhere, the config says
    so instead of running without them."""
    assert load_config(None, ["rollout.cpu_gemm=onednn"]).rollout.cpu_gemm == "onednn"
    bf16 = _error(overrides=["rollout.cpu_gemm=onednn", "rollout.dtype=bfloat16"])
    assert "rollout.cpu_gemm=onednn applies to the HF engine in float32 on the CPU" in bf16
    assert "rollout.engine=hf in bfloat16: set rollout.cpu_gemm=mkl (or auto)" in bf16
    assert "rollout.engine=vllm in float32" in _error(
        overrides=["rollout.cpu_gemm=onednn", "rollout.engine=vllm"]
    )
    wrong = _error(overrides=["rollout.cpu_gemm=blas"])
    assert "rollout.cpu_gemm" in wrong and all(c in wrong for c in ("mkl", "onednn", "auto")), wrong


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("trainer.lr=.inf", "trainer.lr=inf is not a finite number"),
        ("trainer.lr=.nan", "trainer.lr=nan is not a finite number"),
        ("algorithm.stare.W=.inf", "algorithm.stare.W=inf is not a finite number"),
        ("rollout.temperature=-.inf", "rollout.temperature=-inf is not a finite number"),
        ("trainer.lr=1e30", "trainer.lr must be in (0, 1], got 1e+30"),
        ("sft.lr=3", "sft.lr must be in (0, 1], got 3.0"),
    ],
)
def test_a_non_finite_or_absurd_number_is_refused_naming_the_key(override, said):
    """Issue 66, item 3: `trainer.lr=.inf` and `1e30` passed the `> 0` check and crashed at step 0
    blaming the weight sync; `algorithm.stare.W=.inf` skipped every update and exited 0."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert said in str(e.value)
