"""The interpreter that runs *inside* a sandbox (bubblewrap, Docker). Standard library only.

It is started as ``python3 -I -S -c <this file's source> IN_FD OUT_FD LIMITS_JSON`` so no file has to
be placed in the sandbox. It speaks a small framed protocol (4-byte big-endian length + JSON) on two
file descriptors and runs each cell in one persistent namespace:

    host -> worker   {"op": "run", "code": str, "cpu_s": float, "output_bytes": int}  |  {"op": "exit"}
    worker -> host   {"ev": "ready", "pid": int}
                     {"ev": "out", "stream": "stdout"|"stderr", "text": str}      (while a cell runs)
                     {"ev": "done", "value": str|None, "error": {...}|None, "truncated": bool}

The code's file descriptors 1 and 2 are pipes drained by two threads here, so output of child
processes is captured too; at the end of a cell a random sentinel written to both pipes tells the
drains that everything before it has been forwarded. The host treats every frame as untrusted: the
code can write to the protocol descriptor too, which only lets it lie about its own output.
"""

import ast
import builtins
import contextlib
import json
import os
import resource
import signal
import sys
import threading

_LOCK = threading.Lock()
_OUT = -1
_MAX_FRAME = 64 << 20


def send(obj):
    data = json.dumps(obj).encode("utf-8", "replace")
    with _LOCK:
        os.write(_OUT, len(data).to_bytes(4, "big"))
        view = memoryview(data)
        while view:
            view = view[os.write(_OUT, view) :]


def recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    n = int.from_bytes(head, "big")
    if n > _MAX_FRAME:
        return None
    body = _read_exact(fd, n)
    return None if body is None else json.loads(body)


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


class Drain(threading.Thread):
    """Forwards one output pipe to the host, keeping at most ``cap`` bytes per cell."""

    def __init__(self, fd, stream, sentinel):
        super().__init__(daemon=True)
        self.fd, self.stream, self.sentinel = fd, stream, sentinel
        self.synced = threading.Event()
        self.pending = b""
        self.cap = 65536
        self.count = 0
        self.truncated = False
        self.decoder = None

    def new_cell(self, cap):
        import codecs

        self.cap, self.count, self.truncated = cap, 0, False
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.synced.clear()

    def run(self):
        sent = self.sentinel
        while True:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except InterruptedError:
                continue
            if not chunk:
                return
            data = self.pending + chunk
            i = data.find(sent)
            while i >= 0:
                self.emit(data[:i], final=True)
                data = data[i + len(sent) :]
                self.synced.set()
                i = data.find(sent)
            keep = 0
            for k in range(min(len(data), len(sent) - 1), 0, -1):
                if data.endswith(sent[:k]):
                    keep = k
                    break
            self.emit(data[: len(data) - keep])
            self.pending = data[len(data) - keep :]

    def emit(self, data, final=False):
        if self.count < self.cap and data:
            part = data[: self.cap - self.count]
            if len(part) < len(data):
                self.truncated = True
            text = self.decoder.decode(part, final=final) if self.decoder else part.decode("utf-8", "replace")
            if text:
                send({"ev": "out", "stream": self.stream, "text": text})
        elif data:
            self.truncated = True
        self.count += len(data)


class CappedText:
    """``sys.stdout``/``sys.stderr`` for the code: forwards at most ``cap`` characters per cell and
    drops the rest here, so ``print`` in a loop does not push a gigabyte through the pipe (output of
    child processes still goes through the pipe and is capped by the drain)."""

    def __init__(self, inner):
        self._inner = inner
        self.cap, self.count = 65536, 0

    def new_cell(self, cap):
        self.cap, self.count = cap, 0

    @property
    def dropped(self):
        return self.count > self.cap

    def write(self, s):
        room = self.cap - self.count
        self.count += len(s)
        if room > 0:
            self._inner.write(s if len(s) <= room else s[:room])
        return len(s)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _on_xcpu(signum, frame):
    raise TimeoutError("CPU time limit exceeded")


def set_session_limits(lim):
    """Per-process limits for the whole session; children inherit them. The host also puts the
    sandbox in memory and pids cgroups when it can, which bound the sum over processes."""
    for res, key in ((resource.RLIMIT_FSIZE, "file_bytes"), (resource.RLIMIT_DATA, "memory_bytes")):
        v = lim.get(key)
        if v:
            resource.setrlimit(res, (v, v))
    if lim.get("nproc"):  # only without a pids cgroup; counts all processes of the host user
        n = lim["nproc"]
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, _on_xcpu)


def set_cell_cpu(cpu_s):
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = int(spent + cpu_s) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def run_cell(code, ns, n):
    """Exec ``code`` in ``ns``; the last expression's value is returned as a repr."""
    import linecache

    name = f"<cell {n}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), ns)
        if last is not None:
            value = eval(compile(last, name, "eval"), ns)
            if value is not None:
                return repr(value), None
        return None, None
    except BaseException as e:  # the code's own errors, SystemExit and KeyboardInterrupt included
        return None, describe(e)


def describe(e):
    import traceback

    tb = e.__traceback__
    # skip this file's own frames (it runs as "<string>"): the model sees only its cell's frames
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    lines = traceback.format_exception(type(e), e, tb)
    return {"name": type(e).__name__, "value": str(e), "traceback": "".join(lines)}


def kill_others():
    """After an interrupted cell, end the processes it left behind (everything in this pid namespace
    but init and us); the host's cgroup and the namespace teardown catch the rest on close."""
    me = os.getpid()
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) not in (1, me):
            with contextlib.suppress(OSError):
                os.kill(int(d), signal.SIGKILL)


def _move(src, dst):
    if src != dst:
        os.dup2(src, dst)
        os.close(src)
    else:
        os.set_inheritable(dst, True)


def _drain(fd, stream, sentinel):
    """Point descriptor ``fd`` at a pipe whose reader forwards the cell's output (``Drain``)."""
    r, w = os.pipe()
    if r in (1, 2):  # descriptors 0/1 were just freed and pipe() may hand them out
        r2 = os.dup(r)
        os.close(r)
        r = r2
    _move(w, fd)
    try:  # a bigger pipe means fewer wake-ups when the code floods its output
        import fcntl

        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, OSError, AttributeError):
        pass
    d = Drain(r, stream, sentinel)
    d.start()
    return d


def _run(msg, ns, n, drains, capped, sentinel):
    """Run one cell under its CPU limit; its output drained up to the sentinel; the "done" frame."""
    cap = int(msg.get("output_bytes", 65536))
    for d in (*drains, *capped):
        d.new_cell(cap)
    set_cell_cpu(float(msg.get("cpu_s", 3600)))
    value, error = run_cell(msg["code"], ns, n)
    resource.setrlimit(
        resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.getrlimit(resource.RLIMIT_CPU)[1])
    )
    if error is not None and error["name"] == "KeyboardInterrupt":
        kill_others()
    for stream in capped:
        with contextlib.suppress(Exception):
            stream.flush()
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.write(fd, sentinel)
    for d in drains:
        d.synced.wait(5.0)
    truncated = any(d.truncated for d in drains) or any(c.dropped for c in capped)
    if value is not None and len(value) > cap:
        value, truncated = value[:cap], True
    return {"ev": "done", "value": value, "error": error, "truncated": truncated}


def main():
    global _OUT
    # Timeouts interrupt a cell with SIGINT. A worker started from a process that ignores or blocks
    # SIGINT (anything launched with `nohup ... &`, some CI runners) inherits that and Python keeps
    # it, so the interrupt would be lost and the cell killed with the session's state: take SIGINT
    # back explicitly.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    in_fd, out_fd, lim = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    pin, _OUT = os.dup(in_fd), os.dup(out_fd)  # dup'ed descriptors are close-on-exec
    os.close(in_fd)
    os.close(out_fd)
    _move(os.open(os.devnull, os.O_RDONLY), 0)
    sentinel = b"\x00agentrl-end-" + os.urandom(8).hex().encode() + b"\x00"
    drains = [_drain(fd, stream, sentinel) for fd, stream in ((1, "stdout"), (2, "stderr"))]
    set_session_limits(lim)
    sys.stdout, sys.stderr = CappedText(sys.stdout), CappedText(sys.stderr)
    capped = (sys.stdout, sys.stderr)
    sys.path.extend(lim.get("paths", []))
    ns = {"__name__": "__main__", "__builtins__": builtins}
    send({"ev": "ready", "pid": os.getpid()})
    n = 0
    while True:
        msg = recv(pin)
        if msg is None or msg.get("op") != "run":
            os._exit(0)
        n += 1
        send(_run(msg, ns, n, drains, capped, sentinel))


if __name__ == "__main__":
    main()
