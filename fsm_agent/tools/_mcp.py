"""Tools of a Model Context Protocol server, registered into a :class:`ToolRegistry`.

The registering caller stays the authority (R4 of docs/concepts/rules.md): it confirms every tool's
effect (``read`` or ``write``). A server's ``readOnlyHint`` is the server describing
itself, so it only *seeds* :func:`suggested_effects`, which the caller reviews and
passes back. Each tool keeps the server's ``inputSchema``, closed against unknown
fields like every other tool, and our strict validation runs before the server sees
anything: MCP servers typically coerce ``"3"`` to ``3`` and drop unknown keys, which
would let a malformed call execute as a different one.

MCP calls are async, so drive these tools with ``await runtime.arun(...)`` (or register
them through :class:`McpBridge` for the synchronous ``runtime.run``)::

    async with stdio_client(sys.executable, "server.py") as client:
        tools = ToolRegistry()
        infos = await list_mcp_tools(client)
        effects = suggested_effects(infos)          # review this: it is the server's claim
        await register_mcp_tools(tools, client, effects=effects)
        result = await Runtime(model=..., tools=tools, allowed_tools=...).arun("...")

A result with ``isError`` is ambiguous: MCP uses it both for "the tool ran and failed"
and for "the server refused the arguments before acting". From a ``write`` tool it may
have taken effect, so by default it stops the run for review (``outcome_unknown``);
``rejected_on_error`` lets the registrar say otherwise, for named tools or by a predicate
of ``(tool name, error text)`` (e.g. a server's own argument-validation wording). Our
schema checks (types, unknown fields, the formats in
:data:`~fsm_agent.tools._registry.CHECKED_FORMATS`) run first, so arguments a server would
refuse for those reasons never reach it.

Tool results: text as text, structured content as data, images (and image resources) as
:class:`~fsm_agent._core.content.Image`, audio and blob resources as
:class:`~fsm_agent._core.content.File`, so each model API gets them natively.

Tools whose ``execution.taskSupport`` is ``required`` can only run as MCP tasks, which
the client does not do: registering one is refused with a message saying so. A server
that cannot start raises :class:`McpServerStartError` naming the command and its stderr.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import re
import tempfile
import threading
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from typing import IO, Any, TypeVar

try:
    import mcp
    from mcp.client.stdio import stdio_client as _stdio_transport
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("MCP tools need the mcp SDK: pip install 'fsm-agent[mcp]'") from exc

from fsm_agent._core.content import IMAGE_TYPES, File, Image
from fsm_agent._errors import ConfigError, McpServerStartError, McpToolError, ToolRejected
from fsm_agent.tools._registry import Effect, Tool, ToolRegistry

__all__ = [
    "McpBridge",
    "McpServerStartError",
    "McpStdioClient",
    "McpToolError",
    "McpToolInfo",
    "list_mcp_tools",
    "register_mcp_tools",
    "stdio_client",
    "suggested_effects",
]

T = TypeVar("T")

#: What OpenAI and Anthropic accept as a function / tool name.
_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: JSON-RPC errors that mean the server refused the request before running anything.
_REFUSED = (INVALID_PARAMS, METHOD_NOT_FOUND)
_MAX_PAGES = 100


@dataclass(frozen=True)
class McpToolInfo:
    """What a server says about one of its tools (hints are claims, not permissions)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None
    destructive_hint: bool | None
    idempotent_hint: bool | None
    task_support: str | None = None  # execution.taskSupport: forbidden | optional | required


class McpStdioClient(mcp.Client):
    """An MCP client of a server it starts itself: its stderr is kept, so that a server
    that cannot start raises one :class:`McpServerStartError` naming the command and the
    end of its stderr, not a bare ``ExceptionGroup``."""

    command: str = ""
    stderr_file: IO[str] | None = None

    async def __aenter__(self) -> McpStdioClient:
        try:
            await super().__aenter__()
        except Exception as exc:
            raise McpServerStartError(self.command, _cause(exc), self.stderr_text()) from exc
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await super().__aexit__(*exc)
        except Exception as group:
            # The SDK's task groups wrap what the ``async with`` body raised in an
            # ExceptionGroup: give the caller its own exception back.
            if exc[1] is not None and _leaf(group) is exc[1]:
                raise exc[1] from None
            raise
        finally:
            if self.stderr_file is not None:
                self.stderr_file.close()

    def stderr_text(self) -> str:
        """What the server wrote to stderr so far."""
        f = self.stderr_file
        if f is None or f.closed:
            return ""
        f.flush()
        f.seek(0)
        return f.read()


def _leaf(exc: BaseException) -> BaseException:
    """The innermost error of (nested, single) exception groups: what actually went wrong."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (3.11+, or anyio's backport)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def _cause(exc: BaseException) -> str:
    leaf = _leaf(exc)
    return f"{type(leaf).__name__}: {leaf}"


def stdio_client(
    command: str, *args: str, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> McpStdioClient:
    """An MCP client that starts ``command args...`` and talks to it over stdio
    (use it as ``async with``)."""
    params = mcp.StdioServerParameters(
        command=command, args=list(args), env=dict(env) if env is not None else None, cwd=cwd
    )
    # Closed by the client when it exits: it outlives this function.
    errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115
    client = McpStdioClient(_stdio_transport(params, errlog=errlog))
    client.command = " ".join([command, *args])
    client.stderr_file = errlog
    return client


async def list_mcp_tools(client: mcp.Client) -> list[McpToolInfo]:
    """Every tool the server lists (all pages)."""
    infos: list[McpToolInfo] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        for t in page.tools:
            hints = t.annotations
            execution = getattr(t, "execution", None)
            infos.append(
                McpToolInfo(
                    name=t.name,
                    description=t.description or "",
                    input_schema=dict(t.input_schema)
                    if isinstance(t.input_schema, Mapping)
                    else t.input_schema.model_dump(by_alias=True, exclude_none=True),
                    read_only_hint=getattr(hints, "read_only_hint", None),
                    destructive_hint=getattr(hints, "destructive_hint", None),
                    idempotent_hint=getattr(hints, "idempotent_hint", None),
                    task_support=getattr(execution, "task_support", None),
                )
            )
        cursor = page.next_cursor
        if cursor is None:
            break
    return infos


def suggested_effects(infos: Collection[McpToolInfo]) -> dict[str, Effect]:
    """A starting point for ``effects``: ``read`` where the server hints read-only, else
    ``write`` (the safe default: a write is never retried blindly)."""
    return {i.name: "read" if i.read_only_hint is True else "write" for i in infos}


def _media(block: Any) -> Any:
    """An image, audio or embedded-resource content block as Image/File, else ``None``."""
    kind = getattr(block, "type", None)
    resource = getattr(block, "resource", None) if kind == "resource" else None
    data = getattr(resource if resource is not None else block, "data", None)
    if resource is not None:
        data = getattr(resource, "blob", None)
    mime = getattr(resource if resource is not None else block, "mime_type", None)
    if kind not in ("image", "audio", "resource") or not isinstance(data, str) or not mime:
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    if mime in IMAGE_TYPES:
        return Image(raw, mime)
    name = str(getattr(resource, "uri", "") or "").rsplit("/", 1)[-1] or None
    try:
        return File(raw, mime, name)
    except ValueError:  # a media type we cannot name: keep the block as data
        return None


def _value(result: Any) -> Any:
    """A tool result as data for the model: structured content if any, else the text;
    images and files as Image/File values (each API sends them natively)."""
    blocks = list(result.content)
    media = [_media(b) for b in blocks]
    if result.structured_content is not None and not any(media):
        return result.structured_content
    if blocks and all(getattr(b, "type", None) == "text" for b in blocks):
        return "\n".join(b.text for b in blocks)
    return [
        m if m is not None else b.model_dump(mode="json", by_alias=True, exclude_none=True)
        for b, m in zip(blocks, media, strict=True)
    ]


def _error_text(result: Any) -> str:
    texts = [b.text for b in result.content if getattr(b, "type", None) == "text"]
    return "; ".join(texts)[:500] or "the server reported an error without text"


RejectedOnError = Collection[str] | Callable[[str, str], bool]


def _caller(
    client: mcp.Client, name: str, remote: str, rejects: Callable[[str, str], bool]
) -> Callable[..., Any]:
    async def call(**arguments: Any) -> Any:
        try:
            result = await client.call_tool(remote, arguments)
        except MCPError as exc:
            if exc.code in _REFUSED:
                raise ToolRejected(f"MCP server refused {remote!r}: {exc.error.message}") from exc
            raise
        if result.is_error:
            detail = _error_text(result)
            text = f"MCP tool {remote!r} failed: {detail}"
            raise ToolRejected(text) if rejects(remote, detail) else McpToolError(text)
        return _value(result)

    call.__name__ = name
    return call


async def register_mcp_tools(
    registry: ToolRegistry, client: mcp.Client, **options: Any
) -> list[Tool]:
    """Register the server's tools as async tools (for ``Runtime.arun``).

    Options: ``effects`` (required: every registered tool's confirmed effect), ``only``,
    ``prefix``, ``requires_approval``, ``idempotency_keys``, ``rejected_on_error``,
    ``timeout_s`` (see :func:`_register`).
    """
    return await _register(registry, client, None, **options)


async def _register(
    registry: ToolRegistry,
    client: mcp.Client,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None,
    *,
    effects: Mapping[str, Effect],
    only: Collection[str] | None = None,
    prefix: str = "",
    requires_approval: Collection[str] = (),
    idempotency_keys: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
    rejected_on_error: RejectedOnError = (),
    timeout_s: float | None = None,
) -> list[Tool]:
    """Register the server's tools (or ``only`` those) as ``prefix + name``.

    ``effects`` must name every registered tool: the caller's confirmation, not the
    server's hint. ``requires_approval`` and ``idempotency_keys`` are keyed by the
    server's tool names. ``rejected_on_error`` says which ``isError`` results are
    definite rejections (nothing happened): a collection of tool names, or a function
    ``(tool name, error text) -> bool``; every other ``isError`` of a write tool stops
    the run as ``outcome_unknown`` (the safe default). Raises ``ConfigError`` for a tool
    without a confirmed effect, a name the server does not list, a schema we cannot
    enforce, or a tool that can only run as an MCP task.
    """
    infos = await list_mcp_tools(client)
    listed = {i.name: i for i in infos}
    wanted = list(listed) if only is None else list(only)
    keys = dict(idempotency_keys or {})
    rejects = _rejects(rejected_on_error)
    by_name = set() if callable(rejected_on_error) else set(rejected_on_error)
    named = set(effects) | set(requires_approval) | set(keys) | by_name | set(wanted)
    _check_selection(listed, wanted, named, effects, prefix)
    tools = []
    for name in wanted:
        info = listed[name]
        fn = _caller(client, prefix + name, name, rejects)
        tools.append(
            registry.register(
                fn if wrap is None else wrap(fn),
                name=prefix + name,
                schema=info.input_schema,
                effect=effects[name],
                description=info.description,
                requires_approval=name in requires_approval,
                idempotency_key=keys.get(name),
                timeout_s=timeout_s,
            )
        )
    return tools


def _check_selection(
    listed: Mapping[str, McpToolInfo],
    wanted: list[str],
    named: set[str],
    effects: Mapping[str, Effect],
    prefix: str,
) -> None:
    """``ConfigError`` unless every named tool is listed by the server, every wanted one
    has a confirmed effect, a name model APIs accept, and can run without MCP tasks."""
    unknown = sorted(named - set(listed))
    if unknown:
        raise ConfigError(
            f"the MCP server does not list {', '.join(unknown)} "
            f"(it lists: {', '.join(listed) or 'nothing'})"
        )
    unconfirmed = [n for n in wanted if n not in effects]
    if unconfirmed:
        hints = ", ".join(f"{n} (server hints {_hint(listed[n])})" for n in unconfirmed)
        raise ConfigError(
            f"confirm the effect of every MCP tool: no effect given for {hints}; "
            f"suggested_effects(...) gives a starting point to review"
        )
    bad = [prefix + n for n in wanted if not _FUNCTION_NAME.match(prefix + n)]
    if bad:
        raise ConfigError(
            f"not valid tool names for model APIs ({_FUNCTION_NAME.pattern}): "
            f"{', '.join(bad)}; leave them out with only=, or pick another prefix"
        )
    tasks = [n for n in wanted if listed[n].task_support == "required"]
    if tasks:
        raise ConfigError(
            f"MCP tools {', '.join(tasks)} can only run as MCP tasks (execution.taskSupport "
            f"'required'), which this client does not support; leave them out with only="
        )


def _rejects(option: RejectedOnError) -> Callable[[str, str], bool]:
    if callable(option):
        return option
    if isinstance(option, str):
        raise ConfigError("rejected_on_error takes tool names or a function, not one string")
    names = frozenset(option)
    return lambda name, _text: name in names


def _hint(info: McpToolInfo) -> str:
    if info.read_only_hint is True:
        return "read-only"
    if info.read_only_hint is False:
        return "destructive" if info.destructive_hint is not False else "not read-only"
    return "nothing"


class McpBridge:
    """An MCP client kept on a private event-loop thread, so that the synchronous
    ``Runtime.run`` can call its tools::

        with McpBridge(stdio_client(sys.executable, "server.py")) as server:
            server.register(tools, effects={"get_stock": "read"})
            result = runtime.run("...")

    The client is entered and left by one long-lived task (its task groups require
    that); each tool call runs as its own task on that loop, and the calling thread
    waits for it.
    """

    def __init__(self, client: mcp.Client, *, startup_timeout_s: float = 30.0) -> None:
        self.client = client
        self.startup_timeout_s = startup_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._main: concurrent.futures.Future[None] | None = None

    def __enter__(self) -> McpBridge:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="fsm-agent-mcp"
        )
        self._thread.start()
        self._main = asyncio.run_coroutine_threadsafe(self._hold(), self._loop)
        try:
            self._ready.result(timeout=self.startup_timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _hold(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self.client:
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the bridge's loop and wait for its result."""
        if self._loop is None or self._main is None or self._main.done():
            coro.close()
            raise RuntimeError("the MCP bridge is not open (use it as 'with McpBridge(...)')")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def list_tools(self) -> list[McpToolInfo]:
        return self.run(list_mcp_tools(self.client))

    def register(self, registry: ToolRegistry, **options: Any) -> list[Tool]:
        """:func:`register_mcp_tools`, registering blocking tools (for ``Runtime.run``)."""
        return self.run(_register(registry, self.client, self._blocking, **options))

    def _blocking(self, fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        def call(**arguments: Any) -> Any:
            return self.run(fn(**arguments))

        call.__name__ = fn.__name__
        return call

    def close(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            with contextlib.suppress(BaseException):  # its failure was reported on entry
                self._main.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = None
