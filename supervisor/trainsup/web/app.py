"""Owns the page's routes: what each URL shows, and the actions (stop, queue edits) behind the token.

Pages are rendered on the server (Jinja2, autoescaped); each has live parts (``data-live``) that
``static/page.js`` replaces from a fragment URL every second, so nothing reloads. Actions are POST
forms, checked by ``auth.Guard``; each does what the command line's verb does, through the same code
(``commands.stop``, ``commands.queue``), and answers with the page and a one-line message.

Every error is a page with one line, never a traceback: a missing run dir or a broken journal line
is shown as such, and an unexpected exception is one ``trainsup web: error: ...`` line on stderr.
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from flask import (
    Flask,
    Response,
    abort,
    flash,
    get_flashed_messages,
    redirect,
    render_template,
    request,
    send_file,
)
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from ..commands.queue import entry_times, run_queue, stop_entry
from ..commands.stop import run_stop
from ..service.queuestore import ENDED, QueueError, QueueStore, counts, queued_positions
from .auth import COOKIE, Guard
from .files import IMAGE_TYPES, Refused, safe_file
from .runs import Catalog, detail, row, sample_roots

REFRESH_MS = 1000
_SENT = re.compile(r"SIGTERM sent to pid (\d+)")


def create_app(catalog: Catalog, guard: Guard, store: QueueStore, env: Mapping[str, str]) -> Flask:
    app = Flask(__name__)
    app.config.update(MAX_CONTENT_LENGTH=64 * 1024, TEMPLATES_AUTO_RELOAD=False,
                      SESSION_COOKIE_SAMESITE="Strict", SESSION_COOKIE_NAME="trainsup_flash")
    app.secret_key = guard.session_key  # signs the one-line message an action leaves for the next page

    def said(message: str, to: str) -> BaseResponse:
        flash(message[:300])
        return redirect(to, code=303)

    def page(template: str, status: int = 200, **context: Any) -> BaseResponse:
        if "flash" not in context:  # a live part never takes the message meant for the page after an action
            shown = [] if template.endswith("_part.html") else get_flashed_messages()
            context["flash"] = " ".join(str(m) for m in shown) or None
        body = render_template(template, guard=guard, logged_in=guard.logged_in(request.cookies),
                               refresh_ms=REFRESH_MS, **context)
        return Response(body, status=status, mimetype="text/html")

    def refused(why: str, status: int = 403) -> BaseResponse:
        return page("message.html", status=status, flash=why, title="Refused")

    @app.before_request
    def _gate() -> BaseResponse | None:
        if not guard.host_ok(request.headers.get("Host")):
            return Response("trainsup web: this server answers only to its own address\n", status=421,
                            mimetype="text/plain")
        if request.endpoint in ("login", "static") or guard.may_read(request.cookies):
            return None
        return redirect(f"/login?next={request.path}")

    @app.after_request
    def _headers(response: Response) -> BaseResponse:
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on the page's own
        # form posts, which the CSRF check must refuse
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self'; "
                                    "style-src 'self'; script-src 'self'; frame-ancestors 'none'")
        if request.method == "GET" and request.path.startswith("/part/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def action_refusal() -> BaseResponse | None:
        problem = guard.action_problem(request.cookies, request.form.get("csrf"), request.headers.get("Origin"),
                                       request.headers.get("Host"))
        return None if problem is None else refused(f"Refused: {problem}")

    # --- the runs list ---------------------------------------------------------------------------
    @app.get("/")
    def runs_page() -> BaseResponse:
        return page("runs.html", rows=[row(catalog, r) for r in catalog.runs()], title="Runs")

    @app.get("/part/runs")
    def runs_part() -> BaseResponse:
        return page("runs_part.html", rows=[row(catalog, r) for r in catalog.runs()])

    # --- one run -----------------------------------------------------------------------------------
    @app.get("/run/<rid>")
    def run_page(rid: str) -> BaseResponse:
        run = catalog.get(rid)
        if run is None:
            return page("message.html", status=404, flash="No such run (it is no longer known here)",
                        title="No such run")
        shown = detail(catalog, run)
        return page("run.html", d=shown, title=shown.row.view.name)

    @app.get("/part/run/<rid>")
    def run_part(rid: str) -> BaseResponse:
        run = catalog.get(rid)
        if run is None:
            return page("message.html", status=404, flash="No such run", title="No such run")
        return page("run_part.html", d=detail(catalog, run))

    @app.get("/run/<rid>/file/<path:rel>")
    def run_file(rid: str, rel: str) -> BaseResponse:
        run = catalog.get(rid)
        if run is None:
            abort(404)
        try:
            path = safe_file(sample_roots(run, catalog.records_of(run)), rel)
        except Refused as exc:
            return Response(f"trainsup web: {exc}\n", status=exc.status, mimetype="text/plain")
        mime = IMAGE_TYPES.get(path.suffix.lower(), "text/plain; charset=utf-8")
        return send_file(path, mimetype=mime, max_age=0, conditional=True)

    @app.post("/run/<rid>/stop")
    def run_stop_action(rid: str) -> BaseResponse:
        if (no := action_refusal()) is not None:
            return no
        run = catalog.get(rid)
        if run is None or run.ref.run_dir is None:
            return refused("No such run", 404)
        err = io.StringIO()
        if run.entry is not None and run.entry.state not in ENDED:
            code = stop_entry(store, run.entry, timeout=0, out=io.StringIO(), err=err)
        else:
            code = run_stop(str(run.ref.run_dir), timeout=0, env=env, out=io.StringIO(), err=err)
        return said(_stop_words(code, err.getvalue()), f"/run/{rid}")

    # --- the queue ---------------------------------------------------------------------------------
    def queue_context() -> dict[str, Any]:
        try:
            entries = store.entries() if store.exists() else []
            paused = store.paused()
        except OSError as exc:
            return {"entries": [], "places": {}, "paused": False, "counts": {},
                    "problem": f"cannot read the queue in {store.root}: {exc.strerror or exc}"}
        now = time.time()
        return {"entries": entries, "places": queued_positions(entries), "paused": paused,
                "counts": counts(entries), "problem": None, "root": store.root,
                "times": {e.id: entry_times(e, now) for e in entries},  # started, ended, took (as queue list)
                "ids": {e.id: r.id for r in catalog.runs() if (e := r.entry) is not None}}

    @app.get("/queue")
    def queue_page() -> BaseResponse:
        return page("queue.html", title="Queue", **queue_context())

    @app.get("/part/queue")
    def queue_part() -> BaseResponse:
        return page("queue_part.html", **queue_context())

    @app.post("/queue/<verb>")
    @app.post("/queue/<eid>/<verb>")
    def queue_action(verb: str, eid: str | None = None) -> BaseResponse:
        if (no := action_refusal()) is not None:
            return no
        err, out = io.StringIO(), io.StringIO()
        if verb == "stop" and eid is not None:
            entry = store.find(eid) if store.exists() else None
            if entry is None:
                return refused(f"No queue entry {eid}", 404)
            code = stop_entry(store, entry, timeout=0, out=out, err=err)
            return said(_stop_words(code, err.getvalue()), "/queue")
        if (eid is None) != (verb in ("add", "pause", "resume")) or verb not in ("add", "move", "remove", "pause",
                                                                                 "resume"):
            abort(404)  # an entry's verb names its entry; the queue's verbs name none
        to = request.form.get("to")
        if verb == "move" and not (to or "").strip().isdigit():
            return said("move: give the new position as a number (1 is next)", "/queue")
        project = (request.form.get("project") or "").strip()
        if verb == "add" and not project:
            return said("add: give a project name or the path of a project file", "/queue")
        try:
            code = run_queue(verb, state=store.root, env=env, out=out, err=err, project=project or None,
                             entry_id=eid, to=int(to) if to and to.strip().isdigit() else None)
        except (QueueError, OSError) as exc:
            code, err = 2, io.StringIO(str(exc))
        told = (out.getvalue().strip() if verb == "add" and code == 0 else "") or _last_line(err.getvalue())
        return said(f"queued as {told}" if verb == "add" and code == 0 else told or f"{verb}: done", "/queue")

    # --- the token ---------------------------------------------------------------------------------
    @app.route("/login", methods=["GET", "POST"])
    def login() -> BaseResponse:
        target = request.values.get("next") or "/"
        if not target.startswith("/") or target.startswith("//"):
            target = "/"  # only this server's own pages
        if request.method == "POST":
            if not guard.token_ok(request.form.get("token")):
                return page("login.html", status=403, next=target, flash="That is not the token: it is in "
                            "STATE/web.token, and trainsup web printed it at start", title="Log in")
            response = redirect(target, code=303)
            response.set_cookie(COOKIE, guard.token, httponly=True, samesite="Strict", path="/",
                                secure=False, max_age=30 * 86400)
            return response
        return page("login.html", next=target, title="Log in")

    @app.post("/logout")
    def logout() -> BaseResponse:
        response = redirect("/", code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> BaseResponse:
        return page("message.html", status=exc.code or 500, flash=exc.description, title=exc.name)

    @app.errorhandler(Exception)
    def _error(exc: Exception) -> BaseResponse:
        print(f"trainsup web: error: {request.method} {request.path}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return page("message.html", status=500, flash=f"Something went wrong on the server: "
                    f"{type(exc).__name__}: {exc}", title="Error")

    return app


def _stop_words(code: int, err: str) -> str:
    sent = _SENT.search(err)
    if sent:
        return (f"stop requested: SIGTERM sent to its supervisor (pid {sent.group(1)}), which stops the trainer "
                "and records the end")
    return _last_line(err) or ("stopped" if code == 0 else f"stop: exit {code}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    for prefix in ("trainsup stop: ", "trainsup queue: "):
        last = last.removeprefix(prefix)
    return last


