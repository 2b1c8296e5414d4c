"""How `agentrl inspect` scales: build a fake run of N episodes from the fixture run's episodes
(~290 tokens each, with overlays), then time the index pass + page build, the page size, and (if
Chromium is installed) how long the page takes to load and to open one episode.

    .venv/bin/python bench/bench_inspect.py --episodes 20000 --max-episodes 2000
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "transcripts" / "run"


def build_run(out: Path, n: int) -> None:
    lines = [ln for ln in (FIXTURE / "transcripts.jsonl").read_text().splitlines() if ln.endswith("}")]
    shutil.copy(FIXTURE / "config.yaml", out / "config.yaml")
    (out / "config.yaml").write_text(
        (FIXTURE / "config.yaml").read_text().replace("../tokenizer", str(FIXTURE.parent / "tokenizer"))
    )
    steps = max(1, n // 64)
    with open(out / "transcripts.jsonl", "w") as f:
        for i in range(n):
            ln = lines[i % len(lines)]
            ln = re.sub(r'^\{"id":"[^"]*"', f'{{"id":"ep-{i}"', ln, count=1)
            ln = re.sub(r'"step":\d+,', f'"step":{i * steps // n},', ln)
            f.write(ln + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=20000)
    ap.add_argument("--max-episodes", type=int, default=2000)
    args = ap.parse_args()
    from agentrl.views.viewer.page import inspect_command

    tmp = Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    try:
        build_run(tmp, args.episodes)
        size = (tmp / "transcripts.jsonl").stat().st_size
        t0 = time.perf_counter()
        assert (
            inspect_command(str(tmp), output=str(tmp / "inspect.html"), max_episodes=args.max_episodes) == 0
        )
        build_s = time.perf_counter() - t0
        page = (tmp / "inspect.html").stat().st_size
        print(
            f"episodes {args.episodes} ({size / 1e6:.0f} MB transcript) -> inspect {build_s:.1f} s, page {page / 1e6:.1f} MB"
        )
        browser_timing(tmp / "inspect.html")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def browser_timing(page: Path) -> None:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        print("selenium missing: no browser timing")
        return
    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp()
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        t0 = time.perf_counter()
        d.get(page.as_uri())
        load = time.perf_counter() - t0
        ms = d.execute_script(
            "const t = performance.now(); const id = document.querySelector('#episodes tbody tr').dataset.id;"
            "window.agentrlViewer.openEpisode(id); window.agentrlViewer.setOverlay('surprisal');"
            "return performance.now() - t;"
        )
        print(f"browser: page load {load:.2f} s, open episode + overlay {ms:.0f} ms")
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
