"""`trainsup web` in chromium over one live demo run: the runs list follows the run without a reload,
the run page draws its loss curve, shows its samples and puts its faults and their remedies on the
timeline, the queue page adds an entry only with the token, and the stop button is refused without the
token and stops the run with it.

The tests share the module's run (conftest.py) and run in file order: the stop test is last, since
it ends the run the others watch.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from tests.conftest import ROOT, trainsup_cmd, wait_until
from tests.e2e.demo_harness import cli, demo_argv, status_of
from tests.web.conftest import OOM_AT, QUEUED_PROJECT, SAMPLE_EVERY, STEPS, Browser, DemoRun, Dirs
from trainsup.web.runs import run_id as run_id_of

STEP_TEXT = re.compile(rf"(\d+)/{STEPS}")


def run_path(run_id: str) -> str:
    return f"/run/{quote(run_id, safe='')}"


def submit(form: WebElement) -> None:
    """Submit a form as a user does: its button (a script's form.submit() would skip what a click does)."""
    buttons = form.find_elements(By.CSS_SELECTOR, "button, input[type=submit]")
    if buttons:
        buttons[0].click()
    else:
        form.submit()


def action_url(browser: Browser, form: WebElement) -> str:
    return str(browser.js("return arguments[0].action", form))


def test_the_runs_list_follows_the_step_without_a_reload(browser: Browser, run_id: str) -> None:
    browser.open("/")
    assert browser.page() == "runs"
    row = f'table#runs tr.run[data-run="{run_id}"]'
    for cell in ("name", "state", "step", "loss", "speed", "eta", "attempt", "fault", "gpu"):
        assert browser.all(f"{row} td.{cell}"), f"the run's row has no td.{cell}"
    assert browser.one(f"{row} td.name a").get_dom_attribute("href") == run_path(run_id)
    loaded = browser.loaded_at()
    assert loaded, "page.js did not set window.trainsupLoaded"

    def step() -> str | None:
        text = browser.text(f"{row} td.step")
        return text if STEP_TEXT.fullmatch(text) else None

    first = wait_until(step, timeout=60, interval=0.1, what=f"a step like N/{STEPS} in the run's row")
    moved = wait_until(lambda: (now := step()) is not None and now != first and now, timeout=60, interval=0.1,
                       what=f"the run's step to move on from {first} on the open page")
    # the same document all along: the row was refreshed in place, the page never reloaded
    assert browser.loaded_at() == loaded, f"the page reloaded instead of refreshing its live parts ({moved})"
    browser.shot("runs")


def test_the_run_page_draws_the_loss_curve(browser: Browser, run_id: str) -> None:
    browser.open(run_path(run_id))
    assert browser.page() == "run"
    assert browser.all("#summary .state") and browser.all("#summary .step")

    def points() -> int:
        return int(browser.js("return document.querySelector('#loss svg')?.dataset.points || 0") or 0)

    wait_until(points, timeout=60, interval=0.2, what="#loss svg with data-points > 0")
    curve = browser.js("""
        const svg = document.querySelector('#loss svg');
        return {points: Number(svg.dataset.points),
                series: [...svg.querySelectorAll('polyline.series')].map(
                    p => (p.getAttribute('points') || '').trim().split(/\\s+/).filter(Boolean).length)};""")
    assert curve["series"], "no polyline.series in #loss svg"
    # data-points counts what is drawn: the vertices of the attempts' polylines
    assert sum(curve["series"]) == curve["points"], curve


def test_the_run_page_shows_a_sample(browser: Browser, run_id: str) -> None:
    browser.open(run_path(run_id))

    def loaded_sample() -> dict[str, str] | None:
        found: dict[str, str] | None = browser.js("""
            const img = [...document.querySelectorAll('#samples img.sample')]
                .find(i => i.complete && i.naturalWidth > 0);
            return img ? {step: img.dataset.step, src: img.getAttribute('src')} : null;""")
        return found

    sample = wait_until(loaded_sample, timeout=90, interval=0.25, what="a loaded #samples img.sample")
    assert isinstance(sample, dict)
    assert sample["src"].startswith(f"{run_path(run_id)}/file/"), sample
    assert sample["step"] and sample["step"].isdigit(), sample
    # the demo samples every SAMPLE_EVERY true steps (no resume here relabels a step)
    assert 0 < int(sample["step"]) <= STEPS and int(sample["step"]) % SAMPLE_EVERY == 0, sample


def test_the_faults_and_remedies_are_on_the_timeline(browser: Browser, run_id: str, demo: DemoRun) -> None:
    # cuda_oom@OOM_AT ends the first attempts until a remedy helps; wait for the attempt after the
    # last remedy to be under way, so the page (and its screenshot) holds the whole story
    def under_way() -> bool:
        status, remedies = demo.status(), demo.events("remedy")
        return bool(remedies) and status.get("attempt", 0) > len(remedies) and status.get("step", 0) > OOM_AT + 4

    wait_until(under_way, timeout=300, interval=0.2,  # three launches of torch on loaded CI cores
               what=f"an attempt training past step {OOM_AT + 4} after the remedies\n{demo.tail()}")
    faults, remedies = demo.events("fault"), demo.events("remedy")
    browser.open(run_path(run_id))

    def shown(kind: str) -> list[str]:
        return [str(t).strip() for t in browser.js(
            "return [...document.querySelectorAll(`#timeline li.event[data-event=${arguments[0]}]`)]"
            ".map(li => li.textContent)", kind)]

    wait_until(lambda: len(shown("fault")) == len(faults) and len(shown("remedy")) == len(remedies),
               timeout=30, interval=0.2, what=f"{len(faults)} faults and {len(remedies)} remedies on #timeline "
               f"(the journal's)")
    assert all("cuda_oom" in text for text in shown("fault")), shown("fault")
    # each remedy's actions named as the journal words them (the allocator setting, then a flag)
    for remedy in remedies:
        for action in remedy["actions"]:
            assert any(action in text for text in shown("remedy")), (action, shown("remedy"))
    # a page worth looking at: the curve, a sample and the timeline of the faulted run
    wait_until(lambda: browser.js("return [...document.querySelectorAll('#samples img.sample')]"
                                  ".some(i => i.complete && i.naturalWidth > 0)"),
               timeout=60, interval=0.25, what="a loaded sample before the screenshot")
    browser.shot("run")
    # the curve marks each fault too: a g.fault whose <title> names the fault's class (and its attempt)
    titles = browser.js("return [...document.querySelectorAll('#loss g.fault title')].map(t => t.textContent)")
    assert len(titles) == len(faults) and all(str(t).startswith("cuda_oom (attempt ") for t in titles), titles


def test_the_queue_page_adds_an_entry_only_with_the_token(browser: Browser, dirs: Dirs) -> None:
    browser.open("/queue")
    assert browser.page() == "queue"

    def add(project: str) -> str:
        form = browser.one("form.add")
        field = form.find_element(By.CSS_SELECTOR, "input[name=project]")
        field.clear()
        field.send_keys(project)
        url = action_url(browser, form)
        submit(form)
        return url

    url = add(QUEUED_PROJECT)
    browser.wait_text("#flash", "needs the token")
    assert browser.status_of(url) == 403, browser.documents()
    assert not list((dirs.state / "queue").glob("*/entry.json")), "a refused add queued an entry"

    browser.login("/queue")
    cookies = browser.driver.get_cookies()
    assert cookies, "logging in set no cookie"
    assert all(c.get("httpOnly") and c.get("sameSite") == "Strict" for c in cookies), cookies
    assert browser.js("return document.cookie") == "", "the token cookie is readable by scripts"

    add(QUEUED_PROJECT)

    def entry() -> tuple[str, str] | None:
        for row in browser.all("table#queue tr.entry"):
            text = browser.js("return arguments[0].textContent", row)
            if QUEUED_PROJECT in text:
                return str(row.get_attribute("data-entry")), str(text)
        return None

    try:
        found = wait_until(entry, timeout=20, interval=0.1, what=f"a queue row for {QUEUED_PROJECT}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; #flash says {browser.text('#flash')!r}") from None
    assert isinstance(found, tuple)
    entry_id, text = found
    assert "queued" in text, text
    listed = cli("queue", "list", "--json", "--state", str(dirs.state), env=dirs.env)
    assert listed.returncode == 0, listed.stderr
    [queued] = json.loads(listed.stdout)
    assert (queued["id"], queued["project"], queued["state"]) == (entry_id, QUEUED_PROJECT, "queued"), queued
    browser.shot("queue")


def test_a_run_started_by_hand_shows_on_the_open_page_without_a_restart(browser: Browser, dirs: Dirs,
                                                                        assets: dict[str, Path]) -> None:
    """A `trainsup run -- ...` that `trainsup web` was never told of (no project, no queue, not on its
    command line) is on the open runs list within 2 s of its start: its supervisor registers its run dir
    in the box's index of runs, which the page reads at each refresh."""
    browser.open("/")
    loaded = browser.loaded_at()
    out = dirs.root / "out-by-hand"
    env = {k: v for k, v in dirs.env.items() if k != "TRAINSUP_DEMO_SIMULATE"}  # a plain run, no fault
    started = time.monotonic()
    proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--", *demo_argv("train_network", assets, out, steps=8)),
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        row = f'table#runs tr.run[data-run="{run_id_of((out / ".trainsup").resolve())}"]'
        wait_until(lambda: browser.all(row), timeout=30, interval=0.05, what="the hand-started run's row")
        seen_after = time.monotonic() - started
        assert seen_after < 2.0, f"on the page {seen_after:.2f} s after `trainsup run` started"
        assert browser.loaded_at() == loaded, "the page reloaded"
        browser.wait_text(f"{row} td.state", "running", exact=True, timeout=60)
        browser.shot("runs-started-by-hand")
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        browser.wait_text(f"{row} td.state", "finished", exact=True, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_stop_is_refused_without_the_token_and_stops_the_run_with_it(browser: Browser, run_id: str,
                                                                    demo: DemoRun, dirs: Dirs) -> None:
    page = run_path(run_id)
    browser.open(page)
    browser.wait_text("#summary .state", "running", exact=True, timeout=60)
    form = browser.one("form.stop")
    url = action_url(browser, form)
    assert url == browser.web.url.rstrip("/") + f"{page}/stop"
    form.find_element(By.CSS_SELECTOR, "button.stop").click()
    browser.wait_text("#flash", "needs the token")
    assert browser.status_of(url) == 403, browser.documents()
    assert status_of(str(demo.run_dir), dirs.env)["state"] == "running"
    assert demo.proc.poll() is None, "a refused stop stopped the run"

    browser.login(page)
    browser.one("form.stop button.stop").click()
    browser.wait_text("#flash", "stop requested")
    browser.wait_text("#summary .state", "stopped", exact=True, timeout=60)
    assert demo.proc.wait(timeout=30) == 143, demo.tail()  # trainsup's exit on SIGTERM
    assert status_of(str(demo.run_dir), dirs.env)["state"] == "stopped"
