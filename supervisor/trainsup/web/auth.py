"""Owns who may do what on the page: the token, the login cookie, CSRF and the Host check.

- The token is ``STATE/web.token`` (0600 in a 0700 directory), made once from ``secrets`` and
  reused, so a bookmark or a script keeps working across restarts. It is printed at start.
- Reading the page needs nothing on a loopback address (whoever can reach it is on this machine
  already); on any other address every page needs the token. Every action (stop, queue edits)
  needs it everywhere.
- Logging in (``/login``) puts the token in an ``HttpOnly``, ``SameSite=Strict`` cookie. An action
  must also carry a ``csrf`` form field derived from the token (HMAC), which a page of another site
  cannot read, and its ``Origin``, when the browser sends one, must be this server.
- The ``Host`` header must name this server by the address it listens on or, on loopback, by
  ``localhost``: a DNS-rebinding page that makes a browser call us ``evil.example`` gets 421.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

TOKEN_FILE = "web.token"
COOKIE = "trainsup_token"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class TokenError(OSError):
    """The token file cannot be made or read."""


def load_token(state: Path) -> tuple[str, Path]:
    """The page's token and its file, made on first use."""
    path = state / TOKEN_FILE
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            token = ""
        if len(token) < 16:
            token = secrets.token_urlsafe(24)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(token + "\n")
        os.chmod(path, 0o600)  # an older or hand-made file may be readable by others
    except OSError as exc:
        raise TokenError(f"cannot keep the page's token in {path}: {exc.strerror or exc}") from None
    return token, path


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Guard:
    """The checks every request goes through (see the module's docstring)."""

    def __init__(self, token: str, host: str, port: int) -> None:
        self.token = token
        self.host, self.port = host, port
        self.loopback = is_loopback(host)
        self.csrf = hmac.new(token.encode(), b"trainsup web csrf", hashlib.sha256).hexdigest()
        self.session_key = hmac.new(token.encode(), b"trainsup web session", hashlib.sha256).digest()

    def token_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.token.encode())

    def logged_in(self, cookies: Mapping[str, str]) -> bool:
        return self.token_ok(cookies.get(COOKIE))

    def may_read(self, cookies: Mapping[str, str]) -> bool:
        return self.loopback or self.logged_in(cookies)

    def host_ok(self, host_header: str | None) -> bool:
        """Whether the request's Host names this server (DNS rebinding is refused)."""
        if not host_header:
            return False
        name = urlsplit(f"//{host_header}").hostname or ""
        if self.loopback:
            return name in LOOPBACK_NAMES or is_loopback(name)
        if self.host in ("0.0.0.0", "::"):
            return True  # every address of the box: the token guards every page there
        return name == self.host.strip("[]") or name == self.host

    def action_problem(self, cookies: Mapping[str, str], form_csrf: str | None, origin: str | None,
                       host_header: str | None) -> str | None:
        """Why an action is refused, or None."""
        if not self.logged_in(cookies):
            return "this action needs the token (log in with it first)"
        if not form_csrf or not hmac.compare_digest(form_csrf.encode(), self.csrf.encode()):
            return "the form is stale or came from another site (no valid csrf field): reload the page"
        if origin and urlsplit(origin).netloc != (host_header or ""):  # "null" (a sandboxed page) too
            return f"the request came from another site ({origin})"
        return None
