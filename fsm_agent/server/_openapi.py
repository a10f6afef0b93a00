"""The API's OpenAPI 3.1 document (served at ``/openapi.json``; a copy is committed as
``docs/reference/openapi.json`` and a test keeps the two equal)."""

from __future__ import annotations

from typing import Any

from fsm_agent._version import __version__

__all__ = ["OPENAPI"]


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


_RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
_COMMON = {"401": _error("no key, a wrong or a revoked key"), "404": _error("no such run")}
_JSON = "application/json"


def _ok(description: str, schema: dict[str, Any], media: str = _JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "fsm-agent review server",
        "version": __version__,
        "description": "Runs, their live events and their reviews. Every call needs "
        "`Authorization: Bearer KEY` (`fsm-agent keys add`).",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error", "detail"],
                "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
            },
            "RunSummary": {
                "type": "object",
                "properties": {
                    "run_id": {"type": "string"},
                    "status": {"type": "string"},
                    "reason": {"type": "string"},
                    "label": {"type": "string"},
                    "pending": {"type": "integer"},
                    "created": {"type": "number"},
                    "updated": {"type": "number"},
                },
            },
            "PendingCall": {
                "type": "object",
                "properties": {
                    "call_id": {"type": "string"},
                    "tool": {"type": ["string", "null"]},
                    "arguments": {},
                    "digest": {"type": ["string", "null"]},
                    "waiting_for": {"type": ["string", "null"]},
                    "review": {"type": ["object", "null"]},
                },
            },
            "Run": {
                "type": "object",
                "properties": {
                    "run_id": {"type": "string"},
                    "status": {"type": "string"},
                    "reason": {"type": "string"},
                    "label": {"type": "string"},
                    "seq": {"type": "integer", "description": "the last event's seq"},
                    "events": {"type": "integer"},
                    "pending": {
                        "type": "array",
                        "items": {"$ref": "#/components/schemas/PendingCall"},
                    },
                },
            },
            "Review": {
                "type": "object",
                "required": ["call_id", "action"],
                "properties": {
                    "call_id": {"type": "string"},
                    "action": {"enum": ["approve", "deny", "edit", "reconcile"]},
                    "reason": {"type": "string", "description": "deny: what the model is told"},
                    "result": {"description": "reconcile: the result observed outside"},
                    "arguments": {
                        "type": "object",
                        "description": "edit: the corrected arguments the call runs with "
                        "(validated against the tool's schema; their own digest)",
                    },
                    "note": {"type": "string"},
                },
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/api/runs": {
            "get": {
                "summary": "runs, newest first (scope read)",
                "parameters": [
                    {"name": n, "in": "query", "schema": {"type": t}}
                    for n, t in (
                        ("status", "string"),
                        ("reason", "string"),
                        ("limit", "integer"),
                        ("cursor", "string"),
                    )
                ],
                "responses": {
                    "200": _ok(
                        "a page of runs; next_cursor is null on the last",
                        {
                            "type": "object",
                            "properties": {
                                "runs": {
                                    "type": "array",
                                    "items": {"$ref": "#/components/schemas/RunSummary"},
                                },
                                "next_cursor": {"type": ["string", "null"]},
                            },
                        },
                    ),
                    "400": _error("a bad limit or cursor"),
                    "401": _COMMON["401"],
                },
            },
            "post": {
                "summary": "submit a run (scope admin; the server needs --app)",
                "requestBody": {
                    "content": {
                        _JSON: {
                            "schema": {
                                "type": "object",
                                "required": ["task"],
                                "properties": {
                                    "task": {"type": "string"},
                                    "run_id": {"type": "string"},
                                },
                            }
                        }
                    }
                },
                "responses": {
                    "202": _ok("submitted; the server drives it", {"type": "object"}),
                    "409": _error("no --app, or the run id is taken"),
                    **_COMMON,
                },
            },
        },
        "/api/runs/{run_id}": {
            "get": {
                "summary": "the run with its pending calls (scope read)",
                "parameters": [_RUN_ID],
                "responses": {
                    "200": _ok("the run", {"$ref": "#/components/schemas/Run"}),
                    **_COMMON,
                },
            }
        },
        "/api/runs/{run_id}/events": {
            "get": {
                "summary": "events after a seq; with Accept: text/event-stream a live SSE "
                "stream (id = seq, event = type; Last-Event-ID resumes)",
                "parameters": [
                    _RUN_ID,
                    {"name": "after", "in": "query", "schema": {"type": "integer"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {
                    "200": {
                        "description": "the events (JSON), or the stream",
                        "content": {_JSON: {"schema": {"type": "object"}}, "text/event-stream": {}},
                    },
                    **_COMMON,
                },
            }
        },
        "/api/runs/{run_id}/reviews": {
            "post": {
                "summary": "decide a pending call (scope review); the key's name is the reviewer",
                "parameters": [
                    _RUN_ID,
                    {
                        "name": "If-Match",
                        "in": "header",
                        "schema": {"type": "string"},
                        "description": '"SEQ": refuse (409) if the run moved on past it',
                    },
                ],
                "requestBody": {
                    "content": {_JSON: {"schema": {"$ref": "#/components/schemas/Review"}}}
                },
                "responses": {
                    "201": _ok("recorded: the review event and the run", {"type": "object"}),
                    "403": _error("the key's scope does not allow reviews"),
                    "409": _error("the run moved on, or the call was decided already"),
                    "422": _error(
                        "a bad call_id, action or field, or edited arguments the tool's "
                        "schema refuses"
                    ),
                    **_COMMON,
                },
            }
        },
        "/api/runs/{run_id}/cancel": {
            "post": {
                "summary": "cancel a run (scope admin) through the machine's cancel trigger: "
                "every open call answered, run_end written; the cancel transition records "
                "the key's holder (by), the time (at) and the note. A run waiting to be "
                "driven is cancelled at once (200); a run a driver holds, or one stopped "
                "mid-batch, gets a cancel request its driver honours at its next step (202, "
                "the request in the run's cancel_requested; asking again changes nothing)",
                "parameters": [_RUN_ID],
                "requestBody": {
                    "required": False,
                    "content": {
                        _JSON: {
                            "schema": {
                                "type": "object",
                                "properties": {"note": {"type": "string", "minLength": 1}},
                            }
                        }
                    },
                },
                "responses": {
                    "200": _ok("cancelled: the run", {"type": "object"}),
                    "202": _ok(
                        "cancel requested: the run, with cancel_requested {by, at, note}",
                        {"type": "object"},
                    ),
                    "403": _error("the key's scope does not allow cancelling (admin)"),
                    "422": _error("a note that is not a non-empty string"),
                    "409": _error(
                        "the run has ended or waits for review (the detail says which and "
                        "what to do)"
                    ),
                    **_COMMON,
                },
            }
        },
        "/api/runs/{run_id}/trace": {
            "get": {
                "summary": "the run's JSONL trace (it passes fsm-agent check)",
                "parameters": [_RUN_ID],
                "responses": {
                    "200": {"description": "JSON lines", "content": {"application/x-ndjson": {}}},
                    **_COMMON,
                },
            }
        },
        "/api/runs/{run_id}/diagram.svg": {
            "get": {
                "summary": "the machine with the run's path and current state",
                "parameters": [_RUN_ID],
                "responses": {
                    "200": {"description": "SVG", "content": {"image/svg+xml": {}}},
                    **_COMMON,
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document",
                "security": [],
                "responses": {"200": {"description": "OpenAPI"}},
            }
        },
    },
}
