"""Task data: rows of a local file or a hub dataset (``rows``) -> ``Task(id, prompt, answer,
metadata)`` through an adapter (``adapters``, or the one ``auto`` picks: ``detect``), optionally one
side of a held-out split (``heldout``): ``tasks.load_tasks_from_source``. ``TaskSampler`` draws the
training tasks in epochs (``sampler``)."""

from agentrl.env.data.adapters import ADAPTERS, Adapter, aime, dapo_math, generic, gsm8k, math500, verl
from agentrl.env.data.detect import AIME_SCHEMAS, detect_adapter
from agentrl.env.data.heldout import HeldOut
from agentrl.env.data.rows import ROW_FORMAT, JsonRows, column_names, load_rows, read_json_rows, read_utf8
from agentrl.env.data.sampler import TaskSampler
from agentrl.env.data.tasks import load_tasks_from_source, row_warnings

__all__ = [
    "ADAPTERS",
    "AIME_SCHEMAS",
    "ROW_FORMAT",
    "Adapter",
    "HeldOut",
    "JsonRows",
    "TaskSampler",
    "aime",
    "column_names",
    "dapo_math",
    "detect_adapter",
    "generic",
    "gsm8k",
    "load_rows",
    "load_tasks_from_source",
    "math500",
    "read_json_rows",
    "read_utf8",
    "row_warnings",
    "verl",
]
