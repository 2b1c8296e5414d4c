"""The servers behind ``openenv``'s sessions: started (an app, a container) or connected to, pooled."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, timeout_s: float, alive: Any = lambda: None) -> None:
    """Poll ``GET url/health`` until 200; ``alive()`` returns a reason when the server is gone."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        gone = alive()
        if gone:
            raise RuntimeError(f"the OpenEnv server for {url} exited before it was ready: {gone}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
                last = f"HTTP {answer.status}"
        except (urllib.error.URLError, OSError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.1)
    raise RuntimeError(f"the OpenEnv server at {url} was not healthy after {timeout_s:g} s ({last})")


def _die_with_parent() -> None:  # pragma: no cover (runs in the child between fork and exec)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class AppServer:
    """``python -m uvicorn APP`` on a free loopback port, in ``project`` (on PYTHONPATH)."""

    def __init__(self, app: str, project: str | None, timeout_s: float) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        if project:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [project, env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close()); a pipe could fill and block it
        self.process = subprocess.Popen(
            [*command, "--log-level", "warning"],
            cwd=project or None,
            env=env,
            stdout=self.log,
            stderr=self.log,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        try:
            wait_healthy(self.url, timeout_s, self.exited)
        except Exception:
            self.close()
            raise

    def exited(self) -> str | None:
        """None while the server runs, else how it ended."""
        if self.process.poll() is None:
            return None
        self.log.seek(0)
        out = self.log.read().decode(errors="replace").strip()[-2000:]
        return f"exit status {self.process.returncode}: {out or '(no output)'}"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class ContainerServer:
    """A container of ``image`` whose ``port`` is published on 127.0.0.1 (the Docker path)."""

    def __init__(self, image: str, port: int, timeout_s: float, docker_url: str | None = None) -> None:
        from sandboxes.base import owner_tag
        from sandboxes.docker import LABEL, OWNER_LABEL, connect, reap

        client = connect(docker_url)
        reap(client)  # containers a crashed run left behind
        self.api = client.api
        host_config = self.api.create_host_config(port_bindings={port: ("127.0.0.1", None)})
        self.cid = self.api.create_container(
            image, ports=[port], labels={LABEL: "1", OWNER_LABEL: owner_tag()}, host_config=host_config
        )["Id"]
        try:
            self.api.start(self.cid)
            host_port = self.api.port(self.cid, port)[0]["HostPort"]
            self.url = f"http://127.0.0.1:{host_port}"
            wait_healthy(self.url, timeout_s, self.exited)
        except Exception:
            self.close()
            raise

    def exited(self) -> str | None:
        state = self.api.inspect_container(self.cid).get("State", {})
        if state.get("Running", True):
            return None
        logs = self.api.logs(self.cid, tail=20).decode(errors="replace").strip()
        return f"container exited with {state.get('ExitCode')}: {logs or '(no output)'}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.api.remove_container(self.cid, force=True)


class Remote:
    """A server agentrl did not start: only connected to, never stopped."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def exited(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class Pool:
    """The servers of one source, shared by every episode of this process: a session is a slot."""

    def __init__(self, source: dict[str, Any], sessions_per_server: int, max_servers: int) -> None:
        self.source, self.sessions, self.max_servers = source, sessions_per_server, max_servers
        self.lock = threading.Lock()
        self.servers: list[Any] = []
        self.busy: dict[str, int] = {}  # url -> sessions in use
        self.starting = 0  # servers being started
        self.schema: dict[str, Any] | None = None

    def start(self) -> Any:
        s, timeout = self.source, float(self.source["start_timeout_s"])
        server: Remote | ContainerServer | AppServer
        if s.get("url"):
            server = Remote(s["url"])
        elif s.get("image"):
            server = ContainerServer(s["image"], int(s["container_port"]), timeout, s.get("docker_url"))
        else:
            server = AppServer(s["app"], s.get("project"), timeout)
        return server

    def acquire(self) -> str:
        """The URL of a server with a free session (starting one if allowed), marked taken."""
        with self.lock:
            for server in [s for s in self.servers if s.exited()]:  # a dead server is replaced
                self.servers.remove(server)
                self.busy.pop(server.url, None)
                server.close()
            free = [url for url, n in self.busy.items() if n < self.sessions]
            if free:
                self.busy[free[0]] += 1
                return free[0]
            limit = 1 if self.source.get("url") else self.max_servers
            if len(self.servers) + self.starting >= limit:
                raise RuntimeError(
                    f"all {limit * self.sessions} OpenEnv sessions are in use "
                    f"({limit} server(s) x sessions_per_server={self.sessions}); raise "
                    "env.options.max_servers (or sessions_per_server, if the server allows more) or "
                    "lower rollout.max_concurrent_episodes"
                )
            self.starting += 1
        try:  # outside the lock: servers start in parallel, and a free session is not held up
            server = LAUNCHER.submit(self.start).result()
        finally:
            with self.lock:
                self.starting -= 1
        with self.lock:
            self.servers.append(server)
            self.busy[server.url] = 1
            return server.url

    def release(self, url: str) -> None:
        with self.lock:
            if self.busy.get(url):
                self.busy[url] -= 1

    def action_schema(self, url: str) -> dict[str, Any]:
        if self.schema is None:
            with urllib.request.urlopen(f"{url}/schema", timeout=30) as answer:
                self.schema = json.loads(answer.read())
        return dict(self.schema.get("action") or {})

    def close(self) -> None:
        with self.lock:
            for server in self.servers:
                server.close()
            self.servers.clear()
            self.busy.clear()


# Servers are started from these long-lived threads: a server gets SIGTERM when the thread that
# started it ends (PR_SET_PDEATHSIG follows the thread), and an episode's thread ends with the episode.
LAUNCHER = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="openenv-launcher")
POOLS: dict[str, Pool] = {}
POOLS_LOCK = threading.Lock()


def pool_for(source: dict[str, Any], sessions_per_server: int, max_servers: int) -> Pool:
    key = json.dumps([source, sessions_per_server, max_servers], sort_keys=True)
    with POOLS_LOCK:
        if key not in POOLS:
            POOLS[key] = Pool(source, sessions_per_server, max_servers)
        return POOLS[key]


@atexit.register
def close_pools() -> None:
    with POOLS_LOCK:
        for pool in POOLS.values():
            pool.close()
        POOLS.clear()


def app_of(project: str) -> str:
    """The ``app:`` line of a project's openenv.yaml (``server.app:app`` in the template)."""
    manifest = Path(project) / "openenv.yaml"
    if not Path(project).is_dir():
        raise ValueError(
            f"openenv: the project directory {project} does not exist (`openenv init NAME -o DIR` writes "
            "one; an installed environment is env.options.app=MODULE:APP)"
        )
    if not manifest.is_file():
        raise ValueError(f"{project} has no openenv.yaml; set env.options.app to the server's ASGI app")
    match = re.search(r"^app:\s*['\"]?([\w.]+:[\w.]+)", manifest.read_text(), re.MULTILINE)
    if not match:
        raise ValueError(f"{manifest} names no app (a line like 'app: server.app:app')")
    return match[1]
