"""``agentrl serve CONFIG``: the policy of a config behind the OpenAI-compatible endpoint, recording
every episode token by token.

Any new episode key (the API key, or the ``X-Episode-Key`` header) opens an episode, unless its
first request is refused (a 4xx: nothing is recorded under the key). ``POST
/v1/episodes/{key}/finish`` with ``{"reward": x}`` ends it and appends it to the transcript
(``RUN_DIR/serve/transcripts.jsonl``, with the served policy's ``config.yaml`` beside it, so
``agentrl inspect``, ``replay`` and ``doctor`` take ``RUN_DIR/serve``);
``GET /v1/episodes/{key}`` shows it so far. On shutdown (Ctrl-C, SIGTERM) episodes still open are
written too, failed at the ``agent`` boundary, so nothing recorded is lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import zlib
from collections.abc import Callable
from typing import Any

from agentrl.agents import AgentEnvironment
from agentrl.assembly.policy import Policy, policy_engine
from agentrl.config import Config, output_dir
from agentrl.env import Task
from agentrl.episode import Episode
from agentrl.rollout.agent_runner import AgentRunner
from agentrl.rollout.runner import EpisodeRequest, close_quietly
from agentrl.serve.openai_errors import APIError
from agentrl.serve.openai_request import ChatRequest, ChatResult


class ServedEpisode(AgentEnvironment):
    """The environment of ``agentrl serve``'s episodes: the client is the agent, the reward is what
    it posts to ``/finish``."""

    name = "serve"


class ServedRunner(AgentRunner):
    """``agentrl serve``'s backend: any new episode key opens an episode (the client is the agent),
    ``POST /v1/episodes/{key}/finish`` ends it with a reward and hands it to ``on_finish`` (the
    transcript); the batcher waits only for the requests in flight (the clients are not ours to count)."""

    def __init__(self, *args: Any, on_finish: Callable[[Episode], None], **kwargs: Any) -> None:
        self.on_finish = on_finish
        super().__init__(*args, **kwargs)

    def _ready(self) -> int:
        with self._lock:
            return max(1, sum(lv.busy for lv in self._ledgers.values()))

    def chat(self, request: ChatRequest) -> ChatResult:
        """A turn of the episode under the request's key, opened by its first request; a request
        the endpoint refuses (4xx) opens none: the episode it opened is forgotten unless a turn was
        served on it meanwhile (an episode with earlier turns stays as the refusal left it)."""
        key, opened = request.key, None
        with self._lock:
            known = key in self._ledgers
        if not known:
            seed = zlib.crc32(key.encode()) & 0x7FFFFFFF  # distinct keys sample distinct streams
            with contextlib.suppress(ValueError):  # two first requests raced: the other one opened it
                opened = self.open(EpisodeRequest(Task(key, ""), seed=seed, episode_id=key), key=key)
        try:
            return super().chat(request)
        except APIError as e:
            if opened is not None and 400 <= e.status < 500:
                self._forget_unserved(opened)
            raise

    def _forget_unserved(self, lv: Any) -> None:
        """Drop an episode no turn was served on (a later request under its key opens a new one)."""
        key = lv.key
        with self._lock, lv.lock:
            if lv.busy or any(s.role == "policy" for s in lv.episode.segments):
                return  # another request under the key is serving it, or served a turn
            lv.closed = True  # a request that already holds it gets agentrl_episode_ended
            if self._ledgers.get(key) is lv:  # not one a later request opened after /finish took this one
                del self._ledgers[key]
        close_quietly([lv])

    def episode(self, key: str) -> dict[str, Any]:
        """``GET /v1/episodes/{key}``: the episode recorded so far, token by token (``Episode``'s JSON)."""
        with self._lock:
            lv = self._ledgers.get(key)
        if lv is None:
            raise APIError(404, f"no episode is open under the key {key!r}", code="agentrl_unknown_episode")
        return lv.episode.to_dict()

    def finish(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/episodes/{key}/finish`` with ``{"reward": x}`` (``agentrl serve``): end the
        episode, score it (reward component ``agent``; 0 when left out) and hand it to ``on_finish``
        (the transcript). In a training run episodes end when their agent returns."""
        reward = body.get("reward", 0.0)
        if reward is None or isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise APIError(400, f"reward must be a number, got {reward!r}", param="reward")
        if not math.isfinite(reward):  # a bare NaN or Infinity, which Python's JSON reader accepts
            raise APIError(400, f"reward must be a finite number, got {reward!r}", param="reward")
        with self._lock:
            lv = self._ledgers.pop(key, None)
        if lv is None:
            raise APIError(404, f"no episode is open under the key {key!r}", code="agentrl_unknown_episode")
        ep = self.finish_episode(lv, float(reward))
        self.on_finish(ep)
        return {"id": ep.id, "reward": ep.reward, "turns": ep.num_turns, "samples": ep.num_samples}

    def abandon_open(self, reason: str) -> list[Episode]:
        """Every episode still open, ended with a failure at the ``agent`` boundary saying ``reason``."""
        with self._lock:
            lives, self._ledgers = list(self._ledgers.values()), {}
        out = []
        for lv in lives:
            self._fail(lv, "agent", RuntimeError(reason))
            out.append(self.finish_episode(lv, None))
        return out


def serve_command(cfg: Config, policy: Policy, host: str | None = None, port: int | None = None) -> int:
    """Serve ``policy`` (``assembly/policy.py``: a run's newest checkpoint or ``--checkpoint``, or the
    policy a config starts from) until SIGINT or SIGTERM; every episode is written when it ends."""
    from agentrl.assembly import components
    from agentrl.config import config_to_yaml
    from agentrl.transcripts import CONFIG_FILE, TRANSCRIPTS_FILE, TranscriptWriter

    path = policy.path
    engine, tokenizer = policy_engine(cfg, policy)
    out = output_dir(cfg) / "serve" / TRANSCRIPTS_FILE
    writer = TranscriptWriter(out)
    # the served policy's config next to the transcript: inspect, replay and doctor find the tokenizer
    served = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=path))
    (out.parent / CONFIG_FILE).write_text(config_to_yaml(served))
    lock = threading.Lock()

    def write(ep: Any) -> None:
        with lock:
            writer.write([ep])

    runner = ServedRunner(
        engine,
        tokenizer,
        ServedEpisode,
        components.runner_settings(cfg, seed=cfg.run.seed),
        components.endpoint(cfg, host, port),
        on_finish=write,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    what = f"{policy.label} of {policy.run_dir}" if policy.run_dir and policy.label != "start" else path
    print(
        f"agentrl serve: {what} (weights version {engine.version}) at {runner.url} (episodes -> {out}); "
        "Ctrl-C stops",
        flush=True,
    )
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
