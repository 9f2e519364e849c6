"""The API's answers as ``TypedDict``s (plain dicts at run time: index them
with the API's JSON field names, ``op["exit_code"]``). Each class is named
as the schema of the OpenAPI document it mirrors: its required keys are the
schema's required properties, the rest (``total=False``) may be absent or
null. The contract test holds both to the live document."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

Json = Dict[str, Any]


class _Origin(TypedDict):
    surface: str
    channel: Optional[str]
    principal: str


class Origin(_Origin, total=False):
    route: Optional[str]


class _OpView(TypedDict):
    operation_id: str
    run_id: str
    command: List[str]
    command_truncated: bool
    background: bool
    status: str
    killed: bool
    attempt: int
    created_at: str
    duration_sec: float
    timeout_sec: int
    kill_requested: bool
    delivered: bool


class OpView(_OpView, total=False):
    """An operation: ``run_command``'s answer and ``get_operation``'s."""

    exit_code: Optional[int]
    effect: Optional[str]
    live: bool
    container_id: Optional[str]
    pid: Optional[int]
    started_at: Optional[str]
    heartbeat_at: Optional[str]
    finished_at: Optional[str]
    output_tail: Optional[str]
    log_size: Optional[int]
    log_sha256: Optional[str]
    cpu_ms: Optional[int]
    max_rss_kb: Optional[int]
    leftovers_stopped: int
    message: Optional[str]
    report_id: Optional[str]
    output: Optional[str]
    running: Optional[bool]
    next_offset: Optional[int]
    stdin: bool
    tty: bool
    approval: Optional[Json]
    schedule_id: Optional[str]
    node: Optional[str]
    origin: Optional[Origin]


class OpList(TypedDict):
    operations: List[OpView]


class _ReportItem(TypedDict):
    operation_id: str
    command: List[str]
    status: str
    killed: bool
    duration_sec: float
    timeout_sec: int


class ReportItem(_ReportItem, total=False):
    """One resolved op of a report."""

    exit_code: Optional[int]
    effect: Optional[str]
    message: Optional[str]
    output_tail: Optional[str]
    kill_reason: str
    denied_by: str
    leftovers: int


class _RunningItem(TypedDict):
    operation_id: str
    command: List[str]
    running_sec: int
    timeout_sec: int


class RunningItem(_RunningItem, total=False):
    """One op still running when a report was made."""

    awaiting_approval: bool


class _Report(TypedDict):
    run_id: str
    resolved: List[ReportItem]
    running: List[RunningItem]
    notes: List[str]
    text: str


class Report(_Report, total=False):
    """One ``[Background operations report]``; ``report_id`` is ``None``
    when a wait ended with nothing to deliver."""

    report_id: Optional[str]
    more_pending: int


class ReportAck(TypedDict):
    report_id: str
    acked: bool


class _ReportSummary(TypedDict):
    created_at: str
    resolved: int
    text: str


class ReportSummary(_ReportSummary, total=False):
    report_id: Optional[str]
    acked_at: Optional[str]


class ReportList(TypedDict):
    run_id: str
    reports: List[ReportSummary]


class NoteAdded(TypedDict):
    run_id: str
    note_id: int


class _FinishView(TypedDict):
    run_id: str
    operations: List[OpView]


class FinishView(_FinishView, total=False):
    report: Optional[Report]


class _RunCreated(TypedDict):
    run_id: str
    token: str
    chain: List[str]
    state: str
    envelope: Json
    budget: Json
    image: str


class RunCreated(_RunCreated, total=False):
    """``create_run``'s answer: ``token`` acts on this run alone (and on its
    descendants' state)."""

    parent_run_id: Optional[str]
    forked_from: Optional[str]


class ChildView(TypedDict):
    run_id: str
    state: str


class _RunView(TypedDict):
    run_id: str
    state: str
    chain: List[str]
    principal: str
    children: List[ChildView]
    envelope: Json
    budget: Json
    used: Json
    remaining: Json
    created_at: int
    image: str


class RunView(_RunView, total=False):
    parent_run_id: Optional[str]
    state_changed_at: Optional[int]
    summary: Optional[str]
    decided_by: Optional[str]
    node: Optional[str]
    origin: Origin


class _RunSummary(TypedDict):
    run_id: str
    depth: int
    state: str
    live_ops: int
    budget: Json
    created_at: int


class RunSummary(_RunSummary, total=False):
    parent_run_id: Optional[str]


class RunList(TypedDict):
    runs: List[RunSummary]


class RunChangeAnswer(TypedDict):
    run: RunView
    changed: List[str]
    kill_requested: List[str]
    denied: List[str]


class UsageAnswer(TypedDict):
    run_id: str
    seq: int
    recorded: bool
    used: Json
    remaining: Json


class _Event(TypedDict):
    seq: int
    at: int
    kind: str
    data: Any


class Event(_Event, total=False):
    """One event of a run's trace (``kind``: ``tool.started``...)."""

    operation_id: Optional[str]


class EventsPage(TypedDict):
    run_id: str
    events: List[Event]
    next_after: int
    last_seq: int


class ConsoleFrame(TypedDict):
    """One frame of an op's console: ``event`` is ``output`` (``data``:
    ``offset``, ``text``) or, last, ``done`` (``data``: status, exit code)."""

    event: str
    id: Optional[str]
    data: Json


class _StdinAnswer(TypedDict):
    operation_id: str
    output: str
    next_offset: int
    status: str
    bytes_written: int


class StdinAnswer(_StdinAnswer, total=False):
    exit_code: int


class _OutputView(TypedDict):
    operation_id: str
    output: str
    next_offset: int
    running: bool
    status: str


class OutputView(_OutputView, total=False):
    exit_code: int


class _ScheduleView(TypedDict):
    schedule_id: str
    run_id: str
    command: List[str]
    timeout_sec: int
    catch_up: bool
    delete_after_success: bool
    enabled: bool
    paused: bool
    state: str
    when: str
    created_at: str
    source: str


class ScheduleView(_ScheduleView, total=False):
    cron: Optional[str]
    every_sec: Optional[int]
    at: Optional[str]
    next_due_at: Optional[str]
    current_operation_id: Optional[str]
    last_due_at: Optional[str]
    last_operation_id: Optional[str]
    last_status: Optional[str]
    last_exit_code: Optional[int]
    last_output_tail: Optional[str]
    last_finished_at: Optional[str]
    declared_in: Optional[str]


class _ScheduleCreated(TypedDict):
    schedule_id: str
    schedule: ScheduleView


class ScheduleCreated(_ScheduleCreated, total=False):
    next_due_at: Optional[str]


class ScheduleList(TypedDict):
    schedules: List[ScheduleView]


class _ScheduleDeleted(TypedDict):
    schedule_id: str
    deleted: bool


class ScheduleDeleted(_ScheduleDeleted, total=False):
    running_operation_id: Optional[str]


FileEntry = TypedDict(
    "FileEntry", {"name": str, "type": str, "size": int, "mode": str, "modified": int}
)


class FileList(TypedDict):
    path: str
    entries: List[FileEntry]


FileWrittenView = TypedDict("FileWrittenView", {"path": str, "bytes": int, "entries": int})


class FileContent(TypedDict):
    path: str
    size: int
    offset: int
    next_offset: int
    eof: bool
    encoding: str
    content: str


class NetworkView(TypedDict):
    run_id: str
    allow: List[str]
    narrowed: List[str]


SnapshotView = TypedDict("SnapshotView", {"name": str, "bytes": int, "created_at": int})


class SnapshotList(TypedDict):
    snapshots: List[SnapshotView]


#: TypedDict -> the OpenAPI component schema it mirrors
SCHEMAS: Dict[Any, str] = {
    t: t.__name__
    for t in (
        Origin, OpView, OpList, ReportItem, RunningItem, Report, ReportAck, ReportSummary,
        ReportList, NoteAdded, FinishView, RunCreated, ChildView, RunView, RunSummary, RunList,
        RunChangeAnswer, UsageAnswer, Event, EventsPage, StdinAnswer, OutputView, ScheduleView,
        ScheduleCreated, ScheduleList, ScheduleDeleted, FileEntry, FileList, FileWrittenView,
        FileContent, NetworkView, SnapshotView, SnapshotList,
    )
}
