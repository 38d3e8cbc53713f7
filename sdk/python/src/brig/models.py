"""What the daemon answers, as plain dataclasses (the raw JSON is kept in ``raw``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class SandboxInfo:
    """A session as the daemon lists it."""

    sandbox_id: str
    state: str
    image: Optional[str]
    snapshot: Optional[str]
    created_at: str
    expires_at: Optional[str]
    metadata: Dict[str, str]
    network: Dict[str, Any]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "SandboxInfo":
        return cls(
            sandbox_id=j["session_id"],
            state=j.get("state", ""),
            image=j.get("image"),
            snapshot=j.get("snapshot"),
            created_at=j.get("created_at", ""),
            expires_at=j.get("expires_at"),
            metadata=j.get("metadata") or {},
            network=j.get("network") or {},
            raw=j,
        )


@dataclass
class CommandResult:
    """A finished command. A non-zero ``exit_code`` is not raised: check ``ok``."""

    exit_code: Optional[int]
    stdout: str
    stderr: str
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    duration_ms: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_json(cls, j: Dict[str, Any], stdout: str = "", stderr: str = "") -> "CommandResult":
        return cls(
            exit_code=j.get("exit_code"),
            stdout=j.get("stdout", stdout),
            stderr=j.get("stderr", stderr),
            signal=j.get("signal"),
            timed_out=bool(j.get("timed_out", False)),
            oom_killed=bool(j.get("oom_killed", False)),
            duration_ms=j.get("duration_ms"),
        )


@dataclass
class ProcessInfo:
    """A background process."""

    pid: int
    argv: List[str]
    state: str
    exit_code: Optional[int]
    signal: Optional[int]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "ProcessInfo":
        return cls(
            pid=j["process_id"],
            argv=j.get("argv") or [],
            state=j.get("state", ""),
            exit_code=j.get("exit_code"),
            signal=j.get("signal"),
            raw=j,
        )


@dataclass
class EntryInfo:
    """A directory entry."""

    name: str
    path: str
    kind: str  # "file" | "directory" | "symlink" | "other"
    size: int
    mode: int
    modified_at: Optional[str]

    @property
    def is_dir(self) -> bool:
        return self.kind == "directory"


@dataclass
class WriteInfo:
    path: str
    size: int


@dataclass
class Result:
    """A rich result of ``run_code``: a MIME bundle."""

    data: Dict[str, Any]
    is_main_result: bool = False

    def __getitem__(self, mime: str) -> Any:
        return self.data[mime]

    def formats(self) -> List[str]:
        return list(self.data)

    @property
    def text(self) -> Optional[str]:
        return self.data.get("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self.data.get("text/markdown")

    @property
    def png(self) -> Optional[str]:
        """Base64, as sent."""
        return self.data.get("image/png")

    @property
    def jpeg(self) -> Optional[str]:
        return self.data.get("image/jpeg")

    @property
    def svg(self) -> Optional[str]:
        return self.data.get("image/svg+xml")

    @property
    def latex(self) -> Optional[str]:
        return self.data.get("text/latex")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def chart(self) -> Optional[Dict[str, Any]]:
        """A matplotlib figure described: axes, labels and their elements."""
        return self.data.get("application/vnd.brig.chart+json")


@dataclass
class ExecutionError:
    """An exception raised by the code (``KernelDied``: the kernel itself ended)."""

    name: str
    value: str
    traceback: str


@dataclass
class Logs:
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """What one ``run_code`` call gave."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    context_id: Optional[str] = None
    timed_out: bool = False
    duration_ms: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The main result's ``text/plain``."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def stdout(self) -> str:
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        return "".join(self.logs.stderr)


@dataclass
class Context:
    """An interpreter context: its own globals and working directory."""

    id: str
    cwd: Optional[str]
    execution_count: int = 0

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "Context":
        return cls(id=j["id"], cwd=j.get("cwd"), execution_count=j.get("execution_count", 0))


@dataclass
class Snapshot:
    """A snapshot of a sandbox; ``Sandbox.create(snapshot=...)`` forks from it."""

    snapshot_id: str
    name: Optional[str]
    sandbox_id: str
    created_at: str
    size_bytes: Optional[int]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "Snapshot":
        return cls(
            snapshot_id=j["snapshot_id"],
            name=j.get("name"),
            sandbox_id=j.get("session_id", ""),
            created_at=j.get("created_at", ""),
            size_bytes=j.get("size_bytes"),
            raw=j,
        )
