"""Docker backend: one long-lived container per session, running ``sandboxes/worker.py`` as PID 1.

Containers have no network (``network_mode=none``), a read-only root, tmpfs ``/tmp`` and ``/scratch``,
memory (no swap), pids and CPU limits, every capability dropped, ``no-new-privileges``, and run as
uid 65534. The host talks to the worker over the container's attached stdin/stdout (Docker's
multiplexed stream), so a cell costs a pipe round trip, not an ``exec_run`` (~55 ms, and without a
timeout). Timeouts are enforced here: past ``wall_s`` the worker gets SIGINT, and past the grace the
container is removed. Every Docker API call has the client's 30 s timeout; the attached socket
(blocking, as Docker hands it over) gets ``start_timeout_s`` too, so sending a cell to a container
that stopped reading (paused, wedged) fails the cell as a crashed worker instead of blocking forever.

Every container carries the labels ``agentrl.sandbox=1`` and ``agentrl.owner=host:pid:start``; it is
removed on close, at interpreter exit, and at start-up when its owner is gone (a crashed run).

No image can be pulled on these machines: ``.ci/docker_setup.sh`` builds ``agentrl-sandbox:local``,
an almost empty root filesystem, and the host's ``/usr`` is bind-mounted read-only (``bind_usr``).
With your own image (any with a ``python3``), set ``image`` and ``bind_usr=False``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import time
from pathlib import Path
from typing import Any

from sandboxes.base import (
    IsolationUnavailable,
    Limits,
    SandboxBase,
    SandboxError,
    SessionBase,
    owner_alive,
    owner_tag,
)
from sandboxes.bwrap import SANDBOX_ENV
from sandboxes.process import OVERHEAD_PIDS, WORKER_SOURCE, ProcessSession, encode_frame, pop_frame

log = logging.getLogger(__name__)
LABEL = "agentrl.sandbox"
OWNER_LABEL = "agentrl.owner"
DEFAULT_IMAGE = "agentrl-sandbox:local"


def connect(base_url: str | None = None, timeout: float = 30.0):
    """A docker client (``base_url`` or ``DOCKER_HOST``), or ``IsolationUnavailable`` with the reason."""
    try:
        import docker

        client = (
            docker.DockerClient(base_url=base_url, timeout=timeout)
            if base_url
            else docker.from_env(timeout=timeout)
        )
        client.ping()
        return client
    except Exception as e:
        raise IsolationUnavailable(f"no Docker engine reachable ({type(e).__name__}: {e})") from e


def reap(client, only_orphans: bool = True) -> int:
    """Remove agentrl sandbox containers whose owner process is gone (all of them if not
    ``only_orphans``); returns how many were removed."""
    n = 0
    for c in client.api.containers(all=True, filters={"label": LABEL}):
        owner = (c.get("Labels") or {}).get(OWNER_LABEL, "")
        if only_orphans and owner_alive(owner):
            continue
        with contextlib.suppress(Exception):
            client.api.remove_container(c["Id"], force=True)
            n += 1
    return n


class ContainerWorker:
    """One container running the worker, and the attached socket carrying the protocol."""

    def __init__(self, sb: DockerSandbox, limits: Limits) -> None:
        self.api = sb.client.api
        self.cid: str | None = None
        self._sock: Any = None
        self._raw = bytearray()  # Docker's multiplexed stream: 8-byte header + payload
        self._buf = bytearray()  # the worker's protocol bytes (stdout payloads)
        self._stderr = bytearray()
        cfg = {"file_bytes": limits.file_bytes, "memory_bytes": limits.memory_bytes, "paths": sb.python_paths}
        tmpfs_size = f"size={limits.memory_bytes}"
        binds = {p: {"bind": p, "mode": "ro"} for p in sb.python_paths}
        if sb.bind_usr:
            binds["/usr"] = {"bind": "/usr", "mode": "ro"}
        import docker

        host_config = self.api.create_host_config(
            network_mode="none",
            read_only=True,
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            pids_limit=limits.processes + OVERHEAD_PIDS,
            nano_cpus=int(sb.cpus * 1e9),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            tmpfs={"/tmp": f"{tmpfs_size},mode=1777", "/scratch": f"{tmpfs_size},mode=1777"},
            binds=binds,
            ulimits=[
                docker.types.Ulimit(name="fsize", soft=limits.file_bytes, hard=limits.file_bytes),
                docker.types.Ulimit(name="core", soft=0, hard=0),
            ],
        )
        try:
            self.cid = self.api.create_container(
                sb.image,
                command=[sb.python, "-I", "-S", "-c", WORKER_SOURCE, "0", "1", json.dumps(cfg)],
                user=sb.user,
                working_dir="/scratch",
                environment=SANDBOX_ENV,
                labels={LABEL: "1", OWNER_LABEL: sb.owner},
                stdin_open=True,
                network_disabled=True,
                host_config=host_config,
            )["Id"]
            # attach before start so the worker's first frame cannot be missed
            sock = self.api.attach_socket(
                self.cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self._sock = getattr(sock, "_sock", sock)
            self._sock.settimeout(sb.start_timeout_s)  # reads wait in select(); this bounds sends
            self.api.start(self.cid)
        except Exception as e:
            self.kill()
            raise SandboxError(f"could not start a container from {sb.image!r}: {e}") from e
        try:
            ready = self.read_frame(time.monotonic() + sb.start_timeout_s)
        except TimeoutError:
            ready = None
        if not ready or ready.get("ev") != "ready":
            err = bytes(self._stderr[-2000:]).decode("utf-8", "replace")
            self.kill()
            raise SandboxError(f"the container's interpreter did not start: {err or 'no ready message'}")

    def send(self, obj: dict[str, Any]) -> None:
        if self._sock is None:
            raise OSError("container gone")
        self._sock.sendall(encode_frame(obj))

    def read_frame(self, deadline: float) -> dict[str, Any] | None:
        while True:
            frame = pop_frame(self._buf)
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if self._sock is None:
                return None
            r, _, _ = select.select([self._sock], [], [], remaining)
            if not r:
                raise TimeoutError
            try:
                chunk = self._sock.recv(1 << 16)
            except (TimeoutError, OSError):
                chunk = b""
            if not chunk:
                return None
            self._raw += chunk
            self._demux()

    def _demux(self) -> None:
        while len(self._raw) >= 8:
            stream, size = self._raw[0], int.from_bytes(self._raw[4:8], "big")
            if len(self._raw) < 8 + size:
                return
            payload = self._raw[8 : 8 + size]
            del self._raw[: 8 + size]
            if stream == 1:
                self._buf += payload
            else:
                self._stderr += payload
                del self._stderr[:-4000]

    def interrupt(self) -> None:
        with contextlib.suppress(Exception):
            self.api.kill(self.cid, signal="SIGINT")

    def alive(self) -> bool:
        try:
            return bool(self.cid) and self.api.inspect_container(self.cid)["State"]["Running"]
        except Exception:
            return False

    def oom_kills(self) -> int:
        try:
            return int(bool(self.api.inspect_container(self.cid)["State"]["OOMKilled"]))
        except Exception:
            return 0

    def exit_status(self) -> int | None:
        try:
            return self.api.wait(self.cid, timeout=2)["StatusCode"]
        except Exception:
            return None

    def kill(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self._sock.close()
            self._sock = None
        if self.cid is not None:
            with contextlib.suppress(Exception):
                self.api.remove_container(self.cid, force=True)
            self.cid = None


class DockerSandbox(SandboxBase):
    """Docker containers as sandboxes. Options: ``image``, ``python`` (inside the image),
    ``bind_usr`` (default: True for the local minimal image), ``python_paths`` (host dirs bound
    read-only and added to ``sys.path``), ``cpus``, ``user``, ``base_url`` (else ``DOCKER_HOST``),
    ``interrupt_grace_s``, ``start_timeout_s`` (also the longest a cell's code may take to reach the
    container)."""

    name = "docker"

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        python: str = "/usr/bin/python3",
        bind_usr: bool | None = None,
        python_paths: tuple[str, ...] | list[str] = (),
        cpus: float = 1.0,
        user: str = "65534:65534",
        base_url: str | None = None,
        interrupt_grace_s: float = 1.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.client = connect(base_url)
        super().__init__(limits)
        self.image, self.python, self.user, self.cpus = image, python, user, cpus
        self.bind_usr = (image == DEFAULT_IMAGE) if bind_usr is None else bind_usr
        self.python_paths = [str(Path(p).resolve()) for p in python_paths]
        self.grace_s = interrupt_grace_s
        self.start_timeout_s = start_timeout_s
        self.owner = owner_tag()
        try:
            self.client.images.get(image)
        except Exception as e:
            self._closed = True
            raise IsolationUnavailable(
                f"docker image {image!r} is not available ({e}); build it with .ci/docker_setup.sh"
            ) from e
        n = reap(self.client)
        if n:
            log.warning("docker sandbox: removed %d container(s) left by a crashed run", n)

    def _new_session(self, limits: Limits) -> SessionBase:
        return ProcessSession(lambda lim: ContainerWorker(self, lim), limits, self.grace_s)

    def containers(self) -> list[str]:
        """Ids of this process's live sandbox containers."""
        found = self.client.api.containers(all=True, filters={"label": f"{OWNER_LABEL}={self.owner}"})
        return [c["Id"] for c in found]

    def close(self) -> None:
        super().close()
        with contextlib.suppress(Exception):
            for cid in self.containers():
                self.client.api.remove_container(cid, force=True)
