"""``opkernel.AsyncClient``: the same methods as ``Client``, awaitable
(streams are async iterators), over ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable, List, Mapping, Optional, Sequence, Union

import httpx

from . import _calls as c
from ._core import (
    CA,
    Call,
    api_error,
    backoff,
    base_headers,
    decode,
    exhausted,
    retry_delay_for_answer,
    retry_delay_for_error,
    settings,
    timeout_for,
    tls_verify,
)
from ._sse import SseDecoder, SseEvent, console_frame, run_event
from .types import (
    ConsoleFrame,
    Event,
    EventsPage,
    FileContent,
    FileList,
    FileWrittenView,
    FinishView,
    Json,
    NetworkView,
    NoteAdded,
    OpList,
    OpView,
    OutputView,
    Report,
    ReportAck,
    ReportList,
    RunChangeAnswer,
    RunCreated,
    RunList,
    RunView,
    ScheduleCreated,
    ScheduleDeleted,
    ScheduleList,
    ScheduleView,
    SnapshotList,
    SnapshotView,
    StdinAnswer,
    UsageAnswer,
)

Body = Union[bytes, bytearray, memoryview, Iterable[bytes], AsyncIterator[bytes]]


class AsyncClient:
    """The asynchronous twin of ``opkernel.Client``: same constructor, same
    methods (each awaitable; ``events_stream`` and ``console`` are async
    iterators), same retries and ``Idempotency-Key`` rule."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        ca: CA = None,
        timeout: float = 30.0,
        max_retries: int = 4,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.url, self.token = settings(url, token)
        self.timeout = timeout
        self.max_retries = max_retries
        self._verify = tls_verify(ca)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=base_headers(self.token),
            verify=self._verify,
            transport=transport,
        )

    def with_token(self, token: str) -> "AsyncClient":
        """A client of the same kernel acting with another token (a run's)."""
        return AsyncClient(
            self.url, token, ca=self._verify, timeout=self.timeout, max_retries=self.max_retries
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # sending

    async def _open(
        self, call: Call, stream: bool, headers: Optional[Mapping[str, str]] = None
    ) -> httpx.Response:
        attempt = 0
        while True:
            request = self._http.build_request(
                call.method,
                call.url_path(),
                params=call.query or None,
                json=call.json,
                content=call.content,
                headers={**call.all_headers(), **(headers or {})},
                timeout=timeout_for(call, self.timeout),
            )
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                attempt += 1
                delay = retry_delay_for_error(call, error, attempt)
                if delay is None or attempt > self.max_retries:
                    raise exhausted(call, error, attempt) from error
                await asyncio.sleep(delay)
                continue
            if response.status_code < 400:
                return response
            await response.aread()
            await response.aclose()
            delay = retry_delay_for_answer(call, response)
            if delay is None or attempt >= self.max_retries:
                raise api_error(call, response)
            attempt += 1
            await asyncio.sleep(delay)

    async def _send(self, call: Call) -> Any:
        return decode(call, await self._open(call, stream=False))

    async def _sse(self, call: Call) -> AsyncIterator[SseEvent]:
        """The stream's events; a connection lost mid-stream is resumed
        from the last event id (``Last-Event-ID``)."""
        last_id: Optional[str] = None
        failures = 0
        while True:
            resume = {} if last_id is None else {"Last-Event-ID": last_id}
            response = await self._open(call, stream=True, headers=resume)
            decoder = SseDecoder()
            try:
                async for line in response.aiter_lines():
                    event = decoder.feed(line)
                    if event is not None:
                        failures, last_id = 0, event.id or last_id
                        yield event
                return
            except httpx.TransportError as error:
                failures += 1
                if failures > self.max_retries:
                    raise exhausted(call, error, failures) from error
                await asyncio.sleep(backoff(failures))
            finally:
                await response.aclose()

    # the kernel

    async def health(self) -> Json:
        return await self._send(c.get("health"))

    async def whoami(self) -> Json:
        return await self._send(c.get("whoami"))

    async def tools(self) -> Json:
        """The tools' JSON schemas, for function calling."""
        return await self._send(c.get("tools"))

    async def openapi(self) -> Json:
        return await self._send(c.get("openapi"))

    async def metrics(self) -> str:
        return await self._send(c.get("metrics", answer="text"))

    async def list_images(self) -> Json:
        return await self._send(c.get("list_images"))

    # runs and their tokens

    async def create_run(
        self,
        run_id: str,
        *,
        envelope: Optional[Mapping[str, Any]] = None,
        budget: Optional[Mapping[str, Any]] = None,
        image: Optional[str] = None,
        fork_from: Optional[str] = None,
        consistent: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> RunCreated:
        """A top-level run (operator token) or a child of the token's run
        (run token); the answer's ``token`` acts on the new run."""
        call = c.create_run(
            run_id, envelope, budget, image, fork_from, consistent, idempotency_key
        )
        return await self._send(call)

    async def list_runs(self, limit: Optional[int] = None) -> RunList:
        return await self._send(c.list_runs(limit))

    async def get_run(self, run_id: str) -> RunView:
        return await self._send(c.get("get_run", run=run_id))

    async def pause_run(self, run_id: str) -> RunChangeAnswer:
        return await self._send(c.post("pause_run", safe=True, run=run_id))

    async def resume_run(self, run_id: str) -> RunChangeAnswer:
        return await self._send(c.post("resume_run", safe=True, run=run_id))

    async def cancel_run(self, run_id: str) -> RunChangeAnswer:
        return await self._send(c.post("cancel_run", safe=True, run=run_id))

    async def complete_run(self, run_id: str, summary: str) -> RunChangeAnswer:
        return await self._send(c.complete_run(run_id, summary))

    async def record_usage(
        self,
        run_id: str,
        model: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_micros: int = 0,
        *,
        idempotency_key: Optional[str] = None,
    ) -> UsageAnswer:
        call = c.record_usage(
            run_id, model, input_tokens, output_tokens, cost_micros, idempotency_key
        )
        return await self._send(call)

    async def change_network(self, run_id: str, allow: Sequence[str]) -> NetworkView:
        return await self._send(c.post("change_network", {"allow": list(allow)}, run=run_id))

    async def make_snapshot(self, run_id: str, name: str, consistent: bool = False) -> SnapshotView:
        return await self._send(c.make_snapshot(run_id, name, consistent))

    async def list_snapshots(self, run_id: str) -> SnapshotList:
        return await self._send(c.get("list_snapshots", run=run_id))

    # events, reports, notes, finish

    async def get_events(
        self,
        run_id: str,
        after: int = 0,
        wait_sec: int = 0,
        limit: Optional[int] = None,
        tail: Optional[int] = None,
    ) -> EventsPage:
        """One page of the run's events after ``after`` (long poll)."""
        return await self._send(c.get_events(run_id, after, wait_sec, limit, tail))

    async def events_stream(
        self, run_id: str, after: int = 0, idle_sec: Optional[int] = None
    ) -> AsyncIterator[Event]:
        """The run's events, live (SSE); ends once none came for
        ``idle_sec`` (``None``: follows until the caller stops)."""
        async for event in self._sse(c.events_stream(run_id, after, idle_sec)):
            yield run_event(event)  # type: ignore[misc]

    async def list_reports(self, run_id: str, limit: Optional[int] = None) -> ReportList:
        return await self._send(c.list_reports(run_id, limit))

    async def wait_report(self, run_id: str, wait_sec: int = 0) -> Report:
        """Waits up to ``wait_sec`` for a result or a note and returns one
        report (``report_id`` ``None``: nothing to deliver). The same report
        is served again until ``ack_report``."""
        return await self._send(c.wait_report(run_id, wait_sec))

    async def ack_report(self, run_id: str, report_id: str) -> ReportAck:
        return await self._send(c.ack_report(run_id, report_id))

    async def add_note(self, run_id: str, text: str) -> NoteAdded:
        return await self._send(c.post("add_note", {"text": text}, run=run_id))

    async def finish(self, run_id: str) -> FinishView:
        """Waits for every op of the run to end; returns their outcomes."""
        return await self._send(c.finish(run_id))

    # schedules

    async def create_schedule(
        self,
        run_id: str,
        command: Sequence[str],
        *,
        cron: Optional[str] = None,
        every_sec: Optional[int] = None,
        at: Optional[str] = None,
        timeout_sec: Optional[int] = None,
        catch_up: bool = False,
        delete_after_success: bool = False,
    ) -> ScheduleCreated:
        call = c.create_schedule(
            run_id, command, timeout_sec, cron, every_sec, at, catch_up, delete_after_success
        )
        return await self._send(call)

    async def list_schedules(self, run_id: Optional[str] = None) -> ScheduleList:
        """A run's schedules, or every schedule the token sees."""
        return await self._send(c.list_schedules(run_id))

    async def get_schedule(self, run_id: str, schedule_id: str) -> ScheduleView:
        return await self._send(c.schedule("get_schedule", run_id, schedule_id))

    async def delete_schedule(self, run_id: str, schedule_id: str) -> ScheduleDeleted:
        return await self._send(c.schedule("delete_schedule", run_id, schedule_id))

    async def pause_schedule(self, run_id: str, schedule_id: str) -> ScheduleView:
        return await self._send(c.schedule("pause_schedule", run_id, schedule_id))

    async def resume_schedule(self, run_id: str, schedule_id: str) -> ScheduleView:
        return await self._send(c.schedule("resume_schedule", run_id, schedule_id))

    # files (paths are container paths: "/scratch/a.txt")

    async def upload_file(
        self, run_id: str, path: str, data: Body, mode: Optional[str] = None
    ) -> FileWrittenView:
        return await self._send(c.upload_file(run_id, path, data, mode))

    async def download_file(
        self, run_id: str, path: str, start: Optional[int] = None, end: Optional[int] = None
    ) -> bytes:
        """The file's bytes (``start``/``end``: an inclusive byte range)."""
        return await self._send(c.download_file(run_id, path, start, end))

    async def list_files(self, run_id: str, path: str) -> FileList:
        return await self._send(c.list_files(run_id, path))

    async def delete_file(self, run_id: str, path: str, recursive: bool = False) -> None:
        await self._send(c.delete_file(run_id, path, recursive))

    async def upload_archive(self, run_id: str, path: str, tar: Body) -> FileWrittenView:
        """Unpacks a tar stream into the directory ``path`` (made if absent)."""
        return await self._send(c.upload_archive(run_id, path, tar))

    async def download_archive(self, run_id: str, path: str) -> bytes:
        """The directory ``path`` as a tar stream."""
        return await self._send(c.download_archive(run_id, path))

    async def read_file(
        self,
        run_id: str,
        path: str,
        offset: Optional[int] = None,
        length: Optional[int] = None,
        encoding: Optional[str] = None,
    ) -> FileContent:
        return await self._send(c.read_file(run_id, path, offset, length, encoding))

    async def write_file(
        self,
        run_id: str,
        path: str,
        text: Optional[str] = None,
        *,
        data: Optional[bytes] = None,
        mode: Optional[str] = None,
    ) -> FileWrittenView:
        return await self._send(c.write_file(run_id, path, text, data, mode))

    async def list_dir(self, run_id: str, path: Optional[str] = None) -> FileList:
        return await self._send(c.post("list_dir", c.body(path=path), safe=True, run=run_id))

    # operations

    async def run_command(
        self,
        run_id: str,
        command: Sequence[str],
        background: bool = False,
        timeout_sec: Optional[int] = None,
        *,
        stdin: bool = False,
        tty: Optional[c.Tty] = None,
        yield_ms: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> OpView:
        """Starts ``command`` (an argv) in the run's container: in the
        background the answer comes at once (the result arrives in a
        report), in the foreground at its end with ``exit_code`` and
        ``output``. A retry of this call returns the same operation."""
        call = c.run_command(
            run_id, command, background, timeout_sec, stdin, tty, yield_ms, idempotency_key
        )
        return await self._send(call)

    async def run_oneshot(self, command: Sequence[str], timeout_sec: Optional[int] = None) -> OpView:
        """A foreground command in a throwaway container (operator only)."""
        return await self._send(c.run_oneshot(command, timeout_sec))

    async def kill_operation(
        self, run_id: str, operation_id: str, signal: Optional[str] = None
    ) -> OpView:
        """TERM, a grace, then KILL (or only ``signal``: ``INT``, ``HUP``...)."""
        return await self._send(c.kill_operation(run_id, operation_id, signal))

    async def write_stdin(
        self,
        run_id: str,
        operation_id: str,
        text: Optional[str] = None,
        *,
        data: Optional[bytes] = None,
        eof: bool = False,
        yield_ms: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> StdinAnswer:
        call = c.write_stdin(run_id, operation_id, text, data, eof, yield_ms, idempotency_key)
        return await self._send(call)

    async def read_output(
        self,
        run_id: str,
        operation_id: str,
        offset: Optional[int] = None,
        wait_ms: Optional[int] = None,
        max_bytes: Optional[int] = None,
    ) -> OutputView:
        return await self._send(c.read_output(run_id, operation_id, offset, wait_ms, max_bytes))

    async def resize_tty(self, run_id: str, operation_id: str, rows: int, cols: int) -> OpView:
        return await self._send(c.resize_tty(run_id, operation_id, rows, cols))

    async def nudge(self, operation_id: str, text: str) -> StdinAnswer:
        return await self._send(c.post("nudge", {"text": text}, id=operation_id))

    async def get_operation(self, operation_id: str) -> OpView:
        return await self._send(c.get("get_operation", id=operation_id))

    async def get_log(self, operation_id: str, offset: int = 0) -> bytes:
        return await self._send(c.get_log(operation_id, offset))

    async def console(self, operation_id: str, offset: int = 0) -> AsyncIterator[ConsoleFrame]:
        """The op's output live (``output`` frames), then one ``done``."""
        async for event in self._sse(c.console(operation_id, offset)):
            yield console_frame(event)  # type: ignore[misc]

    async def list_ops(
        self,
        run_id: Optional[str] = None,
        live: bool = False,
        limit: Optional[int] = None,
        surface: Optional[str] = None,
    ) -> OpList:
        return await self._send(c.list_ops(run_id, live, limit, surface))

    # approvals

    async def list_approvals(self) -> OpList:
        return await self._send(c.get("list_approvals"))

    async def approve(self, operation_id: str) -> OpView:
        return await self._send(c.post("approve", id=operation_id))

    async def deny(self, operation_id: str, reason: Optional[str] = None) -> OpView:
        return await self._send(c.deny(operation_id, reason))

    # the operators' views

    async def list_containers(self) -> Json:
        return await self._send(c.get("list_containers"))

    async def inspect(self, target: str) -> Json:
        """A container (id, name) or a run's container, with its ops."""
        return await self._send(c.get("inspect", id=target))

    async def reap(self, dry_run: bool = True) -> Json:
        return await self._send(c.reap(dry_run))

    async def list_nodes(self) -> Json:
        return await self._send(c.get("list_nodes"))

    async def drain_node(self, name: str) -> Json:
        return await self._send(c.post("drain_node", safe=True, name=name))

    async def activate_node(self, name: str) -> Json:
        return await self._send(c.post("activate_node", safe=True, name=name))


__all__: List[str] = ["AsyncClient"]
