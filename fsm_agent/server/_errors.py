"""The server's one error shape: ``{"error": CODE, "detail": WHY}`` with its status."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

__all__ = ["ApiError", "error_response"]


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str, headers: Any = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers


def error_response(status: int, error: str, detail: str, headers: Any = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)
