"""A study's report as a section of another results file.

``docs/results.md`` is the tiny-model study's report; the real-model study (``configs/study_real.yaml``)
writes its own report in ``docs/study_real/`` and, with ``section_in: docs/results.md``, the same
report as a marked section of that file. Each study owns only what lies between its own markers:
writing a section replaces that study's previous one and leaves the rest of the file alone, and a
study rewriting its whole ``results.md`` carries every other study's section over unchanged, so
neither study's report needs the other's run directories.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_BEGIN = "<!-- agentrl study section: {name} -->"
_END = "<!-- end of agentrl study section: {name} -->"
_BLOCK = re.compile(
    r"<!-- agentrl study section: (?P<name>[^>]+?) -->\n.*?<!-- end of agentrl study section: (?P=name) -->\n?",
    re.S,
)
_LINK = re.compile(r"(\]\()([^)#\s][^)\s]*)(\))")


def _relinked(text: str, source_dir: Path, target_dir: Path) -> str:
    """Relative links of a markdown file in ``source_dir``, rewritten to work from ``target_dir``."""

    def fix(m: re.Match[str]) -> str:
        link = m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("/"):
            return m.group(0)  # a URL or an absolute path
        path, _, anchor = link.partition("#")
        moved = os.path.relpath(os.path.normpath(source_dir / path), target_dir)
        return m.group(1) + moved.replace(os.sep, "/") + (f"#{anchor}" if anchor else "") + m.group(3)

    return _LINK.sub(fix, text)


def section(name: str, report: Path, target: Path) -> str:
    """The report ``report`` (a study's ``results.md``) as a section of ``target``: its headings one
    level down, its links relative to ``target``'s folder, between ``name``'s markers."""
    body = _relinked(report.read_text(), report.parent.resolve(), target.parent.resolve())
    body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.M)
    full = os.path.relpath(report.resolve(), target.parent.resolve()).replace(os.sep, "/")
    note = f"This section is the report of the study `{name}`, written here by `agentrl study` with its own copy, [{full}]({full})."
    lines = body.rstrip("\n").split("\n")
    return (
        "\n".join([_BEGIN.format(name=name), lines[0], "", note, *lines[1:], _END.format(name=name)]) + "\n"
    )


def embed(target: Path, name: str, text: str) -> None:
    """Put ``text`` (from :func:`section`) into ``target`` in place of ``name``'s previous section, or
    at its end; a missing ``target`` is created holding the section alone."""
    old = target.read_text() if target.exists() else ""
    for m in _BLOCK.finditer(old):
        if m.group("name") == name:
            target.write_text(old[: m.start()] + text + old[m.end() :])
            return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(old + ("\n" if old and not old.endswith("\n\n") else "") + text)


def others(path: Path, name: str) -> list[str]:
    """The sections of other studies than ``name`` in the markdown file ``path`` (none if it is missing),
    to carry over when ``name``'s report rewrites that file."""
    if not path.exists():
        return []
    return [m.group(0).rstrip("\n") for m in _BLOCK.finditer(path.read_text()) if m.group("name") != name]
