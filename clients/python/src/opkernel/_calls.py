"""Each endpoint's request, built once for both clients: these functions
only describe calls (route, parameters, retry rule); the clients send them."""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._core import UNBOUNDED, Call, dropping_none, new_key

Tty = Union[bool, Mapping[str, int]]


def argv(command: Sequence[str]) -> List[str]:
    """The argv as a list; a lone string is refused (it is not split)."""
    if isinstance(command, (str, bytes)):
        raise TypeError("command is an argv list, e.g. ['sh', '-c', 'make test']")
    return [str(a) for a in command]


def body(**fields: Any) -> Dict[str, Any]:
    return dropping_none(fields)


def get(route: str, answer: str = "json", **path: str) -> Call:
    return Call(route, path=path, safe=True, answer=answer)


def post(route: str, json: Any = None, safe: bool = False, **path: str) -> Call:
    return Call(route, path=path, json=json, safe=safe)


# runs and their tokens


def create_run(
    run_id: str,
    envelope: Optional[Mapping[str, Any]],
    budget: Optional[Mapping[str, Any]],
    image: Optional[str],
    fork_from: Optional[str],
    consistent: bool,
    idempotency_key: Optional[str],
) -> Call:
    payload = body(
        run_id=run_id,
        envelope=envelope,
        budget=budget,
        image=image,
        fork_from=fork_from,
        consistent=consistent or None,
    )
    return Call("create_run", json=payload, key=idempotency_key or new_key(), safe=True)


def list_runs(limit: Optional[int]) -> Call:
    return Call("list_runs", query=body(limit=limit), safe=True)


def complete_run(run_id: str, summary: str) -> Call:
    return post("complete_run", {"summary": summary}, safe=True, run=run_id)


def record_usage(
    run_id: str,
    model: str,
    input_tokens: int,
    output_tokens: int,
    cost_micros: int,
    idempotency_key: Optional[str],
) -> Call:
    payload = body(
        model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_micros=cost_micros,
    )
    key = idempotency_key or new_key()
    return Call("record_usage", path={"run": run_id}, json=payload, key=key, safe=True)


def make_snapshot(run_id: str, name: str, consistent: bool) -> Call:
    return post("make_snapshot", {"name": name, "consistent": consistent}, run=run_id)


# events and reports


def get_events(
    run_id: str, after: int, wait_sec: int, limit: Optional[int], tail: Optional[int]
) -> Call:
    query = body(after=after, wait=wait_sec, limit=limit, tail=tail)
    return Call("get_events", path={"run": run_id}, query=query, safe=True, wait=wait_sec)


def events_stream(run_id: str, after: int, idle_sec: Optional[int]) -> Call:
    query = body(after=after, idle_sec=idle_sec)
    return Call("events_stream", path={"run": run_id}, query=query, safe=True, wait=UNBOUNDED)


def list_reports(run_id: str, limit: Optional[int]) -> Call:
    return Call("list_reports", path={"run": run_id}, query=body(limit=limit), safe=True)


def wait_report(run_id: str, wait_sec: int) -> Call:
    query = {"wait": wait_sec}
    return Call("wait_report", path={"run": run_id}, query=query, safe=True, wait=wait_sec)


def ack_report(run_id: str, report_id: str) -> Call:
    # acking twice is harmless: the call may repeat
    return post("ack_report", safe=True, run=run_id, report_id=report_id)


def finish(run_id: str) -> Call:
    # waits for every op of the run; repeating it changes nothing more
    return Call("finish", path={"run": run_id}, safe=True, wait=UNBOUNDED)


# schedules


def create_schedule(
    run_id: str,
    command: Sequence[str],
    timeout_sec: Optional[int],
    cron: Optional[str],
    every_sec: Optional[int],
    at: Optional[str],
    catch_up: bool,
    delete_after_success: bool,
) -> Call:
    payload = body(
        command=argv(command),
        timeout_sec=timeout_sec,
        cron=cron,
        every_sec=every_sec,
        at=at,
        catch_up=catch_up,
        delete_after_success=delete_after_success,
    )
    return post("create_schedule", payload, run=run_id)


def list_schedules(run_id: Optional[str]) -> Call:
    if run_id is None:
        return get("list_all_schedules")
    return get("list_run_schedules", run=run_id)


def schedule(route: str, run_id: str, schedule_id: str) -> Call:
    return Call(route, path={"run": run_id, "id": schedule_id}, safe=True)


# files


def upload_file(run_id: str, path: str, data: Any, mode: Optional[str]) -> Call:
    # a body given as bytes can be sent again; a stream cannot
    return Call(
        "upload_file",
        path={"run": run_id, "path": path},
        query=body(mode=mode),
        content=data,
        headers={"Content-Type": "application/octet-stream"},
        safe=isinstance(data, (bytes, bytearray, memoryview)),
    )


def download_file(run_id: str, path: str, start: Optional[int], end: Optional[int]) -> Call:
    headers = {}
    if start is not None or end is not None:
        headers["Range"] = f"bytes={'' if start is None else start}-{'' if end is None else end}"
    return Call(
        "download_file",
        path={"run": run_id, "path": path},
        headers=headers,
        safe=True,
        answer="bytes",
        wait=UNBOUNDED,
    )


def list_files(run_id: str, path: str) -> Call:
    directory = path if path.endswith("/") else path + "/"
    return Call("download_file", path={"run": run_id, "path": directory}, safe=True)


def delete_file(run_id: str, path: str, recursive: bool) -> Call:
    query = body(recursive=recursive or None)
    return Call(
        "delete_file", path={"run": run_id, "path": path}, query=query, safe=True, answer="empty"
    )


def upload_archive(run_id: str, path: str, tar: Any) -> Call:
    return Call(
        "upload_archive",
        path={"run": run_id, "path": path},
        content=tar,
        headers={"Content-Type": "application/x-tar"},
        safe=isinstance(tar, (bytes, bytearray, memoryview)),
        wait=UNBOUNDED,
    )


def download_archive(run_id: str, path: str) -> Call:
    where = {"run": run_id, "path": path}
    return Call("download_archive", path=where, safe=True, answer="bytes", wait=UNBOUNDED)


def read_file(
    run_id: str, path: str, offset: Optional[int], length: Optional[int], encoding: Optional[str]
) -> Call:
    payload = body(path=path, offset=offset, length=length, encoding=encoding)
    return post("read_file", payload, safe=True, run=run_id)


def write_file(
    run_id: str, path: str, text: Optional[str], data: Optional[bytes], mode: Optional[str]
) -> Call:
    encoded = None if data is None else base64.b64encode(data).decode("ascii")
    payload = body(path=path, text=text, data_base64=encoded, mode=mode)
    return post("write_file", payload, safe=True, run=run_id)


# operations


def run_command(
    run_id: str,
    command: Sequence[str],
    background: bool,
    timeout_sec: Optional[int],
    stdin: bool,
    tty: Optional[Tty],
    yield_ms: Optional[int],
    idempotency_key: Optional[str],
) -> Call:
    payload = body(
        command=argv(command),
        background=background,
        timeout_sec=timeout_sec,
        stdin=stdin or None,
        tty=None if tty is None else (dict(tty) if isinstance(tty, Mapping) else tty),
        yield_ms=yield_ms,
    )
    # a foreground call is answered when the command ends (or yields)
    wait = 0.0 if background else float(timeout_sec or 900) + 60.0
    return Call(
        "run_command",
        path={"run": run_id},
        json=payload,
        key=idempotency_key or new_key(),
        safe=True,
        wait=wait,
    )


def run_oneshot(command: Sequence[str], timeout_sec: Optional[int]) -> Call:
    payload = body(command=argv(command), timeout_sec=timeout_sec)
    return Call("run_oneshot", json=payload, wait=float(timeout_sec or 900) + 60.0)


def kill_operation(run_id: str, operation_id: str, signal: Optional[str]) -> Call:
    payload = body(operation_id=operation_id, signal=signal)
    # TERM, the grace and KILL are waited for: give the answer time
    return Call("kill_operation", path={"run": run_id}, json=payload, safe=True, wait=60.0)


def write_stdin(
    run_id: str,
    operation_id: str,
    text: Optional[str],
    data: Optional[bytes],
    eof: bool,
    yield_ms: Optional[int],
    idempotency_key: Optional[str],
) -> Call:
    encoded = None if data is None else base64.b64encode(data).decode("ascii")
    payload = body(
        operation_id=operation_id,
        text=text,
        data_base64=encoded,
        eof=eof or None,
        yield_ms=yield_ms,
    )
    wait = (yield_ms if yield_ms is not None else 1000) / 1000.0 + 30.0
    key = idempotency_key or new_key()
    return Call("write_stdin", path={"run": run_id}, json=payload, key=key, safe=True, wait=wait)


def read_output(
    run_id: str,
    operation_id: str,
    offset: Optional[int],
    wait_ms: Optional[int],
    max_bytes: Optional[int],
) -> Call:
    payload = body(operation_id=operation_id, offset=offset, wait_ms=wait_ms, max_bytes=max_bytes)
    wait = (wait_ms or 0) / 1000.0
    return Call("read_output", path={"run": run_id}, json=payload, safe=True, wait=wait)


def resize_tty(run_id: str, operation_id: str, rows: int, cols: int) -> Call:
    payload = {"operation_id": operation_id, "rows": rows, "cols": cols}
    return post("resize_tty", payload, safe=True, run=run_id)


def list_ops(
    run_id: Optional[str], live: bool, limit: Optional[int], surface: Optional[str]
) -> Call:
    query = body(run=run_id, live=live or None, limit=limit, surface=surface)
    return Call("list_ops", query=query, safe=True)


def get_log(operation_id: str, offset: int) -> Call:
    query = {"offset": offset}
    path = {"id": operation_id}
    return Call("get_log", path=path, query=query, safe=True, answer="bytes", wait=UNBOUNDED)


def console(operation_id: str, offset: int) -> Call:
    query = {"offset": offset}
    return Call("console", path={"id": operation_id}, query=query, safe=True, wait=UNBOUNDED)


def deny(operation_id: str, reason: Optional[str]) -> Call:
    # a second deny is refused (409): not repeated after a lost answer
    return post("deny", body(reason=reason), id=operation_id)


def reap(dry_run: bool) -> Call:
    return Call("reap", query={"dry_run": dry_run}, safe=dry_run, wait=UNBOUNDED)
