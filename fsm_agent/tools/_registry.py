"""Tools and their registry.

Whoever registers a tool declares what it is: its JSON Schema, its effect (``read`` or
``write``), whether it needs approval, how its idempotency key is derived, whether the
downstream system deduplicates, and its timeout. None of that can come from a model's
arguments (R4 of docs/concepts/rules.md).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from fsm_agent._core.formats import CHECKED_FORMATS, FORMATS
from fsm_agent._errors import ConfigError

__all__ = ["CHECKED_FORMATS", "Tool", "ToolRegistry", "translate_nullable"]


Effect = Literal["read", "write"]
F = TypeVar("F", bound=Callable[..., Any])

# Keywords that already say what an object schema does with fields it does not list.
_OPEN_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` where every object schema that is silent about extra fields
    refuses them (``additionalProperties: false``)."""
    if isinstance(schema, list):
        return [close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: close_objects(v) for k, v in schema.items()}
    is_object = (
        out.get("type") == "object"
        or (isinstance(out.get("type"), list) and "object" in out["type"])
        or "properties" in out
    )
    if is_object and not any(k in out for k in _OPEN_KEYWORDS):
        out["additionalProperties"] = False
    return out


def translate_nullable(schema: Any) -> Any:
    """A copy of ``schema`` where OpenAPI's ``nullable: true`` (seen in real MCP tool
    schemas, and ignored by JSON Schema) says what it means: ``null`` is accepted too.

    ``{"type": "string", "nullable": true}`` becomes ``{"type": ["string", "null"]}`` (an
    ``enum`` gains ``None``); a typeless schema (a ``$ref``, a combinator) becomes
    ``{"anyOf": [<it>, {"type": "null"}]}``. ``nullable: false`` is dropped.
    """
    if isinstance(schema, list):
        return [translate_nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: translate_nullable(v) for k, v in schema.items()}
    if not isinstance(out.get("nullable"), bool):
        return out
    nullable = out.pop("nullable")
    if not nullable:
        return out
    kind = out.get("type")
    if isinstance(kind, str):
        out["type"] = [kind, "null"] if kind != "null" else "null"
    elif isinstance(kind, list):
        out["type"] = kind if "null" in kind else [*kind, "null"]
    else:
        return {"anyOf": [out, {"type": "null"}]}
    if isinstance(out.get("enum"), list) and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    return out


@dataclass(frozen=True, eq=False)
class Tool:
    """A registered tool. Build it through :meth:`ToolRegistry.tool` or ``register``."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    effect: Effect
    description: str = ""
    requires_approval: bool = False
    idempotency_key: Callable[[dict[str, Any]], Any] | None = None
    dedup: bool = False
    timeout_s: float | None = None
    validator: Draft202012Validator = field(repr=False, default=None)  # type: ignore

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def spec(self) -> dict[str, Any]:
        """The Chat Completions tool spec handed to a model."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema,
            },
        }


class ToolRegistry:
    """The tools a runtime may offer; ``allowed_tools`` picks among them per runtime."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def tool(
        self,
        *,
        schema: dict[str, Any],
        effect: Effect,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        idempotency_key: Callable[[dict[str, Any]], Any] | None = None,
        dedup: bool = False,
        timeout_s: float | None = None,
        allow_extra_fields: bool = False,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`register`; the function is returned unchanged."""

        def decorate(fn: F) -> F:
            self.register(
                fn,
                schema=schema,
                effect=effect,
                name=name,
                description=description,
                requires_approval=requires_approval,
                idempotency_key=idempotency_key,
                dedup=dedup,
                timeout_s=timeout_s,
                allow_extra_fields=allow_extra_fields,
            )
            return fn

        return decorate

    def register(  # noqa: C901 - one independent check per registration option
        self,
        fn: Callable[..., Any],
        *,
        schema: dict[str, Any],
        effect: Effect,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        idempotency_key: Callable[[dict[str, Any]], Any] | None = None,
        dedup: bool = False,
        timeout_s: float | None = None,
        allow_extra_fields: bool = False,
    ) -> Tool:
        """Register ``fn`` (sync or async, called with the validated arguments as keywords).

        ``schema`` is the JSON Schema (Draft 2020-12) of the arguments object. Object
        schemas that do not say otherwise are closed (unknown fields refused) unless
        ``allow_extra_fields=True``; the formats in :data:`CHECKED_FORMATS` are checked;
        OpenAPI's ``nullable`` is translated (:func:`translate_nullable`). ``dedup=True``
        declares that the downstream system deduplicates by the idempotency key, which
        makes a transient write failure retryable. Raises ``ValueError`` for anything inconsistent.
        """
        tool_name = name or getattr(fn, "__name__", "")
        where = f"tool {tool_name!r}"
        if not isinstance(tool_name, str) or not tool_name:
            raise ConfigError("a tool needs a non-empty name (pass name=...)")
        if tool_name in self._tools:
            raise ConfigError(f"{where} is already registered")
        if not callable(fn):
            raise ConfigError(f"{where}: {fn!r} is not callable")
        if effect not in ("read", "write"):
            raise ConfigError(f"{where}: effect must be 'read' or 'write', got {effect!r}")
        if not isinstance(schema, dict):
            raise ConfigError(f"{where}: schema must be a JSON Schema object (a dict)")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            path = "/".join(str(p) for p in exc.path) or "(root)"
            raise ConfigError(
                f"{where}: schema is not valid JSON Schema at {path}: {exc.message}"
            ) from None
        if schema.get("type", "object") != "object":
            raise ConfigError(f"{where}: the arguments schema must have type 'object'")
        if idempotency_key is not None and not callable(idempotency_key):
            raise ConfigError(f"{where}: idempotency_key must be a function of the arguments")
        if idempotency_key is not None and effect != "write":
            raise ConfigError(f"{where}: only write tools take an idempotency key")
        if dedup and idempotency_key is None:
            raise ConfigError(f"{where}: dedup=True needs an idempotency_key to dedupe by")
        if requires_approval and effect != "write":
            raise ConfigError(f"{where}: requires_approval is for write tools")
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not timeout_s > 0
        ):
            raise ConfigError(f"{where}: timeout_s must be a number > 0, got {timeout_s!r}")
        final = translate_nullable(
            copy.deepcopy(schema) if allow_extra_fields else close_objects(schema)
        )
        tool = Tool(
            name=tool_name,
            fn=fn,
            schema=final,
            effect=effect,
            description=description if description is not None else inspect.getdoc(fn) or "",
            requires_approval=requires_approval,
            idempotency_key=idempotency_key,
            dedup=dedup,
            timeout_s=timeout_s,
            validator=Draft202012Validator(final, format_checker=FORMATS),
        )
        self._tools[tool_name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def lookup(self) -> Callable[[str], Tool | None]:
        """:meth:`get` as the registry's own dict's method, for a run's hot path (its
        admission and its driver look a tool up once a call each): no Python call per
        lookup, and it sees tools registered later (the dict is never replaced)."""
        return self._tools.get

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)
