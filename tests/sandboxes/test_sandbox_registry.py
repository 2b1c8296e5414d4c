"""A sandbox backend registered in this file, outside sandboxes/: one record makes it a
``sandbox.backend`` the config accepts; the run's code-interpreter episodes run their code in it,
with the ``sandbox.*`` keys its record names; an unisolated record is refused unless accepted. A
taken name is refused, a wrong one is told the registered names."""

from __future__ import annotations

import pytest

from agentrl.assembly import components
from agentrl.config import ConfigError, load_config
from agentrl.config.schema_runtime import SandboxConfig
from agentrl.dataclass_tree import fields_by_name
from agentrl.engines.scripted import ScriptedEngine
from agentrl.rollout.runner import EpisodeRequest
from sandboxes import (
    SANDBOXES,
    ExecResult,
    Limits,
    SandboxRecord,
    close_shared_pools,
    make_sandbox,
    register_sandbox,
)
from sandboxes.base import SandboxBase, SessionBase

RAN: list[tuple[str, str]] = []
"""(image option, code) of every cell the recording sandbox ran."""
MADE: list[dict] = []
"""The options each recording sandbox was built with."""


class RecordingSession(SessionBase):
    def __init__(self, limits: Limits, image: str) -> None:
        super().__init__(limits)
        self.image = image

    def _run(self, code: str, limits: Limits) -> ExecResult:
        RAN.append((self.image, code))
        return ExecResult(stdout=f"ran {len(RAN)}\n")

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class RecordingSandbox(SandboxBase):
    """Runs nothing: records each cell and answers ``ran <n>``."""

    name = "recording"

    def __init__(self, limits: Limits | None = None, **options) -> None:
        super().__init__(limits)
        MADE.append(options)
        self.image = options["image"]

    def _new_session(self, limits: Limits) -> SessionBase:
        return RecordingSession(limits, self.image)


RECORD = SandboxRecord("recording", RecordingSandbox, keys={"image": "docker_image"})


@pytest.fixture
def recording():
    RAN.clear()
    MADE.clear()
    register_sandbox(RECORD)
    yield RECORD
    close_shared_pools()
    del SANDBOXES[RECORD.name]


def config(*extra: str):
    return load_config(
        None,
        [
            "env.name=code_interpreter",
            "sandbox.backend=recording",
            "sandbox.docker_image=img:1",
            "run.device=cpu",
            "rollout.max_turns=3",
            "rollout.max_tokens_per_turn=32",
            *extra,
        ],
    )


def test_the_configs_episodes_run_their_code_in_a_registered_sandbox(recording, tiny_tokenizer):
    cfg = config()
    script = ["```python\nprint(6 * 7)\n```<|im_end|>", "\\boxed{1}<|im_end|>"]
    engine = ScriptedEngine(script, tokenizer=tiny_tokenizer)
    runner = components.local_runner(cfg, engine, tiny_tokenizer, seed=0)
    task = components.load_tasks(cfg, "train")[0]
    try:
        (episode,) = runner.run([EpisodeRequest(task, seed=0, group="g")])
    finally:
        runner.close()
    assert episode.failure is None, episode.failure
    assert RAN == [("img:1", "print(6 * 7)\n")]  # sandbox.docker_image reached it as ``image``
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["ran 1"]
    (options,) = MADE
    assert set(options) == {"image"}  # the limits go first, positionally; no other backend's keys
    assert components.sandbox_spec(cfg).options["limits"]["wall_s"] == cfg.sandbox.limits.wall_s


def test_an_unisolated_record_is_refused_unless_accepted(recording):
    register_sandbox(SandboxRecord("recording_open", RecordingSandbox, isolated=False))
    try:
        with pytest.raises(
            ConfigError, match=r"sandbox.backend='recording_open' runs model-written code with no"
        ):
            load_config(None, ["sandbox.backend=recording_open"])
        assert load_config(None, ["sandbox.backend=recording_open", "sandbox.allow_unisolated=true"])
    finally:
        del SANDBOXES["recording_open"]


def test_the_configs_choices_list_the_registered_backends(recording):
    choices = fields_by_name(SandboxConfig)["backend"].metadata["choices"]()
    assert set(choices) == {"bwrap", "docker", "e2b", "unisolated", "recording"}


def test_a_wrong_name_is_told_the_registered_backends(recording):
    with pytest.raises(
        ConfigError, match=r"sandbox\.backend='firecracker'.*Valid: bwrap, docker, e2b, recording"
    ):
        load_config(None, ["sandbox.backend=firecracker"])
    with pytest.raises(ValueError, match="valid: bwrap, docker, e2b, recording, unisolated"):
        make_sandbox("firecracker")


def test_a_taken_name_is_refused(recording):
    register_sandbox(RECORD)  # the same record again (a module imported twice) is no conflict
    with pytest.raises(ValueError, match="a sandbox backend named 'recording' is already registered"):
        register_sandbox(SandboxRecord("recording", RecordingSandbox, isolated=False))
    with pytest.raises(ValueError, match="a sandbox backend named 'bwrap' is already registered"):
        register_sandbox(SandboxRecord("bwrap", RecordingSandbox))
