"""`trainsup web` and `trainsup serve --web` as processes: the token line, a page over HTTP, a clean
stop on SIGTERM, and one error line (exit 2) for an address that cannot be used."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.conftest import trainsup_cmd, wait_until

BANNER = re.compile(r"trainsup web: serving (http://127\.0\.0\.1:\d+/) \(token: (\S+);")


def start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str, str]:
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": str(tmp_path),
           "TRAINSUP_PROJECTS": str(tmp_path / "projects"), "TRAINSUP_STATE": str(tmp_path / "state")}
    proc = subprocess.Popen(trainsup_cmd(*args), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    assert proc.stderr is not None
    seen: list[str] = []

    def banner() -> re.Match[str] | None:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        seen.append(line)
        return BANNER.search(line)

    found = wait_until(banner, timeout=30, what="the token line")
    assert isinstance(found, re.Match), seen
    return proc, found.group(1), found.group(2)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return err


def test_web_serves_the_page_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc, url, token = start(["web", "--listen", "127.0.0.1:0"], tmp_path)
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = answer.read().decode()
    assert answer.status == 200 and 'data-page="runs"' in body
    assert (tmp_path / "state" / "web.token").read_text().strip() == token
    assert "trainsup web: stopped" in stop(proc)


def test_serve_hosts_the_page_beside_the_queue(tmp_path: Path) -> None:
    proc, url, _ = start(["serve", "--web", "127.0.0.1:0"], tmp_path)
    with urllib.request.urlopen(url + "queue", timeout=10) as answer:
        assert 'data-page="queue"' in answer.read().decode()
    stop(proc)


def test_an_address_that_cannot_be_used_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for listen, words in ((f"127.0.0.1:{port}", "cannot listen on"), ("nowhere:x", "expected HOST:PORT")):
            done = subprocess.run(trainsup_cmd("web", "--listen", listen, "--state", str(tmp_path / "s")),
                                  capture_output=True, text=True, timeout=30, check=False)
            assert done.returncode == 2
            assert done.stderr.startswith("trainsup web: error: ") and words in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
