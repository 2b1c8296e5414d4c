"""The OpenAI-compatible endpoint under load: many agents at once, each its own client and episode key.

The server runs here with a backend that stands in for the engine (``--gen-ms`` per turn, slept in
the request's own thread, so concurrent turns overlap as they do in an engine batch; a reply of
``--tokens`` tokens with their log-probs). The agents run in a second process (one asyncio loop,
one ``openai.AsyncOpenAI`` client per agent, as ``AgentRunner`` gives each episode its own): all
``--agents`` start at once and each plays ``--turns`` turns, sending its whole history back each
time. Reported per server and round: wall time, turns per second, client-side latency p50/p99, the
server process's CPU seconds per 1,000 turns, errors by type, and the server's own count of turns
that no agent got an answer to, and turns that reached the backend twice. Servers alternate within a round,
their order rotating (this machine's speed drifts).

    .venv/bin/python bench/endpoint_load.py --agents 512 --turns 4 --rounds 3
    .venv/bin/python bench/endpoint_load.py --servers asgi --agents 64   # one server only

``stdlib`` is the package's server (``agentrl.serve.openai_api.OpenAIServer``), ``asgi`` the
starlette/uvicorn candidate in ``bench/asgi_server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import subprocess
import sys
import threading
import time

from agentrl.serve.openai_request import ChatRequest, ChatResult


def servers() -> dict:
    """The two HTTP layers compared in docs/performance.md: the package's and the starlette/uvicorn one."""
    from asgi_server import ASGIServer  # bench/ is on sys.path when a script in it runs

    from agentrl.serve.openai_api import OpenAIServer

    return {"stdlib": OpenAIServer, "asgi": ASGIServer}


class LoadBackend:
    """Sleeps ``gen_s`` per turn and counts every (episode key, turn) it is asked for."""

    model_name = "load"

    def __init__(self, gen_s: float, tokens: int) -> None:
        self.gen_s, self.tokens = gen_s, tokens
        self.lock = threading.Lock()
        self.seen: collections.Counter = collections.Counter()

    def chat(self, request: ChatRequest) -> ChatResult:
        turn = sum(m["role"] == "assistant" for m in request.messages)
        with self.lock:
            self.seen[(request.key, turn)] += 1
        time.sleep(self.gen_s)
        words = [f" w{i}" for i in range(self.tokens)]
        return ChatResult(
            content="".join(words),
            tool_calls=[],
            finish_reason="stop",
            completion_tokens=words,
            logprobs=[-0.5] * self.tokens,
            prompt_tokens=8 * len(request.messages),
        )


async def agents(url: str, count: int, turns: int) -> dict:
    import openai

    latencies: list[float] = []
    errors: collections.Counter = collections.Counter()

    async def agent(i: int) -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key=f"ep-{i}", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": f"Task {i}: look it up."}]
        try:
            for _ in range(turns):
                t0 = time.perf_counter()
                try:
                    reply = await client.chat.completions.create(
                        model="load", messages=messages, logprobs=True
                    )
                except Exception as e:  # counted, and the agent stops: its episode is lost
                    errors[type(e).__name__] += 1
                    return
                latencies.append(time.perf_counter() - t0)
                messages.append(reply.choices[0].message.model_dump(exclude_none=True))
                messages.append({"role": "user", "content": "result: 42. Go on."})
        finally:
            await client.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(count)))
    wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "wall_s": wall,
        "turns": len(latencies),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        "errors": dict(errors),
    }


def one_round(server_cls: type, args: argparse.Namespace) -> dict:
    backend = LoadBackend(args.gen_ms / 1000, args.tokens)
    with server_cls(backend).start() as server:
        cpu0 = time.process_time()
        command = [sys.executable, __file__, "--client", server.url]
        out = subprocess.run(
            [*command, "--agents", str(args.agents), "--turns", str(args.turns)],
            capture_output=True,
            text=True,
            check=True,
        )
        cpu = time.process_time() - cpu0
    result = json.loads(out.stdout)
    result["incomplete"] = args.agents * args.turns - result["turns"]  # turns no agent got an answer to
    result["server_turns"] = sum(backend.seen.values())
    result["duplicated"] = sum(n - 1 for n in backend.seen.values() if n > 1)
    result["server_cpu_s_per_1k_turns"] = 1000 * cpu / max(result["turns"], 1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=512)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--gen-ms", type=float, default=50.0, help="the stand-in engine's time per turn")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per reply (with log-probs)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", nargs="+", default=["stdlib", "asgi"], choices=["stdlib", "asgi"])
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)  # the agents' process
    args = ap.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(agents(args.client, args.agents, args.turns))))
        return
    available, names = servers(), args.servers
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            result = one_round(available[name], args)
            rows[name].append(result)
            print(
                f"round {r + 1} {name}: {json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()})}",
                flush=True,
            )
    summary = {}
    for name, results in rows.items():
        summary[name] = {
            "median_wall_s": round(statistics.median(x["wall_s"] for x in results), 3),
            "turns_per_s": round(statistics.median(x["turns"] / x["wall_s"] for x in results), 1),
            "p50_ms": round(statistics.median(x["p50_ms"] for x in results), 1),
            "p99_ms": round(statistics.median(x["p99_ms"] for x in results), 1),
            "server_cpu_s_per_1k_turns": round(
                statistics.median(x["server_cpu_s_per_1k_turns"] for x in results), 2
            ),
            "errors": sum(sum(x["errors"].values()) for x in results),
            "incomplete": sum(x["incomplete"] for x in results),
            "duplicated": sum(x["duplicated"] for x in results),
        }
    if len(names) == 2:
        a, b = names
        summary[f"{b}/{a} wall per round"] = [
            round(y["wall_s"] / x["wall_s"], 3) for x, y in zip(rows[a], rows[b])
        ]
    print(
        json.dumps({"agents": args.agents, "turns": args.turns, "gen_ms": args.gen_ms, **summary}, indent=1)
    )


if __name__ == "__main__":
    main()
