"""The review server's Starlette app: the JSON API and the web UI
(docs/guides/review-server.md).

Every store call blocks (SQLite, PostgreSQL): it runs in a worker thread, never on the
event loop. Every answer carries a strict Content-Security-Policy (no inline script, no
other origin): what a trace holds is shown as text and can never run in the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fsm_agent._durable.cancel import NotCancellable, ask_cancel
from fsm_agent._durable.review import InvalidEdit, record
from fsm_agent._durable.store import CancelRequest, StoredRun
from fsm_agent._errors import ReviewError, RunBusy, RunExists, RunNotFound, StoreError
from fsm_agent.server import _runs as views
from fsm_agent.server._auth import Principal, Sessions, authenticate, check_csrf
from fsm_agent.server._broadcast import Broadcaster
from fsm_agent.server._errors import ApiError, error_response
from fsm_agent.server._openapi import OPENAPI

__all__ = ["CSP", "MAX_BODY", "create_app"]

log = logging.getLogger("fsm_agent.server")

#: Concurrent store calls for a store that names no pool size (SQLite, memory).
_SLOTS = 8
#: Request bodies larger than this are refused (413) before they are read whole.
MAX_BODY = 1 << 20
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
_ACTIONS = ("approve", "deny", "edit", "reconcile")
#: SSE line ends (the frames, encoded once, and the response's pings alike)
_SEP = "\r\n"
#: Events per read of a stream
_PAGE = 500
#: Versions of paused runs kept for a decision on them (``_Views``), and the events and
#: history rows they may hold together (a long run's version holds its whole trace)
_VIEWS = 256
_VIEW_ROWS = 200_000


class _Guard:
    """Pure ASGI: the security headers on every answer, and the body size limit (by
    Content-Length up front, and by counting for a chunked body)."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await self._too_large(scope, receive, send_with_headers)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise ApiError(413, "too_large", f"the body is over {self.max_body} bytes")
            return message

        await self.app(scope, counted, send_with_headers)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"the body is over {self.max_body} bytes (Content-Length)"
        response = error_response(413, "too_large", detail, {"connection": "close"})
        await response(scope, receive, send)


def _etag_seq(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip().removeprefix("W/").strip('"')
    if not text.lstrip("-").isdigit():
        raise ApiError(400, "bad_request", f'If-Match must be "SEQ" (a number), got {value[:40]!r}')
    return int(text)


class _Views:
    """The versions of paused runs this server last showed (a bounded LRU), keyed by
    run id and the ``seq`` a page names: a decision sent back with that ``If-Match`` is
    judged on the very version the reviewer saw and written only while the run is
    still at it (``record_review(..., seen=)``: one round trip). Only the server's own
    reads are kept; what a client sends names one, never supplies it."""

    def __init__(self, most: int = _VIEWS, rows: int = _VIEW_ROWS) -> None:
        self.most, self.rows = most, rows
        self._kept: OrderedDict[tuple[str, int], StoredRun] = OrderedDict()
        self._held = 0  # events and history rows of the versions kept

    def keep(self, stored: StoredRun) -> None:
        """Keep ``stored`` if a decision could be made on it (a paused run whose store
        tells versions), dropping the least recently shown past either bound."""
        if stored.head is None or stored.body.get("state") != "review_required":
            return
        at = (stored.run_id, stored.head.seq)
        self.drop(*at)
        self._kept[at] = stored
        self._held += _rows(stored)
        while len(self._kept) > self.most or (self._held > self.rows and len(self._kept) > 1):
            _, gone = self._kept.popitem(last=False)
            self._held -= _rows(gone)

    def drop(self, run_id: str, seq: int) -> None:
        gone = self._kept.pop((run_id, seq), None)
        if gone is not None:
            self._held -= _rows(gone)

    def get(self, run_id: str, seq: int | None) -> StoredRun | None:
        if seq is None:
            return None
        found = self._kept.get((run_id, seq))
        if found is not None:
            self._kept.move_to_end((run_id, seq))
        return found


def _rows(stored: StoredRun) -> int:
    return len(stored.events) + len(stored.messages)


class Server:
    """The routes' shared state: the store, sessions, the watch, the optional runtime."""

    def __init__(
        self, store: Any, runtime: Any, max_body: int, secure_cookies: bool, trace_key: Any
    ) -> None:
        self.store, self.runtime, self.max_body = store, runtime, max_body
        self.trace_key = trace_key
        self.secure_cookies = secure_cookies
        self.sessions = Sessions()
        self.views = _Views()
        self.broadcaster = Broadcaster(store)
        self.broadcaster.on_bump.append(self._prefetch)
        self.worker: asyncio.Task[None] | None = None
        #: reads in flight, shared by the streams that wait for the same one
        self._reads: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
        #: this generation's reads, kept (done or not) until the next one begins
        self._kept: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
        #: how many streams wait at each ``(run_id, seq)`` for the next generation
        self._waiting: dict[tuple[str, int], int] = {}
        # Store calls in flight at most as many as the store has connections: a burst
        # (500 streams opening at once) queues here, on the event loop, instead of in
        # the pool, whose wait times out (a 503 for a request that only had to wait).
        self._slots = asyncio.Semaphore(int(getattr(store, "pool_size", _SLOTS)))

    async def who(self, request: Request, scope: str, csrf: str | None = None) -> Principal:
        """The caller, allowed ``scope``; an unsafe request of a session must carry its
        CSRF token (``csrf``: a form's field, else the ``X-CSRF-Token`` header)."""
        principal = await authenticate(request, self.key_of, self.sessions)
        if request.method not in ("GET", "HEAD"):
            check_csrf(principal, csrf or request.headers.get("x-csrf-token"))
        principal.require(scope)  # type: ignore[arg-type]
        return principal

    async def key_of(self, key_id: str) -> Any:
        """The stored key ``key_id``; requests that ask while a read of it is in flight
        share that read (500 streams opening at once: one read, not 500)."""
        return await self.shared(("key", key_id), self.store.get_key, key_id)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            async with self._slots:
                return await run_in_threadpool(fn, *args, **kwargs)
        except RunNotFound as exc:
            raise ApiError(404, "not_found", str(exc)) from None
        except (RunBusy, RunExists) as exc:
            raise ApiError(409, "conflict", str(exc)) from None
        except StoreError as exc:
            raise ApiError(503, "store_unavailable", str(exc)) from None

    async def read_run(self, run_id: str) -> StoredRun:
        """The stored run, its version kept for a decision on it (``_Views``)."""
        stored: StoredRun = await self.call(self.store.load_run, run_id)
        self.views.keep(stored)
        return stored

    async def shared(self, key: tuple[Any, ...], fn: Callable[..., Any], *args: Any) -> Any:
        """One store read for every request that asks the same thing while it is in
        flight (500 streams opening at once: one key read, not 500)."""
        future = self._reads.get(key)
        if future is None:
            future = asyncio.ensure_future(self.call(fn, *args))
            self._reads[key] = future
            future.add_done_callback(lambda _: self._reads.pop(key, None))
        return await asyncio.shield(future)

    def _kept_read(self, key: tuple[Any, ...], fn: Callable[..., Any], *args: Any) -> Any:
        """The read ``key`` of this generation, started if it is not yet (its result
        is kept until the next generation: a stream that asks after it is done gets
        the same answer, read after the generation began, so nothing committed since
        is missed; that commit's own wake-up comes next)."""
        future = self._kept.get(key)
        if future is None:
            future = asyncio.ensure_future(self.call(fn, *args))
            # retrieved, so an unawaited failure (nobody asked after all) is not logged
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._kept[key] = future
        return future

    async def this_generation(
        self, key: tuple[Any, ...], fn: Callable[..., Any], *args: Any
    ) -> Any:
        """One store read per generation for every stream that asks it (500
        subscribers of one run woken by one commit: one read, not 500). ``key`` names
        the read and ends with the generation it belongs to."""
        future = self._kept_read(key, fn, *args)
        if future.done():  # (most streams: no shield, no extra future each)
            return future.result()
        return await asyncio.shield(future)

    def _prefetch(self, generation: int, runs: frozenset[str] | None) -> None:
        """At a new generation, before any stream wakes: forget the last generation's
        reads and start the ones the waiting streams of its ``runs`` (``None``: of
        every run) will ask for (so the read is under way while 500 streams are being
        woken, not after). The reads of other runs stay: nothing changed for them."""
        if runs is None:
            self._kept.clear()
        else:
            for key in [k for k in self._kept if k[1] in runs]:
                del self._kept[key]
        for run_id, seq in self._waiting:
            if runs is not None and run_id not in runs:
                continue
            key = ("events", run_id, seq, generation)
            self._kept_read(key, _frames, self.store, run_id, seq, _PAGE)

    # ── the JSON API ──────────────────────────────────────────────────────────────

    async def list_runs(self, request: Request) -> Response:
        await self.who(request, "read")
        return JSONResponse(await self.call(views.page_of_runs, self.store, request.query_params))

    async def run(self, request: Request) -> Response:
        await self.who(request, "read")
        stored = await self.read_run(request.path_params["run_id"])
        return JSONResponse(views.detail_of(stored))

    async def events(self, request: Request) -> Response:
        await self.who(request, "read")
        run_id = request.path_params["run_id"]
        after = _after(request)
        if "text/event-stream" in request.headers.get("accept", ""):
            # 404 before streaming (one read for the streams that open at once)
            await self.shared(("exists", run_id), self.store.events_since, run_id, after, 0)
            return EventSourceResponse(self._stream(run_id, after), ping=15, sep=_SEP)
        limit = views._limit(request.query_params.get("limit") or "200")
        events = await self.call(self.store.events_since, run_id, after, limit)
        return JSONResponse({"events": events, "seq": events[-1]["seq"] if events else after})

    async def _stream(self, run_id: str, after: int) -> AsyncIterator[bytes]:
        """Every event after ``after``, then each new one as it is committed; a finished
        run's stream ends after its last event. A wake-up is read from the last sent
        ``seq``, so nothing is sent twice and nothing is skipped. The frames come
        encoded, once per generation for every stream of the run."""
        seq, seen = after, self.broadcaster.generation
        check, finished = True, False  # the state is read after the replay
        while True:
            # (After a finished state: a read of its own, begun after that state read.)
            key = ("final" if finished else "events", run_id, seq, seen)
            frames = await self.this_generation(key, _frames, self.store, run_id, seq, _PAGE)
            if frames.size:
                seq = frames.last_seq
                yield frames.data
            if frames.size == _PAGE:  # more than one page behind: read on at once
                continue
            if finished:  # finished before that read: it found the last events
                return
            # A run ends with ``run_end``, stored with its final state in one save: the
            # state is read then (and once after the replay), not at every commit. It
            # is read after the events: a run that finished in between is read again.
            # Keyed by the seq read up to, so a state read this stream takes from
            # another began after that one had read these events too: never before
            # the ``run_end`` it follows (whose wake-up may not have come yet).
            if check or frames.ends:
                check = False
                stored = await self.this_generation(
                    ("run", run_id, seq, seen), self.store.load_run, run_id
                )
                finished = stored.body.get("state") in views.FINISHED
                if finished:
                    continue
            seen = await self._wait(run_id, seq, seen)

    async def _wait(self, run_id: str, seq: int, seen: int) -> int:
        """The next generation, counted among the streams at ``(run_id, seq)`` while
        waiting (``_prefetch`` starts their read as it begins)."""
        at = (run_id, seq)
        self._waiting[at] = self._waiting.get(at, 0) + 1
        try:
            return await self.broadcaster.wait(seen, run_id=run_id)
        finally:
            left = self._waiting[at] - 1
            if left:
                self._waiting[at] = left
            else:
                del self._waiting[at]

    async def review(self, request: Request) -> Response:
        principal = await self.who(request, "review")
        run_id = request.path_params["run_id"]
        body = await _json_body(request)
        event = await self.decide(run_id, body, principal, request.headers.get("if-match"))
        stored = await self.read_run(run_id)
        return JSONResponse({"review": event, "run": views.detail_of(stored)}, status_code=201)

    async def decide(
        self, run_id: str, body: dict[str, Any], principal: Principal, if_match: str | None
    ) -> dict[str, Any]:
        """Record a review through the run's machine (``durable/review.record``), as the
        key's holder; ``if_match`` (``"SEQ"``): refuse if the run moved on past it. A
        version this server showed at that seq is judged and written in one round trip
        (``_Views``); any other is claimed, read and judged under the claim."""
        principal.require("review")
        call_id, action, arguments = _review_fields(body)
        expected = _etag_seq(if_match)
        seen = self.views.get(run_id, expected)

        def moved_on(events: list[dict[str, Any]]) -> None:
            # Called under the review's claim, before anything is stored: a page that
            # saw an older seq decides nothing.
            if expected is not None and events and int(events[0]["seq"]) - 1 != expected:
                raise ApiError(
                    409,
                    "conflict",
                    f"run {run_id!r} moved on since seq {expected} (now at "
                    f"{int(events[0]['seq']) - 1}); reload and decide again",
                )

        def decide() -> dict[str, Any]:
            try:
                event, _ = record(
                    self.store,
                    run_id,
                    call_id,
                    action,
                    reason=body.get("reason"),
                    result=body.get("result"),
                    arguments=arguments,
                    key=self.trace_key,
                    reviewer=principal.name,
                    note=body.get("note"),
                    machines=getattr(self.runtime, "machines", None),
                    observe=moved_on,
                    seen=seen,
                )
            except InvalidEdit as exc:
                raise ApiError(422, "invalid", str(exc)) from None
            except ReviewError as exc:
                raise ApiError(409, "conflict", str(exc)) from None
            return event

        event: dict[str, Any] = await self.call(decide)
        if expected is not None:  # that version is gone: the next page shows the new one
            self.views.drop(run_id, expected)
        self.broadcaster.poke(frozenset({run_id}))
        return event

    async def cancel(self, request: Request) -> Response:
        principal = await self.who(request, "admin")
        run_id = request.path_params["run_id"]
        note = None
        if await request.body():  # (a body is optional: {"note": "why"})
            note = (await _json_body(request)).get("note")
        requested = await self.stop_run(run_id, principal, note)
        stored = await self.call(self.store.load_run, run_id)
        return JSONResponse({"run": views.detail_of(stored)}, status_code=202 if requested else 200)

    async def stop_run(self, run_id: str, principal: Principal, note: Any = None) -> bool:
        """Cancel ``run_id`` through its machine's ``cancel`` trigger
        (``durable/cancel.py``), as the key's holder (recorded in the ``cancel``
        transition with the time and ``note``): here and now if it waits to be driven,
        else by a cancel request stored for its driver (``True``: requested, the driver
        honours it at its next step); 409 for a run that has ended or waits for review,
        saying why."""
        principal.require("admin")
        if note is not None and (not isinstance(note, str) or not note.strip()):
            raise ApiError(422, "invalid", "note: a non-empty string")

        def stop() -> bool:
            try:
                done = ask_cancel(
                    self.store,
                    run_id,
                    key=self.trace_key,
                    machines=getattr(self.runtime, "machines", None),
                    by=principal.name,
                    note=note,
                )
            except NotCancellable as exc:
                raise ApiError(409, "conflict", str(exc)) from None
            return isinstance(done, CancelRequest)

        requested: bool = await self.call(stop)
        log.info(
            "fsm-agent serve: run %r %s by %r",
            run_id,
            "cancel requested" if requested else "cancelled",
            principal.name,
        )
        self.broadcaster.poke(frozenset({run_id}))
        return requested

    async def submit(self, request: Request) -> Response:
        await self.who(request, "admin")
        if self.runtime is None:
            raise ApiError(
                409, "no_app", "this server drives no runs: start it with --app MODULE:FACTORY"
            )
        body = await _json_body(request)
        task, run_id = body.get("task"), body.get("run_id")
        if not isinstance(task, str) or not task.strip():
            raise ApiError(422, "invalid", "task: a non-empty string is required")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ApiError(422, "invalid", "run_id: a non-empty string")
        new_id = await self.call(self.runtime.submit, task, run_id=run_id)
        self.broadcaster.poke(frozenset({new_id}))
        return JSONResponse({"run_id": new_id}, status_code=202)

    async def trace(self, request: Request) -> Response:
        await self.who(request, "read")
        stored = await self.call(self.store.load_run, request.path_params["run_id"])
        return Response(views.trace_lines(stored), media_type="application/x-ndjson")

    async def diagram(self, request: Request) -> Response:
        await self.who(request, "read")
        stored = await self.call(self.store.load_run, request.path_params["run_id"])
        svg = await self.call(_diagram, stored, self.runtime)
        return Response(svg, media_type="image/svg+xml")

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(OPENAPI)

    # ── the worker (--app) ────────────────────────────────────────────────────────

    async def drive(self) -> None:
        """With ``--app``: continue every run that can go on (submitted, or paused with
        every decision made), on each change and every few seconds."""
        seen = self.broadcaster.generation
        while True:
            try:
                await run_in_threadpool(_drive_ready, self.store, self.runtime)
            except Exception as exc:  # one bad run must not stop the worker
                log.warning("fsm-agent serve: driving runs failed: %s", exc)
            seen = await self.broadcaster.wait(seen, 2.0)


class _Frames(NamedTuple):
    """A read of a stream: its events as SSE frames, encoded once for every stream
    that gets them (not 500 ``json.dumps`` on the event loop) and sent as one chunk."""

    size: int
    last_seq: int
    #: a ``run_end`` is among them (the run may have finished)
    ends: bool
    data: bytes


def _frames(store: Any, run_id: str, seq: int, limit: int) -> _Frames:
    events = store.events_since(run_id, seq, limit)
    chunks = [
        ServerSentEvent(
            json.dumps(event), id=str(event["seq"]), event=str(event["type"]), sep=_SEP
        ).encode()
        for event in events
    ]
    last = int(events[-1]["seq"]) if events else seq
    ends = any(event["type"] == "run_end" for event in events)
    return _Frames(len(events), last, ends, b"".join(chunks))


def _review_fields(body: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
    """A review body's call id, action and (edit) arguments; 422 for what does not fit."""
    call_id, action = body.get("call_id"), body.get("action")
    if not isinstance(call_id, str) or not call_id:
        raise ApiError(422, "invalid", "call_id: a non-empty string is required")
    if action not in _ACTIONS:
        raise ApiError(422, "invalid", f"action must be one of {', '.join(_ACTIONS)}")
    for name in ("note", "reason"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise ApiError(422, "invalid", f"{name}: a string")
    arguments = body.get("arguments")
    if (action == "edit") != isinstance(arguments, dict):
        raise ApiError(
            422,
            "invalid",
            "arguments: edit needs the corrected arguments as a JSON object"
            if action == "edit"
            else f"arguments: only an edit carries arguments, not {action}",
        )
    return call_id, str(action), arguments


def _drive_ready(store: Any, runtime: Any) -> None:
    for summary in store.list_runs():
        ready = summary.state == "deciding" and summary.pending == 0
        if summary.state == "review_required":
            stored = store.load_run(summary.run_id)
            ready = views.detail_of(stored)["label"] == "decided, waiting to be resumed"
        if ready:
            with contextlib.suppress(RunBusy):
                runtime.resume(summary.run_id)


def _diagram(stored: Any, runtime: Any) -> bytes:
    from fsm_agent._core.table import DEFAULT_MACHINE
    from fsm_agent._render.replay import Replay
    from fsm_agent._render.svg import machine_svg
    from fsm_agent._trace.chain import strip_links

    machine = DEFAULT_MACHINE
    head = stored.events[0] if stored.events else {}
    for known in (getattr(runtime, "machines", None) or {}).values():
        if head.get("machine") == known.hash:
            machine = known
    events = strip_links(stored.events)
    try:
        replay = Replay(f"run {stored.run_id}", events, machine=machine)
        overlay = replay.overlay(None) if events else None
        return bytes(machine_svg(overlay, machine=machine))
    except Exception as exc:  # no Graphviz here: say so, as a JSON error
        raise ApiError(503, "no_renderer", f"cannot draw the diagram: {exc}") from None


def _after(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "-1"
    if not text.lstrip("-").isdigit():
        raise ApiError(
            400, "bad_request", f"after / Last-Event-ID must be a seq, got {text[:40]!r}"
        )
    return max(int(text), -1)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "bad_request", "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    return body


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if request.url.path.startswith("/api/") or exc.status == 413:
        return error_response(exc.status, exc.error, exc.detail, exc.headers)
    from fsm_agent.server import _ui as ui

    return ui.error_page(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("fsm-agent serve: %s %s failed", request.method, request.url.path)
    return error_response(500, "internal", f"{type(exc).__name__} (see the server's log)")


def create_app(
    store: Any,
    *,
    runtime: Any = None,
    max_body: int = MAX_BODY,
    secure_cookies: bool = False,
    trace_key: bytes | str | None = None,
) -> ASGIApp:
    """The review server over ``store`` (one with a change feed and keys:
    ``MemoryStore``, ``SqliteStore``, ``PostgresStore``). ``runtime``: the application's
    (``--app``), to submit runs and continue decided ones; without it a decided run
    waits to be resumed elsewhere. ``trace_key``: the runtime's, to append a review to
    a signed trace."""

    from fsm_agent.server import _ui as ui

    server = Server(store, runtime, max_body, secure_cookies, trace_key)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.broadcaster.start()
        if runtime is not None:
            server.worker = asyncio.create_task(server.drive())
        try:
            yield
        finally:
            if server.worker is not None:
                server.worker.cancel()
            server.broadcaster.stop()

    def route(path: str, fn: Callable[[Request], Awaitable[Response]], methods: list[str]) -> Route:
        return Route(path, fn, methods=methods)

    routes = [
        route("/api/runs", server.list_runs, ["GET"]),
        route("/api/runs", server.submit, ["POST"]),
        route("/api/runs/{run_id}", server.run, ["GET"]),
        route("/api/runs/{run_id}/events", server.events, ["GET"]),
        route("/api/runs/{run_id}/reviews", server.review, ["POST"]),
        route("/api/runs/{run_id}/cancel", server.cancel, ["POST"]),
        route("/api/runs/{run_id}/trace", server.trace, ["GET"]),
        route("/api/runs/{run_id}/diagram.svg", server.diagram, ["GET"]),
        route("/openapi.json", server.openapi, ["GET"]),
        *ui.routes(),
    ]

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _crash},
    )
    app.state.server = server
    return _Guard(app, max_body)
