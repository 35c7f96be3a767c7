"""A refused request: its HTTP status and the OpenAI error object's fields."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError"]


class ApiError(Exception):
    """A refused request: its HTTP status and the OpenAI error object's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
