"""The HTML viewer in headless Chromium (Debian ``chromium`` + ``chromium-driver``, driven by Selenium).

Install with ``bash .ci/browser_setup.sh``. Skips with the reason when the browser cannot start.
Set AGENTRL_UPDATE_SCREENSHOT=1 to refresh docs/img/viewer.png from this test's screenshot.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

from agentrl.transcripts import iter_episodes
from agentrl.views.viewer.page import inspect_command
from tests.helpers import DATA, ROOT
from tests.helpers.configs import small_config

pytestmark = pytest.mark.browser
RUN = DATA / "transcripts" / "run"
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        pytest.skip(f"selenium is not installed ({e}); run bash .ci/browser_setup.sh")
    for exe in (CHROMIUM, DRIVER):
        if not Path(exe).exists():
            pytest.skip(f"{exe} is missing; run bash .ci/browser_setup.sh")
    opts = Options()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="agentrl-chromium-")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    except Exception as e:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"headless Chromium did not start: {type(e).__name__}: {e}")
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("viewer") / "inspect.html"
    assert inspect_command(str(RUN), output=str(out)) == 0
    return out


@pytest.fixture(scope="module")
def episodes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {e.id: e for e in iter_episodes(RUN)}


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def test_viewer_lists_filters_opens_and_explains(browser, page, episodes, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser
    d.get(page.as_uri())
    rows = d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
    assert len(rows) == 48  # all fixture episodes fit on the first page (50 per page)
    assert "rows 1–48 of 48" in d.find_element(By.ID, "page-info").text
    assert len(d.find_elements(By.CSS_SELECTOR, "#curves .curve")) == 10  # every numeric metric key
    first_curve = d.find_element(By.CSS_SELECTOR, "#curves .curve").get_attribute("data-key")
    assert first_curve == "reward/mean"  # important keys first

    Select(d.find_element(By.ID, "f-fail")).select_by_value("tool")
    rows = d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
    assert [r.get_attribute("data-id") for r in rows] == ["t23+20-s4-g1-1"]
    d.find_element(By.ID, "f-reset").click()
    Select(d.find_element(By.ID, "f-step")).select_by_value("4")
    assert len(d.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 8

    # An episode of step 4 (gate on) with a positive advantage and STARE L+ tokens.
    ep = next(
        e
        for e in episodes.values()
        if e.step == 4 and e.overlays["advantage"][-2] and e.overlays["advantage"][-2] > 0
    )
    d.find_element(By.CSS_SELECTOR, f"#episodes tbody tr[data-id='{ep.id}']").click()
    assert d.find_element(By.ID, "episode-section").is_displayed()
    toks = js(
        d,
        "return Array.from(document.querySelectorAll('#tokens .tok')).map(e => [e.className.split(' ')[1], e.dataset.logp ?? null, e.dataset.weight ?? null, e.dataset.selected ?? null])",
    )
    assert len(toks) == len(ep.token_ids())
    assert [t[0] for t in toks] == ["role-" + r for r in ep.roles()]
    lp, w, sel = ep.overlays["logp_old"], ep.overlays["weight"], ep.overlays["selected"]
    for i, (_, logp, weight, selected) in enumerate(toks):
        if ep.roles()[i] == "policy":
            assert (
                float(logp) == pytest.approx(lp[i], abs=1e-9)
                and float(weight) == w[i]
                and int(selected) == sel[i]
            )
        else:
            assert weight is None and selected is None and logp is None

    # Overlays recolour in place: same elements, new --bg on policy tokens only.
    first = d.find_element(By.CSS_SELECTOR, "#tokens .tok.role-policy")
    d.find_element(By.ID, "ov-surprisal").click()
    assert "ov-value" in d.find_element(By.ID, "tokens").get_attribute("class")
    assert (
        first.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
    )  # still attached: no re-render
    prompt_bg = d.find_element(By.CSS_SELECTOR, "#tokens .tok.role-prompt").value_of_css_property(
        "background-color"
    )
    assert prompt_bg == "rgba(0, 0, 0, 0)"
    d.find_element(By.ID, "ov-selected").click()
    chosen = d.find_elements(By.CSS_SELECTOR, "#tokens .tok[data-selected='1']")
    assert len(chosen) == sum(1 for x in sel if x == 1) > 0
    assert chosen[0].value_of_css_property("background-color") == "rgba(30, 160, 70, 0.75)"
    assert "L+" in d.find_element(By.ID, "legend").text
    for name in ("entropy", "advw", "role"):
        d.find_element(By.ID, f"ov-{name}").click()
    assert "ov-role" in d.find_element(By.ID, "tokens").get_attribute("class")

    # Why did this token get this weight?
    d.find_element(By.ID, "ov-advw").click()
    js(d, "arguments[0].scrollIntoView({block: 'center'})", chosen[0])
    chosen[0].click()
    why = d.find_element(By.ID, "why").text
    assert (
        "Selected as L+" in why
        and "Gate at step 4: on" in why
        and "weight\n1.1000" in why.replace("weight 1", "weight\n1")
    )
    assert len(d.find_elements(By.CSS_SELECTOR, ".turn-chart rect")) == ep.num_turns

    shot = tmp_path / "viewer.png"
    d.find_element(By.ID, "ov-surprisal").click()  # the pinned explanation stays
    assert "Selected as L+" in d.find_element(By.ID, "why").text
    js(
        d,
        "document.getElementById('tooltip').hidden = true; document.getElementById('episode-section').scrollIntoView()",
    )
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    if os.environ.get("AGENTRL_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "img" / "viewer.png")

    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_deep_link_opens_an_episode(browser, page):
    from selenium.webdriver.common.by import By

    browser.get(page.as_uri() + "#episode=t24%2B7-s5-g2-0")
    assert browser.find_element(By.ID, "ep-title").text == "t24+7-s5-g2-0"
    assert "max_turns" in browser.find_element(By.ID, "ep-header").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.role-env")) > 0


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, tiny_model_dir):
    """A real STARE run: 4 steps with H_tgt = the first batch's entropy, so the gate is off at step 0
    (H̄ is not below itself) and switches with the entropy after that."""
    from agentrl.assembly import make_trainer

    tmp = tmp_path_factory.mktemp("real")
    cfg = small_config(
        tmp, tiny_model_dir, "algorithm.name=stare", "algorithm.stare.variant=C2", "algorithm.stare.target_scale=1.0",
        "algorithm.stare.W=2.0", "algorithm.stare.M=0.5", "algorithm.stare.P=0.3", "trainer.total_steps=6",
    )  # fmt: skip
    make_trainer(cfg, log=lambda *_: None).train()
    page = tmp / "view.html"
    assert inspect_command(str(tmp / "run"), output=str(page)) == 0
    return tmp / "run", page


@pytest.mark.slow
def test_a_real_runs_page_shades_the_gate_and_explains_a_pinned_token(browser, real_run):
    import json

    from selenium.webdriver.common.by import By

    from agentrl.training.metrics import CURVES, IMPORTANT
    from tests.helpers.jsonl import lines

    run, page = real_run
    rows = [json.loads(x) for x in lines(run / "metrics.jsonl")]
    on = [r["step"] for r in rows if r[CURVES["gate"]]]
    assert 0 < len(on) < len(rows) and 0 not in on, on  # the gate switches in this run
    d = browser
    d.get(page.as_uri())
    keys = [c.get_attribute("data-key") for c in d.find_elements(By.CSS_SELECTOR, "#curves .curve")]
    shown = [k for k in IMPORTANT if k in rows[0]]
    assert keys[: len(shown)] == shown  # the promised order, with the trainer's own names
    gate = d.find_element(By.CSS_SELECTOR, f"#curves .curve[data-key='{CURVES['gate']}']")
    assert len(gate.find_elements(By.CSS_SELECTOR, "rect.gate")) == len(
        on
    )  # one shaded band per gate-on step
    # a token STARE selected at a gate-on step: the pinned panel says the gate was on and it got W or M
    episodes = [json.loads(x) for x in lines(run / "transcripts.jsonl")]
    ep, i = next(
        (e, i)
        for e in episodes
        if e["step"] in on and e.get("overlays")
        for i, s in enumerate(e["overlays"]["selected"])
        if s
    )
    d.get(page.as_uri() + "#episode=" + ep["id"])
    tok = d.find_element(By.CSS_SELECTOR, f"#tokens .tok[data-i='{i}']")
    js(d, "arguments[0].click()", tok)  # a sampled token may render empty (nothing to click on)
    why = d.find_element(By.ID, "why").text
    which = "W" if ep["overlays"]["selected"][i] > 0 else "M"
    value = rows[ep["step"]][CURVES[which]]
    assert (
        f"Gate at step {ep['step']}: on" in why and f"target H_tgt = {rows[0][CURVES['target']]:.4f}" in why
    )
    shown = lambda x: str(int(x)) if float(x).is_integer() else f"{x:.3f}"  # noqa: E731  (the viewer's fmt)
    weight = ep["overlays"]["weight"][i]
    assert f"It received {which}: weight {shown(weight)} ({which} = {shown(value)} at this step)" in why, why
    # and a policy token of a gate-off step: every weight stays 1
    off = next(e for e in episodes if e["step"] not in on and e.get("overlays"))
    j = next(k for k, w in enumerate(off["overlays"]["weight"]) if w is not None)
    d.get(page.as_uri() + "#episode=" + off["id"])
    js(d, "arguments[0].click()", d.find_element(By.CSS_SELECTOR, f"#tokens .tok[data-i='{j}']"))
    assert f"Gate at step {off['step']}: off" in d.find_element(By.ID, "why").text
    assert [e for e in d.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_deep_link_opens_at_the_episode(browser, real_run):
    from selenium.webdriver.common.by import By

    run, page = real_run
    episode_id = json_first_id(run)
    browser.get("about:blank")  # a fresh load, as when the link is opened
    browser.get(page.as_uri() + "#episode=" + episode_id)
    box = js(
        browser,
        "const r = document.getElementById('episode-section').getBoundingClientRect(); return [r.top, r.bottom, innerHeight, scrollY]",
    )
    assert browser.find_element(By.ID, "ep-title").text == episode_id
    top, bottom, height, scrolled = box
    # first on the page, in view without scrolling (a page that scrolls itself on load is a blank
    # image for `chromium --headless --screenshot`)
    assert scrolled == 0 and top >= 0 and min(bottom, height) - top > 200, box


def json_first_id(run: Path) -> str:
    import json

    from tests.helpers.jsonl import lines

    return json.loads(lines(run / "transcripts.jsonl")[-1])["id"]


def _drawn(png: Path) -> None:
    from PIL import Image

    image = Image.open(png).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, f"{png.name} is blank"
    top = max(colours)[0] / (image.width * image.height)  # the page's background alone
    assert top < 0.9, f"{top:.0%} of {png.name} is one colour"


def test_a_deep_links_screenshot_shows_the_episode(browser, page, tmp_path):
    """Issue 66, item 15: ``chromium --headless --screenshot`` of inspect.html#episode=ID came out
    blank, while --dump-dom showed the episode. That capture draws any page that scrolls itself on
    load as a blank viewport (a page of coloured stripes and one scrollTo does the same), and the
    page scrolled to the episode. A deep link now puts the episode first, under the title, without
    scrolling: both that capture and the DevTools one (Selenium, Playwright) show it."""
    import subprocess

    from selenium.webdriver.common.by import By

    link = page.as_uri() + "#episode=t24%2B7-s5-g2-0"
    browser.get("about:blank")
    browser.get(link)
    assert browser.find_element(By.ID, "ep-title").text == "t24+7-s5-g2-0"
    browser.save_screenshot(str(tmp_path / "devtools.png"))
    _drawn(tmp_path / "devtools.png")
    profile = tmp_path / "profile"
    cli = tmp_path / "cli.png"
    subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={cli}", link],
        check=True,
        capture_output=True,
        timeout=120,
    )
    _drawn(cli)
