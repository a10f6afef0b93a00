"""The web UI: server-rendered HTML, live through htmx polling of small fragments.

Everything from a run (tool names, arguments, event payloads) is escaped as text, and
the page's Content-Security-Policy allows only this server's own script and style: no
inline script, no ``javascript:`` URL, no eval (htmx's too is turned off), so nothing in
a trace can run in a reviewer's browser. Forms post with the session's CSRF token.
"""

from __future__ import annotations

import json
import secrets
from html import escape
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from fsm_agent.server import _runs as views
from fsm_agent.server._auth import COOKIE, Principal, check_key
from fsm_agent.server._errors import ApiError

__all__ = ["error_page", "routes"]

_SIGNIN = "fsm_signin"
_HTMX_CONFIG = escape(
    json.dumps({"allowEval": False, "allowScriptTags": False, "includeIndicatorStyles": False})
)
_STATIC = {"htmx.min.js": "text/javascript", "app.css": "text/css"}


def _page(title: str, body: str, who: Principal | None = None, status: int = 200) -> HTMLResponse:
    nav = ""
    if who is not None:
        nav = (
            f'<span class="who">{escape(who.name)} ({escape(who.key.scope)})</span>'
            f'<form method="post" action="/signout"><input type="hidden" name="csrf" '
            f'value="{escape(who.csrf or "")}"><button>Sign out</button></form>'
        )
    html = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="htmx-config" content="{_HTMX_CONFIG}">'
        f"<title>{escape(title)} · fsm-agent</title>"
        '<link rel="stylesheet" href="/static/app.css">'
        '<script src="/static/htmx.min.js"></script></head><body>'
        f'<header><a href="/runs"><b>fsm-agent</b></a>{nav}</header><main>{body}</main>'
        "</body></html>"
    )
    return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})


def error_page(exc: ApiError) -> Response:
    if exc.status == 401:
        return RedirectResponse("/signin", status_code=303)
    body = f'<p class="flash error">{escape(exc.detail)}</p><p><a href="/runs">Runs</a></p>'
    return _page(f"{exc.status}", body, status=exc.status)


def _label(text: str) -> str:
    css = {"waiting for review": "label-waiting", "decided, waiting to be resumed": "label-decided"}
    return f'<span class="{css.get(text, "")}">{escape(text)}</span>'


def _runs_table(store: Any, query: Any) -> str:
    page = views.page_of_runs(store, query)
    # Waiting for a person first: that is what a reviewer opens this page for.
    order = {"waiting for review": 0, "decided, waiting to be resumed": 1}
    rows = sorted(page["runs"], key=lambda r: order.get(r["label"], 2))
    out = [
        "<table><thead><tr><th>run</th><th>status</th><th class=opt>pending</th>"
        "<th class=opt>updated</th></tr></thead><tbody>"
    ]
    for r in rows:
        link = "/runs/" + quote(r["run_id"], safe="")
        out.append(
            f'<tr><td><a href="{escape(link)}">{escape(r["run_id"])}</a></td>'
            f"<td>{_label(r['label'])}</td><td class=opt>{r['pending']}</td>"
            f"<td class=opt>{_when(r['updated'])}</td></tr>"
        )
    if not rows:
        out.append("<tr><td colspan=4>no runs</td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _when(stamp: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(stamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _events_list(events: list[dict[str, Any]]) -> str:
    rows = []
    for e in events[-200:]:
        shown = {k: v for k, v in e.items() if k not in ("run", "chain")}
        seq, kind = shown.pop("seq", ""), shown.pop("type", "")
        text = json.dumps(shown, ensure_ascii=False)
        text = text if len(text) <= 400 else text[:400] + " …"
        rows.append(f"<li><b>{escape(str(seq))} {escape(str(kind))}</b> {escape(text)}</li>")
    return f'<ul class="events">{"".join(rows)}</ul>'


def _calls(run: dict[str, Any], csrf: str, may_review: bool) -> str:
    if not run["pending"]:
        return ""
    out = ["<h2>Pending calls</h2>"]
    action = escape("/runs/" + quote(run["run_id"], safe="") + "/review")
    for call in run["pending"]:
        args = call["arguments"]
        shown = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        out.append(
            f'<div class="call"><b>{escape(str(call["tool"]))}</b> · call '
            f"<code>{escape(call['call_id'])}</code> · waiting for "
            f"{escape(str(call['waiting_for']))}<pre>{escape(shown)}</pre>"
            f"<div>digest <code>{escape(str(call['digest']))}</code></div>"
        )
        if call["review"]:
            decided = call["review"]
            by = f" by {decided.get('reviewer')}" if decided.get("reviewer") else ""
            edited = decided.get("arguments")
            shown_edit = "" if edited is None else " with " + json.dumps(edited, ensure_ascii=False)
            out.append(
                f"<p>decided: {escape(str(decided.get('action')))}{escape(by)}"
                f"{escape(shown_edit)}</p>"
            )
        elif may_review:
            hidden = (
                f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
                f'<input type="hidden" name="seq" value="{run["seq"]}">'
                f'<input type="hidden" name="call_id" value="{escape(call["call_id"])}">'
            )
            note = '<input type="text" name="note" placeholder="note (optional)">'
            if call["waiting_for"] == "outcome_unknown":
                out.append(
                    f'<form method="post" action="{action}">{hidden}'
                    '<input type="hidden" name="action" value="reconcile">'
                    '<textarea name="result" placeholder="the observed result (JSON)"></textarea>'
                    f"{note}<button>Reconcile</button></form>"
                )
            else:
                out.append(
                    f'<form method="post" action="{action}">{hidden}{note}'
                    '<input type="hidden" name="action" value="approve">'
                    '<button class="approve">Approve</button></form>'
                    f'<form method="post" action="{action}">{hidden}'
                    '<input type="hidden" name="action" value="deny">'
                    '<input type="text" name="reason" placeholder="why not">'
                    '<button class="deny">Deny</button></form>'
                    f'<form method="post" action="{action}" class="edit">{hidden}'
                    '<input type="hidden" name="action" value="edit">'
                    "<label>or approve with corrected arguments (checked against the "
                    "tool's schema)<br>"
                    f'<textarea name="arguments" rows="4">{escape(_pretty(args))}</textarea>'
                    "</label>"
                    f'{note}<button class="edit">Approve with these arguments</button></form>'
                )
        out.append("</div>")
    return "".join(out)


def _cancel_form(run: dict[str, Any], csrf: str) -> str:
    """The cancel button of a run that has not ended and has no cancel asked of it yet
    (the server says why it cannot when the run waits for review)."""
    if run["status"] in views.FINISHED or run.get("cancel_requested"):
        return ""
    action = escape("/runs/" + quote(run["run_id"], safe="") + "/cancel")
    return (
        f'<form method="post" action="{action}" class="cancel">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        '<input name="note" maxlength="500" placeholder="why (recorded in the trace)">'
        '<button class="cancel">Cancel this run</button></form>'
    )


def _pretty(arguments: Any) -> str:
    """The call's arguments as indented JSON to edit (as they came if not JSON)."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
        return json.dumps(value, ensure_ascii=False, indent=2)
    except (TypeError, ValueError):
        return str(arguments)


def _server(request: Request) -> Any:
    """The app's ``Server`` (``app.py``; not imported here: it imports this module)."""
    return request.app.state.server


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


async def signin_form(request: Request, message: str = "", status: int = 200) -> Response:
    server = _server(request)
    token = secrets.token_urlsafe(24)
    flash = f'<p class="flash error">{escape(message)}</p>' if message else ""
    body = (
        f"<h1>Sign in</h1>{flash}<form method=post action=/signin>"
        f'<input type="hidden" name="csrf" value="{token}">'
        '<label>API key<br><input type="password" name="key" autocomplete="off"></label>'
        "<p><button>Sign in</button></p></form>"
        "<p>Make a key with <code>fsm-agent keys add NAME --scope review --db …</code></p>"
    )
    response = _page("Sign in", body, status=status)
    response.set_cookie(
        _SIGNIN, token, httponly=True, samesite="strict", secure=server.secure_cookies
    )
    return response


async def signin(request: Request) -> Response:
    server = _server(request)
    form = await request.form()
    sent, expected = str(form.get("csrf") or ""), request.cookies.get(_SIGNIN) or ""
    if not expected or not secrets.compare_digest(sent, expected):
        return await signin_form(request, "the sign-in form expired; try again", 403)
    try:
        record = await check_key(server.key_of, str(form.get("key") or ""))
    except ApiError as exc:
        return await signin_form(request, exc.detail, 401)
    session, _ = server.sessions.open(record.key_id)
    response = RedirectResponse("/runs", status_code=303)
    response.set_cookie(
        COOKIE, session, httponly=True, samesite="strict", secure=server.secure_cookies,
        max_age=8 * 3600,
    )  # fmt: skip
    response.delete_cookie(_SIGNIN)
    return response


async def signout(request: Request) -> Response:
    server = _server(request)
    form = await request.form()
    principal = await server.who(request, "read", str(form.get("csrf") or ""))
    if principal.session:
        server.sessions.close(principal.session)
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(COOKIE)
    return response


async def runs_page(request: Request) -> Response:
    server = _server(request)
    principal = await server.who(request, "read")
    table = await server.call(_runs_table, server.store, request.query_params)
    body = (
        f'<h1>Runs</h1><div id="runs" hx-get="/runs/fragment" hx-trigger="every 2s">{table}</div>'
    )
    return _page("Runs", body, principal)


async def runs_fragment(request: Request) -> Response:
    server = _server(request)
    await server.who(request, "read")
    return HTMLResponse(await server.call(_runs_table, server.store, request.query_params))


async def run_page(request: Request) -> Response:
    server = _server(request)
    principal = await server.who(request, "read")
    run_id = request.path_params["run_id"]
    stored = await server.read_run(run_id)
    run = views.detail_of(stored)
    link = "/runs/" + quote(run_id, safe="")
    flash = request.query_params.get("msg")
    error = request.query_params.get("error")
    notes = "".join(
        f'<p class="flash{" error" if kind == "error" else ""}">{escape(text)}</p>'
        for kind, text in (("msg", flash), ("error", error))
        if text
    )
    body = (
        f"<h1>Run {escape(run_id)}</h1>{notes}"
        f"{_calls(run, principal.csrf or '', principal.key.allows('review'))}"
        f"{_cancel_form(run, principal.csrf or '') if principal.key.allows('admin') else ''}"
        f'<div id="live" hx-get="{escape(link)}/live" hx-trigger="every 1s">'
        f"{_live(run, stored.events, link)}</div>"
    )
    return _page(f"Run {run_id}", body, principal)


async def run_live(request: Request) -> Response:
    server = _server(request)
    await server.who(request, "read")
    run_id = request.path_params["run_id"]
    stored = await server.call(server.store.load_run, run_id)
    link = "/runs/" + quote(run_id, safe="")
    return HTMLResponse(_live(views.detail_of(stored), stored.events, link))


async def run_review(request: Request) -> Response:
    server = _server(request)
    form = await request.form()
    principal = await server.who(request, "read", str(form.get("csrf") or ""))
    principal.require("review")
    run_id = request.path_params["run_id"]
    link = "/runs/" + quote(run_id, safe="")
    fields: dict[str, Any] = {
        k: str(form[k]) for k in ("call_id", "action", "note", "reason") if form.get(k)
    }
    if form.get("result"):
        try:
            fields["result"] = json.loads(str(form["result"]))
        except ValueError:
            fields["result"] = str(form["result"])
    if form.get("arguments") is not None:
        try:
            fields["arguments"] = json.loads(str(form["arguments"]))
        except ValueError as exc:
            detail = f"the edited arguments are not valid JSON: {exc}; nothing was recorded"
            return RedirectResponse(f"{link}?{urlencode({'error': detail})}", 303)
    try:
        await server.decide(run_id, fields, principal, str(form.get("seq") or "") or None)
    except ApiError as exc:
        if exc.status in (401, 403):
            raise
        return RedirectResponse(f"{link}?{urlencode({'error': exc.detail})}", 303)
    done = f"recorded {fields.get('action')} of {fields.get('call_id')}"
    return RedirectResponse(f"{link}?{urlencode({'msg': done})}", status_code=303)


async def run_cancel(request: Request) -> Response:
    server = _server(request)
    form = await request.form()
    principal = await server.who(request, "read", str(form.get("csrf") or ""))
    principal.require("admin")
    run_id = request.path_params["run_id"]
    link = "/runs/" + quote(run_id, safe="")
    try:
        requested = await server.stop_run(
            run_id, principal, str(form.get("note") or "").strip() or None
        )
    except ApiError as exc:
        if exc.status in (401, 403):
            raise
        return RedirectResponse(f"{link}?{urlencode({'error': exc.detail})}", 303)
    done = (
        "cancel requested: its driver stops the run at its next step"
        if requested
        else "cancelled the run"
    )
    return RedirectResponse(f"{link}?{urlencode({'msg': done})}", 303)


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _STATIC:  # a fixed set: no path from the request reaches the disk
        raise ApiError(404, "not_found", f"no static file {name[:60]!r}")
    data = resources.files("fsm_agent.server").joinpath("static").joinpath(name).read_bytes()
    return Response(data, media_type=_STATIC[name], headers={"cache-control": "max-age=3600"})


def routes() -> list[Route]:
    return [
        Route("/", home, methods=["GET"]),
        Route("/signin", signin_form, methods=["GET"]),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/runs", runs_page, methods=["GET"]),
        Route("/runs/fragment", runs_fragment, methods=["GET"]),
        Route("/runs/{run_id}", run_page, methods=["GET"]),
        Route("/runs/{run_id}/live", run_live, methods=["GET"]),
        Route("/runs/{run_id}/review", run_review, methods=["POST"]),
        Route("/runs/{run_id}/cancel", run_cancel, methods=["POST"]),
        Route("/static/{name}", static, methods=["GET"]),
    ]


def _asked(run: dict[str, Any]) -> str:
    """A cancel asked of a run that has not ended yet: its driver stops it at its next
    step (the live status then turns to cancelled)."""
    asked = run.get("cancel_requested")
    if not asked or run["status"] in views.FINISHED:
        return ""
    by = f" by {escape(asked['by'])}" if asked.get("by") else ""
    return f' · <span class="label-asked">cancel requested{by} at {escape(asked["at"])}</span>'


def _live(run: dict[str, Any], events: list[dict[str, Any]], link: str) -> str:
    return (
        f"<p>status: {_label(run['label'])}{_asked(run)} · seq {run['seq']} · "
        f"{run['events']} events</p>"
        f'<div class="grid"><div class="diagram"><img alt="the machine and this run\'s path" '
        f'src="/api{escape(link)}/diagram.svg?seq={run["seq"]}"></div>'
        f"<div><h2>Events</h2>{_events_list(events)}</div></div>"
    )
