"""The review server (``fsm-agent serve``): an authenticated JSON API over a run store,
a live change feed as server-sent events, and the review actions of the CLI over HTTP.

Starlette and uvicorn are the ``server`` extra (``pip install 'fsm-agent[server]'``);
this package imports them only when an app is built. See docs/guides/review-server.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def create_app(store: Any, **options: Any) -> Any:
    """The Starlette app serving ``store`` (see :func:`fsm_agent.server._app.create_app`)."""
    from fsm_agent.server._app import create_app as build

    return build(store, **options)
