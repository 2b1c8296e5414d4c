"""Judge rewards (agentrl/env/judge.py) against a scripted OpenAI-compatible judge server that
answers, answers without a verdict, times out, fails once or for good, and returns malformed JSON:
a verdict or a ``JudgeError``, never a zero; retries, the content cache, the concurrency bound; and
in a runner, a judge that gives no verdict fails its episode at the ``judge`` boundary, counted."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import (
    Environment,
    Judge,
    JudgeError,
    JudgeSettings,
    StepResult,
    Task,
    judge_reward,
    score_in,
    yes_no,
)
from agentrl.env.judge import chat_post
from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.rollout.turns import Budgets
from agentrl.training.metrics import episode_metrics
from agentrl.training.progress import step_line


class JudgeServer:
    """A judge on 127.0.0.1 whose answer depends on the words in the last message."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.flaky_seen: set[str] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["messages"][-1]["content"]
                with server.lock:
                    server.requests.append(text)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    server.answer(self, text)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, handler: BaseHTTPRequestHandler, text: str) -> None:
        if "slow" in text:
            time.sleep(float(text.split("slow")[1].split()[0]))
        if "fail" in text or ("flaky" in text and text not in self.flaky_seen):
            self.flaky_seen.add(text)
            handler.send_response(500)
            handler.end_headers()
            return
        reply = (
            b"not json"
            if "badjson" in text
            else json.dumps(
                {
                    "choices": [
                        {
                            "message": {
                                "content": "I like turtles"
                                if "garbage" in text
                                else "Yes."
                                if "right" in text
                                else "no, 3"
                            }
                        }
                    ]
                }
            ).encode()
        )
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(reply)))
        handler.end_headers()
        handler.wfile.write(reply)

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.close()


def ask(judge: Judge, text: str, parse=yes_no) -> float:
    return judge.verdict([{"role": "user", "content": text}], parse)


def test_a_verdict_is_cached_by_content_and_a_failed_call_is_retried(server):
    judge = Judge(JudgeSettings(server.url, retries=2, backoff_s=0.01))
    assert ask(judge, "right answer") == 1.0 and ask(judge, "wrong answer") == 0.0
    assert ask(judge, "right answer") == 1.0  # from the cache: no third request
    assert server.requests == ["right answer", "wrong answer"] and judge.cache_hits == 1
    assert ask(judge, "flaky right") == 1.0  # a 500, then the answer
    assert server.requests[2:] == ["flaky right", "flaky right"] and judge.calls == 4
    assert ask(judge, "wrong", score_in(0, 10)) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("text", "message", "requests"),
    [
        ("fail always", r"gave no answer in 3 attempts: HTTPError", 3),
        ("badjson", r"gave no answer in 3 attempts: JSONDecodeError", 3),
        ("slow 1.0 right", r"gave no answer in 3 attempts: TimeoutError", 3),
        ("garbage", r"holds no verdict: 'I like turtles'", 1),  # not retried: it would come back the same
    ],
)
def test_no_verdict_is_an_error_not_a_zero(server, text, message, requests):
    judge = Judge(JudgeSettings(server.url, timeout_s=0.3, retries=2, backoff_s=0.01))
    with pytest.raises(JudgeError, match=message):
        ask(judge, text)
    assert len(server.requests) == requests
    with pytest.raises(JudgeError):  # an error is not cached
        ask(judge, text)


def test_calls_in_flight_are_bounded(server):
    lock, flight = threading.Lock(), {"now": 0, "max": 0}

    def counted(*args):  # the client's calls in flight (the server's count lags its replies)
        with lock:
            flight["now"] += 1
            flight["max"] = max(flight["max"], flight["now"])
        try:
            return chat_post(*args)
        finally:
            with lock:
                flight["now"] -= 1

    judge = Judge(JudgeSettings(server.url, max_concurrency=3), post=counted)
    with ThreadPoolExecutor(12) as pool:
        verdicts = list(pool.map(lambda i: ask(judge, f"slow 0.2 right {i}"), range(12)))
    assert verdicts == [1.0] * 12
    assert flight["max"] == 3 and server.max_in_flight >= 2


JUDGES: dict[str, Judge] = {}


class Judged(Environment):
    """One turn; the reward is a judge's verdict on the answer."""

    name = "test_judged"
    max_turns = 1

    def __init__(self, url: str = "", **kw) -> None:
        super().__init__(**kw)
        self.judge = JUDGES.setdefault(
            url, Judge(JudgeSettings(url, timeout_s=0.5, retries=1, backoff_s=0.01))
        )

    def step(self, action):
        return StepResult([], 0.0, True, False, {})

    def rewards(self):
        return [judge_reward("judged", self.judge, lambda task, s: f"{s.final_text} ({task.id})", yes_no)]


def test_in_a_runner_no_verdict_fails_the_episode_at_the_judge_boundary_and_is_counted(
    server, tiny_tokenizer
):
    replies = ["right", "wrong", "fail", "garbage"]
    engine = ScriptedEngine(lambda prompt, i: f"{replies[i % 4]}<|im_end|>", tokenizer=tiny_tokenizer)
    settings = RunnerSettings(budgets=Budgets(1, 16, 512, 64), max_concurrent_episodes=8)
    runner = EpisodeRunner(engine, tiny_tokenizer, lambda: Judged(url=server.url), settings)
    tasks = [Task(id=f"t{i}", prompt="Say it.") for i in range(2)]
    try:
        eps = runner.run([EpisodeRequest(tasks[i // 4], seed=i, group=tasks[i // 4].id) for i in range(8)])
    finally:
        runner.close()
    by_reply = {}
    for i, ep in enumerate(eps):
        by_reply.setdefault(replies[i % 4], []).append(ep)
    assert [e.reward for e in by_reply["right"]] == [1.0, 1.0] and [e.reward for e in by_reply["wrong"]] == [
        0.0,
        0.0,
    ]
    assert all(e.failure is None and e.metrics["judged"] for e in by_reply["right"] + by_reply["wrong"])
    for e in by_reply["fail"] + by_reply["garbage"]:
        assert e.failure is not None and e.failure.boundary == "judge", e.failure
        assert e.failure.message.startswith("reward 'judged' raised JudgeError: ")
    metrics = episode_metrics(eps)
    assert metrics["failures/judge"] == 4 and metrics["rewards/judge_failed_frac"] == 0.5
    assert "judge failed 50%, 1 group dropped" in step_line({**metrics, "groups/dropped_count": 1.0})
    assert "rewards/judge_failed_frac" not in episode_metrics([e for e in eps if not e.metrics.get("judged")])
