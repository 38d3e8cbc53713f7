"""brig: Python client for brig sandboxes.

from brig import Sandbox

with Sandbox.create() as sbx:
    sbx.run_code("x = 41")
    print(sbx.run_code("x + 1").text)  # 42
"""

from .async_sandbox import AsyncCommandHandle, AsyncSandbox
from .errors import (
    AuthenticationError,
    BrigError,
    CapacityError,
    ConflictError,
    FilesystemError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    TimeoutError,
)
from .models import (
    CommandResult,
    Context,
    EntryInfo,
    Execution,
    ExecutionError,
    ProcessInfo,
    Result,
    SandboxInfo,
    Snapshot,
    WriteInfo,
)
from .sandbox import CommandHandle, Sandbox

__version__ = "0.1.0"

__all__ = [
    "Sandbox",
    "AsyncSandbox",
    "CommandHandle",
    "AsyncCommandHandle",
    "CommandResult",
    "Context",
    "EntryInfo",
    "Execution",
    "ExecutionError",
    "ProcessInfo",
    "Result",
    "SandboxInfo",
    "Snapshot",
    "WriteInfo",
    "BrigError",
    "AuthenticationError",
    "NotFoundError",
    "InvalidRequestError",
    "ConflictError",
    "FilesystemError",
    "CapacityError",
    "TimeoutError",
    "InternalError",
]
