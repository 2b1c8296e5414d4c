"""A study's report as a section of another results file (agentrl/study/sections.py)."""

from __future__ import annotations

from pathlib import Path

from agentrl.study import sections


def _report(tmp_path: Path, body: str) -> Path:
    report = tmp_path / "docs" / "study_real" / "results.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(body)
    return report


REPORT = (
    "# Entropy-stability study: real\n\nSee [study.md](../study.md#resume) and "
    "[the paper](https://arxiv.org/abs/1) and [below](#short).\n\n## short\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n\n![plot](img/study_short_entropy.png)\n"
)


def test_a_section_moves_headings_down_and_links_to_the_target_folder(tmp_path):
    report = _report(tmp_path, REPORT)
    target = tmp_path / "docs" / "results.md"
    text = sections.section("real", report, target)
    lines = text.splitlines()
    assert lines[0] == "<!-- agentrl study section: real -->"
    assert lines[1] == "## Entropy-stability study: real"
    assert lines[-1] == "<!-- end of agentrl study section: real -->"
    assert "\n### short\n" in text and "\n## short\n" not in text
    assert "[study.md](study.md#resume)" in text  # ../study.md seen from docs/study_real
    assert "(https://arxiv.org/abs/1)" in text and "[below](#short)" in text  # URLs and anchors stay
    assert "![plot](study_real/img/study_short_entropy.png)" in text
    assert "[study_real/results.md](study_real/results.md)" in text  # the report alone
    assert "| 1 | 2 |" in text


def test_embedding_replaces_only_its_own_section(tmp_path):
    report = _report(tmp_path, REPORT)
    target = tmp_path / "docs" / "results.md"
    target.write_text("# Tiny study\n\ntables\n")
    sections.embed(target, "real", sections.section("real", report, target))
    sections.embed(
        target,
        "other",
        "<!-- agentrl study section: other -->\nX\n<!-- end of agentrl study section: other -->\n",
    )
    first = target.read_text()
    assert first.startswith("# Tiny study\n\ntables\n\n<!-- agentrl study section: real -->")
    report.write_text(REPORT.replace("| 1 | 2 |", "| 3 | 4 |"))
    sections.embed(target, "real", sections.section("real", report, target))
    second = target.read_text()
    assert second == first.replace("| 1 | 2 |", "| 3 | 4 |")  # in place; the rest is untouched
    assert second.count("<!-- agentrl study section: real -->") == 1 and second.endswith("other -->\n")


def test_a_rewritten_results_file_keeps_other_studies_sections(tmp_path):
    target = tmp_path / "docs" / "results.md"
    assert sections.others(target, "tiny") == []  # no file yet
    report = _report(tmp_path, REPORT)
    target.write_text("# Tiny study\n\nold tables\n")
    sections.embed(target, "real", sections.section("real", report, target))
    kept = sections.others(target, "tiny")
    assert len(kept) == 1 and kept[0].startswith("<!-- agentrl study section: real -->")
    assert kept[0].endswith("<!-- end of agentrl study section: real -->")
    assert sections.others(target, "real") == []  # its own section is not carried over its rewrite


def test_embedding_into_a_missing_file_creates_it(tmp_path):
    report = _report(tmp_path, REPORT)
    target = tmp_path / "elsewhere" / "results.md"
    sections.embed(target, "real", sections.section("real", report, target))
    assert target.read_text().startswith("<!-- agentrl study section: real -->\n## Entropy")
    assert "![plot](../docs/study_real/img/study_short_entropy.png)" in target.read_text()
