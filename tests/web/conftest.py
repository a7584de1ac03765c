"""The browser tier's harness: one demo run trained under `trainsup run`, one `trainsup web` over it,
and one headless chromium driven by selenium, all shared by the module's tests.

Owns starting and stopping those three (the web server by SIGTERM, which must end it with exit 0 and
no traceback), the `Browser` helper the tests drive pages with (CSS look-ups, the `/login` form, the
HTTP status of the documents the browser loaded, screenshots), and a `no_leaks` that knows about them.
Everything is real and local: Debian's chromium and chromedriver (selenium never downloads one), the
demo trainer (torch on CPU) and trainsup as subprocesses, files in tmp dirs; nothing of the user's
state or projects is read.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from tests.conftest import ROOT, trainsup_cmd, wait_until
from tests.e2e.demo_harness import FAST_POLICY, clean_env, demo_argv
from trainsup.demo.make_assets import make_assets
from trainsup.record.journal import read_events

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The contract's start line, `trainsup web: serving URL (token: TOKEN; kept in STATE/web.token)`; a clause
# more after the file (`; actions need the token`) is tolerated.
SERVING = re.compile(r"^trainsup web: serving (http://\S+/) \(token: ([^;\s]+); kept in ([^;)]+)[;)]")

# The run must outlive every test but the last, which stops it: far more steps than the tier lasts on
# loaded cores (400 x 0.3 s, plus the faulted attempts), each slowed down so a test sees the step move
# between two live refreshes (1 s) without waiting long.
STEPS = 400
STEP_SECONDS = "0.3"
# A fault early in the run: the first two attempts die of it (the ladder's first rung, the allocator
# setting, does not help the demo; the second, --gradient_checkpointing, does) and the third trains on.
OOM_AT = 3
SAMPLE_EVERY = 2
QUEUED_PROJECT = "queued-lora"

# Every screenshot saved in this session, printed in the terminal summary (pytest -q hides prints).
SHOTS: list[Path] = []


def need_browser() -> None:
    """Skip without a browser, except in CI: there a silently skipped tier would be a defect."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    why = f"the browser tier needs Debian's chromium and chromium-driver; missing: {', '.join(missing)}"
    if os.environ.get("CI"):
        pytest.fail(f"{why} (.ci/run installs them)")
    pytest.skip(why)


@dataclass
class Dirs:
    root: Path
    state: Path
    projects: Path
    env: dict[str, str]


@dataclass
class DemoRun:
    """A `trainsup run` of the demo trainer in the background, its output in files."""

    proc: subprocess.Popen[bytes]
    out: Path
    run_dir: Path
    logs: Path

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir / "status.json").read_text()))
        except (OSError, ValueError):
            return {}

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(self.run_dir) if e["event"] == kind]

    def tail(self) -> str:
        """The supervisor's own output, for an assertion's message."""
        return (self.logs / "run.stderr").read_text(errors="replace")[-3000:]


@dataclass
class Web:
    proc: subprocess.Popen[bytes]
    url: str
    token: str
    token_file: Path
    stderr: Path

    def output(self) -> str:
        return self.stderr.read_text(errors="replace")


@dataclass
class Browser:
    """The one chromium of the module, pointed at the one `trainsup web`."""

    driver: webdriver.Chrome
    web: Web
    shots_dir: Path
    _log: list[dict[str, Any]] = field(default_factory=list)

    def open(self, path: str) -> None:
        self.driver.get(self.web.url.rstrip("/") + path)
        wait_until(lambda: self.js("return document.readyState") == "complete", timeout=20,
                   what=f"{path} to load")

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def one(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        """The text of the first match, or "" when none: live fragments are replaced under our feet, so
        an element found a moment ago may be gone (a stale element reads as "" and the wait goes on)."""
        try:
            found = self.all(css)
            return found[0].text.strip() if found else ""
        except WebDriverException:
            return ""

    def wait_text(self, css: str, wanted: str, *, exact: bool = False, timeout: float = 30) -> str:
        """Wait until the first ``css`` match says ``wanted`` (holds it, or is it when ``exact``); a
        timeout names what the page says instead."""
        def says() -> str | None:
            text = self.text(css)
            return text if (text == wanted if exact else wanted in text) else None

        try:
            return str(wait_until(says, timeout=timeout, interval=0.1, what=f"{wanted!r} in {css}"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it says {self.text(css)!r} on {self.path()}") from None

    def page(self) -> str:
        return str(self.js("return document.body ? document.body.dataset.page || '' : ''"))

    def loaded_at(self) -> Any:
        return self.js("return window.trainsupLoaded")

    def logout(self) -> None:
        # The cookie is HttpOnly: only the browser itself can drop it, whatever page is open.
        self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})

    def login(self, next_path: str) -> None:
        """Log in through the /login form, as a user pastes the token printed at start."""
        self.open(f"/login?next={next_path}")
        assert self.page() == "login", self.driver.page_source[:2000]
        field_ = self.one("form.login input[name=token]")
        field_.clear()
        field_.send_keys(self.web.token)
        self.one("form.login").submit()
        wait_until(lambda: self.path() == next_path and self.js("return document.readyState") == "complete",
                   timeout=20, what=f"the login to land on {next_path} (now {self.path()})")

    def path(self) -> str:
        return str(self.js("return location.pathname + location.search"))

    def documents(self) -> list[dict[str, Any]]:
        """Every top-level document the browser received so far (url, status), from chromium's network
        log: the status of a form's answer is not otherwise visible to a page test."""
        entries: list[dict[str, Any]] = self.driver.get_log("performance")  # type: ignore[no-untyped-call]
        for entry in entries:
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.responseReceived" and message["params"].get("type") == "Document":
                response = message["params"]["response"]
                self._log.append({"url": response["url"], "status": response["status"]})
        return list(self._log)

    def forget_documents(self) -> None:
        """Drop what was loaded so far (earlier tests' pages) from the network log."""
        self.documents()
        self._log.clear()

    def status_of(self, url: str) -> int | None:
        """The HTTP status of the newest document loaded from ``url`` (absolute, or a path of the app)."""
        url = url if url.startswith("http") else self.web.url.rstrip("/") + url
        found = [d["status"] for d in self.documents() if d["url"] == url]
        return int(found[-1]) if found else None

    def shot(self, name: str) -> Path:
        """A screenshot of the whole page (not only the window), saved and remembered for the summary."""
        self.shots_dir.mkdir(parents=True, exist_ok=True)
        path = self.shots_dir / f"{name}.png"
        taken = self.driver.execute_cdp_cmd("Page.captureScreenshot",
                                            {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(taken["data"]))
        SHOTS.append(path)
        print(f"screenshot: {path}")
        return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Dirs:
    root = tmp_path_factory.mktemp("web")
    state, projects = root / "state", root / "projects"
    state.mkdir(mode=0o700)
    projects.mkdir()
    # The environment every trainsup of the module runs in: its own state and projects, the demo's
    # knobs set here only (clean_env drops the ones the caller may have).
    env = clean_env(TRAINSUP_STATE=str(state), TRAINSUP_PROJECTS=str(projects),
                    TRAINSUP_DEMO_STEP_SECONDS=STEP_SECONDS, TRAINSUP_DEMO_SIMULATE=f"cuda_oom@{OOM_AT}")
    return Dirs(root, state, projects, env)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="module")
def demo(dirs: Dirs, assets: dict[str, Path]) -> Iterator[DemoRun]:
    """The demo trainer under `trainsup run`, sampling every other step, started before anything else
    of the module (torch's import is the slowest start)."""
    out = dirs.root / "out"
    argv = demo_argv("train_network", assets, out, "--sample_prompts", str(assets["prompts"]),
                     "--sample_every_n_steps", str(SAMPLE_EVERY), steps=STEPS, save_every=10)
    policy = dirs.root / "policy.yaml"
    policy.write_text(FAST_POLICY)
    logs = dirs.root / "run-logs"
    logs.mkdir()
    with open(logs / "run.stdout", "wb") as so, open(logs / "run.stderr", "wb") as se:
        proc = subprocess.Popen(trainsup_cmd("run", "--quiet", "--policy", str(policy), "--", *argv),
                                cwd=ROOT, env=dirs.env, stdout=so, stderr=se)
    # A project of the projects dir that is only ever queued (no daemon runs here, so it stays queued):
    # the queue page's form adds it by name.
    queued = demo_argv("train_network", assets, dirs.root / "out-queued", steps=8)
    (dirs.projects / f"{QUEUED_PROJECT}.yaml").write_text(
        yaml.safe_dump({"command": queued, "run_dir": str(dirs.root / "run-queued")}))
    run = DemoRun(proc, out, out / ".trainsup", logs)
    try:
        yield run
    finally:
        if proc.poll() is None:  # a test failed before the stop test ended it: the whole tree goes
            for p in psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]:
                p.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def web(dirs: Dirs, demo: DemoRun) -> Iterator[Web]:
    """`trainsup web` on a free loopback port over the projects, the queue and the demo's run dir."""
    stderr = dirs.root / "web.stderr"
    with open(stderr, "wb") as se, open(dirs.root / "web.stdout", "wb") as so:
        proc = subprocess.Popen(trainsup_cmd("web", "--listen", "127.0.0.1:0", "--state", str(dirs.state),
                                             "--projects", str(dirs.projects), str(demo.run_dir)),
                                cwd=ROOT, env=dirs.env, stdout=so, stderr=se)
    try:
        def serving() -> re.Match[str] | None:
            if proc.poll() is not None:
                raise AssertionError(f"trainsup web exited {proc.returncode}: {stderr.read_text()}")
            return next(filter(None, map(SERVING.match, stderr.read_text().splitlines())), None)

        found = wait_until(serving, timeout=60, interval=0.1, what="trainsup web's serving line")
        assert isinstance(found, re.Match)
        server = Web(proc, found.group(1), found.group(2), Path(found.group(3)), stderr)
        # the token is kept where the line says, in the state dir, for the owner only
        assert server.token_file == dirs.state / "web.token", server.token_file
        assert server.token_file.read_text().strip() == server.token
        assert server.token_file.stat().st_mode & 0o777 == 0o600, oct(server.token_file.stat().st_mode)
        yield server
    finally:
        # The module's browser is still there with a page open (its live parts fetch every second), as a
        # user's would be: the server must stop all the same.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"trainsup web was still serving 15 s after SIGTERM; its stderr begins:\n"
                                 f"{stderr.read_text(errors='replace')[:3000]}") from None
    said = stderr.read_text(errors="replace")
    assert code == 0, f"trainsup web exited {code} on SIGTERM:\n{said}"
    assert "Traceback" not in said, said


@pytest.fixture(scope="module")
def driver(dirs: Dirs) -> Iterator[webdriver.Chrome]:
    need_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                f"--user-data-dir={dirs.root / 'chromium-profile'}"):
        options.add_argument(arg)
    # The network log: how a test learns the HTTP status of a page a form submitted to.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    # An explicit chromedriver: selenium's manager then never looks for (or downloads) another.
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture
def shots_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("TRAINSUP_WEB_SHOTS")
    return Path(chosen) if chosen else tmp_path


@pytest.fixture
def browser(driver: webdriver.Chrome, web: Web, shots_dir: Path) -> Browser:
    """The module's browser, logged out: each test starts without the token."""
    b = Browser(driver, web, shots_dir)
    b.logout()
    b.forget_documents()
    return b


@pytest.fixture(scope="module")
def run_id(driver: webdriver.Chrome, web: Web, demo: DemoRun) -> str:
    """The demo run's id on the runs list: the one row that is running (the project of the projects
    dir is never started)."""
    b = Browser(driver, web, Path("."))
    b.open("/")

    def running() -> str | None:
        if demo.proc.poll() is not None:
            raise AssertionError(f"the demo run ended early ({demo.proc.returncode}):\n{demo.tail()}")
        rows = [r.get_attribute("data-run") for r in b.all("tr.run")
                if b.js("return arguments[0].querySelector('td.state')?.textContent.trim()", r) == "running"]
        return rows[0] if len(rows) == 1 else None

    found = wait_until(running, timeout=90, interval=0.25, what="one running row on the runs list")
    return str(found)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """tests/conftest.py's guard, except for the module's long-lived processes (the supervised run, the
    web server, chromedriver and their trees, which their fixtures end): a test must still leave no
    process or thread of its own behind."""
    me = psutil.Process(os.getpid())
    before = {p.pid for p in me.children()}
    threads_before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        kids = [p for p in me.children() if p.pid not in before]
        kids = [p for p in kids if _alive(p)]
        extra = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if (not kids and not extra) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in kids:
        p.kill()
    assert not kids, f"test leaked child processes: {[p.cmdline() for p in kids]}"
    assert not extra, f"test leaked threads: {[t.name for t in extra]}"


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SHOTS:
        terminalreporter.section("trainsup web screenshots")
        for path in SHOTS:
            terminalreporter.write_line(str(path))
