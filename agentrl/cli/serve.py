"""``agentrl serve CONFIG``: the policy of a config behind the OpenAI-compatible endpoint, recording
every episode token by token.

Any new episode key (the API key, or the ``X-Episode-Key`` header) opens an episode. ``POST
/v1/episodes/{key}/finish`` with ``{"reward": x}`` ends it and appends it to the transcript
(``RUN_DIR/serve/transcripts.jsonl``, with the served policy's ``config.yaml`` beside it, so
``agentrl inspect``, ``replay`` and ``doctor`` take ``RUN_DIR/serve``);
``GET /v1/episodes/{key}`` shows it so far. On shutdown (Ctrl-C, SIGTERM) episodes still open are
written too, failed at the ``agent`` boundary, so nothing recorded is lost.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from typing import Any

from agentrl.agents import AgentEnvironment
from agentrl.config import Config, output_dir
from agentrl.rollout.runner import Budgets


class ServedEpisode(AgentEnvironment):
    """The environment of ``agentrl serve``'s episodes: the client is the agent, the reward is what
    it posts to ``/finish``."""

    name = "serve"


def serve_command(cfg: Config, host: str | None = None, port: int | None = None) -> int:
    from agentrl.config import config_to_yaml
    from agentrl.rollout import components
    from agentrl.rollout.agent_runner import AgentRunner
    from agentrl.training import build
    from agentrl.transcripts import CONFIG_FILE, TRANSCRIPTS_FILE, TranscriptWriter

    path = build.policy_path(cfg)
    model, tokenizer = components.load_model(cfg, path)
    engine = build.build_engine(cfg, model, tokenizer, path)
    out = output_dir(cfg) / "serve" / TRANSCRIPTS_FILE
    writer = TranscriptWriter(out)
    # the served policy's config next to the transcript: inspect, replay and doctor find the tokenizer
    served = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=path))
    (out.parent / CONFIG_FILE).write_text(config_to_yaml(served))
    lock = threading.Lock()

    def write(ep: Any) -> None:
        with lock:
            writer.write([ep])

    r = cfg.rollout
    runner = AgentRunner(
        engine,
        tokenizer,
        ServedEpisode,
        budgets=Budgets(r.max_turns, r.max_tokens_per_turn, r.max_episode_tokens, r.max_tool_output_tokens),
        sampling=components.sampling_params(cfg, seed=cfg.run.seed),
        max_concurrent_episodes=r.max_concurrent_episodes,
        request_timeout_s=cfg.timeouts.engine_request_s,
        history=r.history,
        on_drift=cfg.proxy.on_drift,
        host=host or cfg.proxy.host,
        port=cfg.proxy.port if port is None else port,
        model_name=cfg.proxy.model_name,
        open_keys=True,
    )
    runner.on_finish = write
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"agentrl serve: {cfg.model.path} at {runner.url} (episodes -> {out}); Ctrl-C stops", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        left = runner.abandon_open("agentrl serve stopped before the episode was finished")
        with lock:
            writer.write(left)
            writer.close()
        runner.close()
        print(f"agentrl serve: stopped; {len(left)} open episode(s) written as failed", flush=True)
    return 0
