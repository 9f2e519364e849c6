"""Python client of opkernel, the container sandbox operation kernel for AI
agents: ``Client`` (sync) and ``AsyncClient`` (async) over its HTTP API,
``ApiError`` for its error answers, and the report text helpers."""

from ._errors import ApiError, OpkernelError, TransportError
from ._routes import ROUTES
from .aio import AsyncClient
from .client import Client
from .reports import format_report, parse_report, parts_of

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "OpkernelError",
    "ROUTES",
    "TransportError",
    "format_report",
    "parse_report",
    "parts_of",
    "__version__",
]
