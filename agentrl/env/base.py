"""The ``Environment`` base class users subclass, its ``@tool`` marker and options, how a tool's result
reaches the model, and the final-answer reading (``extract_boxed``)."""

from __future__ import annotations

import concurrent.futures
import difflib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from agentrl.env.records import Message, Reward, StepResult, Task
from agentrl.errors import ToolError, ToolFeedback, ToolTimeout
from agentrl.models.stopping import StopCondition
from agentrl.timeouts import DaemonThreadPool
from agentrl.tools import ToolCall, check_arguments, parse_tool_calls, tool_schema
from sandboxes.base import SandboxSpec

if TYPE_CHECKING:
    from agentrl.env.mcp_tools import MCPServer


def tool(fn: Callable) -> Callable:
    """Mark a method as a tool the model can call. Its name, type hints and Google-style docstring
    become the JSON schema shown to the model."""
    fn.__agentrl_tool__ = True  # type: ignore[attr-defined]
    return fn


class Environment:
    """Base class for environments. Subclass, set ``name``, override ``reset`` (and optionally
    ``step``, ``rewards``, ``system_prompt``)."""

    name: ClassVar[str] = ""
    system_prompt: ClassVar[str | None] = None
    tool_format: ClassVar[str] = "json"
    """How the model calls tools: ``json`` (``<tool_call>{"name":..., "arguments":...}</tool_call>``)
    or ``python`` (a fenced ```python block, for code-interpreter environments)."""
    tool_timeout_s: ClassVar[float] = 10.0
    tools_on_episode_thread: ClassVar[bool] = False
    """Run the tools on the episode's own thread, the one that runs its ``reset``, ``step`` and
    ``close``, so an object bound to the thread that made it (a ``sqlite3`` connection opened in
    ``reset``) works in them. A tool can then not be abandoned: ``tool_timeout_s`` no longer
    applies, and a tool that never returns fails its episode at ``timeouts.env_step_s``. Default:
    tools run on threads of their own, and a tool past ``tool_timeout_s`` is feedback."""
    max_turns: ClassVar[int] = 8
    """Default turn limit; the runner's own limit wins if it is lower."""
    stop_strings: ClassVar[tuple[str, ...]] = ()
    """Strings that end the model's turn besides its end-of-turn token (kept in the turn, as are the
    config's ``rollout.stop``)."""
    stop_conditions: ClassVar[tuple[StopCondition, ...]] = ()
    """Predicates on the turn's text that end it where they start to hold: ``(BOXED_ANSWER,)`` ends a
    turn with the token that closes its ``\\boxed{}`` answer, so no text is written after the
    answer (``agentrl.models.stopping``). ``rollout.env_stop: false`` ignores both declarations."""
    summary_prompt: ClassVar[str | None] = None
    """With ``rollout.context.policy: compact``: the user message that asks the model to summarise
    its work when the context is full (what the summary must keep). None = agentrl's default."""
    extra_tools: ClassVar[Sequence[Callable]] = ()
    """Plain functions exposed as tools in addition to ``@tool`` methods."""
    mcp_servers: ClassVar[Sequence[MCPServer]] = ()
    """MCP tool servers (``agentrl.env.mcp_tools.MCPServer``) whose tools join the ``@tool`` methods:
    started once per process and environment class, shared by its episodes (docs/environments.md)."""
    task_options: ClassVar[tuple[str, ...]] = ()
    """Options that also choose the tasks: those of ``env.options`` named here are passed to
    ``load_tasks`` as well (beside ``data.options``), so one setting names both the tasks and how
    they are scored (a reasoning-gym dataset, say). Not an option itself."""

    def __init__(self, *, sandbox: SandboxSpec | None = None, **options: Any) -> None:
        """``options`` (the config's ``env.options``) set class attributes of the same name; an
        unknown one is an error. ``sandbox`` is where code runs (the run's ``sandbox`` section); the
        environments that run code use it, the others ignore it."""
        problem = option_problem(type(self), options)
        if problem:
            raise TypeError(problem)
        for k, v in options.items():
            setattr(self, k, v)
        self.sandbox = sandbox or SandboxSpec()
        self.task: Task | None = None
        self.seed = 0

    # -- the contract ------------------------------------------------------------------------
    def reset(self, task: Task, seed: int) -> list[Message]:
        """Start an episode; return the first messages (system prompt if any, then the task)."""
        self.task, self.seed = task, seed
        msgs: list[Message] = []
        if self.system_prompt:
            msgs.append({"role": "system", "content": self.system_prompt})
        msgs.append({"role": "user", "content": task.prompt})
        return msgs

    def step(self, action: str) -> StepResult:
        """Default: run the tool calls in ``action``. A turn without a call ends the episode: with
        ``info["answer"]`` when ``final_answer`` finds one, else as a void turn (SimpleTIR)."""
        calls = parse_tool_calls(action, self.tool_format, self.tool_names())
        if calls:
            return StepResult(
                [self.call_tool(c) for c in calls], 0.0, False, False, {"tool_calls": len(calls)}
            )
        answer = self.final_answer(action)
        if answer is None:
            return StepResult([], 0.0, True, False, {"void_turn": True})
        return StepResult([], 0.0, True, False, {"answer": answer})

    def final_answer(self, text: str) -> str | None:
        """The final answer in a policy turn, or None. Default: the last ``\\boxed{...}``."""
        return extract_boxed(text)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options: Any) -> list[Task]:
        """Built-in tasks for this environment (synthetic generators). ``split`` is ``train`` or
        ``test``; splits never overlap. Environments without built-in tasks take data from a dataset
        adapter (``data.path`` in the config) instead."""
        raise NotImplementedError(
            f"environment {cls.name!r} has no built-in tasks; point data.path at a dataset instead"
        )

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """Full solved conversations (system/user/assistant/tool messages) from an exact solver, for
        the SFT warm start. Diverse where several solutions exist."""
        raise NotImplementedError(f"environment {cls.name!r} has no solver demonstrations")

    def rewards(self) -> Sequence[Reward]:
        """Named reward functions composed with weights; the runner scores finished episodes."""
        return ()

    def close(self) -> None:
        """Release per-episode resources (sandbox sessions, files). Always called by the runner."""

    # -- tools -------------------------------------------------------------------------------
    def tool_functions(self) -> dict[str, Callable]:
        fns: dict[str, Callable] = {}
        for name, member in inspect.getmembers(type(self)):
            if getattr(member, "__agentrl_tool__", False):
                fns[name] = getattr(self, name)
        for f in self.extra_tools:
            fns[f.__name__] = f
        return fns

    def tool_names(self) -> list[str]:
        return sorted([*self.tool_functions(), *(self._mcp_tools() if self.mcp_servers else ())])

    def tool_schemas(self) -> list[dict[str, Any]]:
        """JSON schemas for the chat template's ``tools`` argument: ``@tool`` methods and
        ``extra_tools``, then the tools of ``mcp_servers`` (which starts them on first use)."""
        schemas = [tool_schema(f) for f in self.tool_functions().values()]
        if self.mcp_servers:
            schemas += [schema for _, _, schema in self._mcp_tools().values()]
        return schemas

    def _mcp_tools(self) -> dict[str, Any]:
        from agentrl.env.mcp_tools import mcp_tools

        return mcp_tools(self._owner(), self.mcp_servers, set(self.tool_functions()))

    @classmethod
    def _owner(cls) -> str:
        """This class's qualified name: the key of its MCP servers (each class has its own)."""
        return f"{cls.__module__}.{cls.__qualname__}"

    def call_tool(self, call: ToolCall) -> Message:
        """Run one parsed call. Malformed calls, unknown tools, bad arguments and timeouts become an
        error message for the model; exceptions raised *inside* the tool propagate as ``ToolError``
        so the runner can record a failure at the ``tool`` boundary when the environment wants
        that (override to turn them into feedback instead). A tool of an MCP server goes to that
        server (``agentrl.env.mcp_tools``: its errors are feedback, a lost server a ``ToolError``)."""
        if call.error is not None:
            return {"role": "tool", "name": call.name or "", "content": f"Error: {call.error}"}
        fns = self.tool_functions()
        if call.name not in fns and self.mcp_servers:
            from agentrl.env.mcp_tools import call_mcp_tool

            name = call.name or ""
            local = set(fns)
            reply = call_mcp_tool(self._owner(), self.mcp_servers, local, name, call.arguments)
            if reply is not None:  # None when no MCP server serves this name
                return {"role": "tool", "name": name, "content": reply}
        if call.name not in fns:
            names = self.tool_names()
            hint = difflib.get_close_matches(call.name or "", names, n=1)
            did = f" Did you mean {hint[0]!r}?" if hint else ""
            return {
                "role": "tool",
                "name": call.name or "",
                "content": f"Error: unknown tool {call.name!r}.{did} Available: {', '.join(names)}",
            }
        fn = fns[call.name]
        problem = check_arguments(fn, call.arguments)
        if problem:
            return {"role": "tool", "name": call.name, "content": f"Error: {problem}"}
        try:
            if self.tools_on_episode_thread:  # bounded by the step's own limit (timeouts.env_step_s)
                out = fn(**call.arguments)
            else:
                out = run_with_timeout(fn, call.arguments, self.tool_timeout_s)
        except ToolTimeout:
            return {
                "role": "tool",
                "name": call.name,
                "content": f"Error: tool {call.name!r} timed out after {self.tool_timeout_s:g}s",
            }
        except ToolFeedback as e:
            return {"role": "tool", "name": call.name, "content": f"Error: {e}"}
        except Exception as e:
            raise ToolError(f"tool {call.name!r} raised {type(e).__name__}: {e}") from e
        return {"role": "tool", "name": call.name, "content": tool_result_text(out, call.name)}


def declared_options(cls: type[Environment]) -> list[str]:
    """What ``env.options`` may set on ``cls``: its public class attributes with a plain value (not
    methods, properties, ``name`` or the stop declarations: ``rollout.stop`` and ``rollout.env_stop``
    set those), its own and inherited ones."""
    found = set()
    for klass in cls.__mro__[:-1]:  # not object
        for key, value in vars(klass).items():
            if key.startswith("_") or key in ("name", "task_options", "stop_strings", "stop_conditions"):
                continue
            if callable(value) or isinstance(value, (property, classmethod, staticmethod)):
                continue
            found.add(key)
    return sorted(found)


def option_problem(cls: type[Environment], options: Mapping[str, Any]) -> str | None:
    """Why ``options`` cannot be set on ``cls`` (None when they can), naming the options it has."""
    allowed = declared_options(cls)
    unknown = [k for k in options if k not in allowed]
    if not unknown:
        return _option_type_problem(cls, options)
    guess = difflib.get_close_matches(unknown[0], allowed, n=1)
    did = f" (did you mean {guess[0]!r}?)" if guess else ""
    return (
        f"environment {cls.name!r} ({cls.__name__}) has no option {', '.join(map(repr, unknown))}{did}. "
        f"Its options: {', '.join(allowed)}. An option is a class attribute with a default: declare "
        f"`{unknown[0]} = ...` in the class body to make it one"
    )


def _option_type_problem(cls: type[Environment], options: Mapping[str, Any]) -> str | None:
    """An option whose default is a number, a string or a bool takes a value of that kind (an int
    where the default is a float); the first that does not is named."""
    for key, value in options.items():
        default = getattr(cls, key)
        kinds: tuple[type, ...] = (int, float) if type(default) is float else (type(default),)
        if default is None or type(default) not in (int, float, str, bool):
            continue
        if type(value) not in kinds or (type(default) is not bool and isinstance(value, bool)):
            return (
                f"environment {cls.name!r} option {key!r} takes a value of type {type(default).__name__}, "
                f"like its default {default!r}; got {value!r} ({type(value).__name__})"
            )
    return None


def task_loading_options(
    cls: type[Environment], env_options: Mapping[str, Any], data_options: Mapping[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of ``cls.load_tasks``: ``data_options`` plus the ``env_options`` that
    ``cls.task_options`` names. The same key set differently in both is an error naming both."""
    out = dict(data_options)
    for key in cls.task_options:
        if key not in env_options:
            continue
        if key in out and out[key] != env_options[key]:
            raise ValueError(
                f"env.options.{key}={env_options[key]!r} and data.options.{key}={out[key]!r} disagree: "
                f"environment {cls.name!r} reads {key!r} from env.options; drop it from data.options"
            )
        out[key] = env_options[key]
    return out


def tool_result_text(out: Any, tool: str = "") -> str:
    """What the model reads for a tool's return value: a string as it is, ``bytes`` decoded as UTF-8
    (not ``b'525'``), a number as ``str``, and structured values (dicts, lists, tuples, booleans,
    None) as JSON, so a dict reads ``{"city": "City7", "population": 1259}`` and not Python's repr. A
    value JSON cannot encode falls back to ``str``. ``tool``: the tool's name, for the ``ToolError``
    raised when its bytes are not UTF-8."""
    if isinstance(out, str):
        return out
    if isinstance(out, (bytes, bytearray)):
        try:
            return bytes(out).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ToolError(
                f"tool {tool!r} returned {len(out)} bytes that are not UTF-8 ({e.reason} at byte "
                f"{e.start}): return a str, e.g. out.decode('utf-8', errors='replace')"
            ) from e
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return str(out)
    try:
        return json.dumps(out, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(out)


_TOOL_POOL = DaemonThreadPool(64, "agentrl-tool")  # a tool that never returns cannot hold the process at exit


def run_with_timeout(fn: Callable, kwargs: Mapping[str, Any], timeout_s: float) -> Any:
    """Run an in-process tool with a wall-clock limit. A Python thread cannot be killed: a hung tool
    keeps its (daemon) worker thread busy, but the episode moves on and the process still exits. Tools that run untrusted or unbounded
    work must use a sandbox (``sandboxes/``), which kills the whole process tree."""
    fut = _TOOL_POOL.submit(fn, **kwargs)
    try:
        return fut.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError as e:
        fut.cancel()
        raise ToolTimeout() from e


# -- final answers ------------------------------------------------------------------------------
_BOXED = re.compile(r"\\boxed\{")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (balanced braces), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None
