"""The typed config: dataclasses are the schema, YAML files hold presets, the command line overrides.

    cfg = load_config("configs/quickstart.yaml", ["trainer.total_steps=20", "algorithm.name=grpo"])

The schema lives in ``schema.py`` (the run's machinery, ``sandbox`` to ``logging``, in ``schema_runtime.py``),
a docstring under every field; ``describe_config()`` (``describe.py``) turns them into the table in
``docs/configuration.md``. Loading (``loading.py``) is strict and happens before any work: an unknown
key, a wrong type, an invalid choice or an out-of-range value raises ``ConfigError`` naming the key,
what was expected, and (for typos) the closest valid name. All problems are reported at once; the rules
that tie keys together are in ``checks.py``.

``algorithm.name`` is a preset: fields that default to ``None`` with "from the preset" in their
docstring take the preset's value (the method's record in ``agentrl.algorithms.registry.METHODS``, from
docs/algorithms.md, "Advantages", "Policy loss", "Token weightings"), unless the user set them. Each
token weighting's settings are a registered section, ``algorithm.<name>``, checked by the rules in its
record when it is selected. Derived values (``run.output_dir``, ``model.tokenizer``, the overlong
lengths) are filled in too, so the resolved config saved in the run directory holds concrete values
only. Interpolation (``${...}``) is refused: what can be derived is derived in one place, ``loading.py``.

Everything named here is re-exported from this package: import it from ``agentrl.config``.
"""

from agentrl.config.describe import DOC_BEGIN, DOC_END, describe_config, write_doc
from agentrl.config.loading import (
    CONFIG_FILE,
    RENAMED,
    ConfigError,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_config,
    save_config,
)
from agentrl.config.schema import (
    AlgorithmConfig,
    Config,
    DataConfig,
    EnvConfig,
    EvalConfig,
    ModelConfig,
    OverlongConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TrainerConfig,
    VLLMConfig,
    output_dir,
    weighting_name,
    weighting_settings,
)
from agentrl.config.schema_runtime import LimitsConfig, LoggingConfig, SandboxConfig

__all__ = [
    "CONFIG_FILE",
    "DOC_BEGIN",
    "DOC_END",
    "RENAMED",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "LimitsConfig",
    "LoggingConfig",
    "ModelConfig",
    "OverlongConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SandboxConfig",
    "TrainerConfig",
    "VLLMConfig",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "describe_config",
    "load_config",
    "output_dir",
    "save_config",
    "weighting_name",
    "weighting_settings",
    "write_doc",
]
