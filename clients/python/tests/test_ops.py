"""Operations through the sync client: foreground and background starts,
reports delivered exactly once, kills, idempotent retries, errors."""

from __future__ import annotations

import uuid
from typing import Dict, List

import httpx
import pytest
from conftest import report_with, wait_until

import opkernel


def test_foreground_command_answers_with_its_exit_code_and_output(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    op = agent.run_command(run["run_id"], ["sh", "-c", "echo hello from pyc; exit 3"])
    assert op["status"] == "completed"
    assert op["exit_code"] == 3
    assert "hello from pyc" in (op["output"] or "")
    assert "hello from pyc" in (op["output_tail"] or "")
    assert op["background"] is False
    again = agent.get_operation(op["operation_id"])
    assert again["exit_code"] == 3 and again["run_id"] == run["run_id"]


def test_background_result_is_reported_once_and_acked(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    started = agent.run_command(run_id, ["sh", "-c", "echo bg-done"], background=True)
    assert started["status"] in ("starting", "running", "completed")
    assert started["message"].startswith("Started in background as operation ")
    reports = report_with(agent, run_id, [started["operation_id"]])
    report = reports[-1]
    # asked again before the ack: the same report, not a new one
    assert agent.wait_report(run_id, 0)["report_id"] == report["report_id"]
    item = next(r for r in report["resolved"] if r["operation_id"] == started["operation_id"])
    assert item["exit_code"] == 0 and "bg-done" in item["output_tail"]
    assert report["text"].startswith("[Background operations report]\n")
    assert agent.ack_report(run_id, report["report_id"]) == {
        "report_id": report["report_id"],
        "acked": True,
    }
    after = agent.wait_report(run_id, 1)
    assert after["report_id"] is None and after["resolved"] == []
    served = {r["report_id"] for r in agent.list_reports(run_id)["reports"]}
    assert report["report_id"] in served


def test_kill_operation_ends_a_background_op_killed(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    started = agent.run_command(run_id, ["sleep", "300"], background=True, timeout_sec=600)
    op_id = started["operation_id"]
    wait_until(lambda: agent.get_operation(op_id)["status"] == "running", what="the start")
    killed = agent.kill_operation(run_id, op_id)
    assert killed["operation_id"] == op_id
    final = wait_until(
        lambda: (lambda o: o if o["status"] != "running" else None)(agent.get_operation(op_id)),
        what="the kill",
    )
    assert final["status"] == "completed" and final["killed"] is True
    assert final["exit_code"] in (137, 143)
    report_with(agent, run_id, [op_id])
    agent.ack_report(run_id, agent.wait_report(run_id, 0)["report_id"])


def test_the_same_idempotency_key_gives_the_same_op(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    key = f"pyc-{uuid.uuid4()}"
    first = agent.run_command(run["run_id"], ["true"], idempotency_key=key)
    second = agent.run_command(run["run_id"], ["true"], idempotency_key=key)
    assert first["operation_id"] == second["operation_id"]
    with pytest.raises(opkernel.ApiError) as refused:
        agent.run_command(run["run_id"], ["false"], idempotency_key=key)
    assert refused.value.status == 409 and refused.value.code == "conflict"


class LoseFirstAnswer(httpx.HTTPTransport):
    """The request reaches the kernel; its first answer is lost on the way
    back (as a dropped connection loses it), or replaced by a 503 with
    ``Retry-After`` (as a store outage answers a commit it cannot confirm)."""

    def __init__(self, path_end: str, how: str) -> None:
        super().__init__()
        self.path_end, self.how = path_end, how
        self.keys: List[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not request.url.path.endswith(self.path_end):
            return response
        self.keys.append(request.headers.get("idempotency-key", ""))
        if len(self.keys) > 1:
            return response
        response.read()
        response.close()
        if self.how == "drop":
            raise httpx.ReadError("connection reset after the request", request=request)
        return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": {}})


@pytest.mark.parametrize("how", ["drop", "503"])
def test_a_retried_start_reuses_its_key_and_starts_one_op(
    kernel, run: Dict[str, str], how: str
) -> None:
    run_id = run["run_id"]
    wire = LoseFirstAnswer("/tools/run_command", how)
    with opkernel.Client(kernel[0], run["token"], transport=wire) as client:
        marker = f"retry-{how}-{uuid.uuid4().hex[:6]}"
        op = client.run_command(run_id, ["echo", marker], background=True)
        ops = [
            o for o in client.list_ops(run_id)["operations"] if o["command"] == ["echo", marker]
        ]
    assert len(wire.keys) == 2 and wire.keys[0] == wire.keys[1] and wire.keys[0]
    assert [o["operation_id"] for o in ops] == [op["operation_id"]]


def test_a_lost_answer_without_retries_names_the_key_for_a_later_retry(
    kernel, run: Dict[str, str]
) -> None:
    wire = LoseFirstAnswer("/tools/run_command", "drop")
    with opkernel.Client(kernel[0], run["token"], transport=wire, max_retries=0) as client:
        with pytest.raises(opkernel.TransportError) as lost:
            client.run_command(run["run_id"], ["echo", "late"], background=True)
        key = lost.value.idempotency_key
        assert key == wire.keys[0]
        retried = client.run_command(
            run["run_id"], ["echo", "late"], background=True, idempotency_key=key
        )
    first = [o for o in retried_ops(kernel, run) if o["command"] == ["echo", "late"]]
    assert [o["operation_id"] for o in first] == [retried["operation_id"]]


def retried_ops(kernel, run: Dict[str, str]) -> list:
    with opkernel.Client(kernel[0], run["token"]) as client:
        return client.list_ops(run["run_id"])["operations"]


def test_errors_carry_status_and_code(agent: opkernel.Client, run: Dict[str, str]) -> None:
    with pytest.raises(opkernel.ApiError) as bad:
        agent.run_command(run["run_id"], ["true"], timeout_sec=0)
    assert bad.value.status == 400 and bad.value.code == "bad_request"
    assert "timeout_sec" in bad.value.message
    unknown = str(uuid.uuid4())
    with pytest.raises(opkernel.ApiError) as missing:
        agent.get_operation(unknown)
    assert missing.value.status == 404 and missing.value.code == "not_found"
    with pytest.raises(opkernel.ApiError) as kill_missing:
        agent.kill_operation(run["run_id"], unknown)
    assert kill_missing.value.status == 404
    with pytest.raises(opkernel.ApiError) as other:
        agent.get_run("pyc-not-mine")
    assert other.value.status == 403 and other.value.code == "forbidden"
    with pytest.raises(TypeError):
        agent.run_command(run["run_id"], "echo not an argv")  # type: ignore[arg-type]


def test_a_bad_token_is_unauthorized(kernel) -> None:
    with opkernel.Client(kernel[0], "not-a-token") as client:
        with pytest.raises(opkernel.ApiError) as denied:
            client.whoami()
    assert denied.value.status == 401 and denied.value.code == "unauthorized"


def test_console_streams_output_then_done(agent: opkernel.Client, run: Dict[str, str]) -> None:
    script = "for i in 1 2 3; do echo line-$i; sleep 0.2; done"
    started = agent.run_command(run["run_id"], ["sh", "-c", script], background=True)
    frames = list(agent.console(started["operation_id"]))
    assert frames[-1]["event"] == "done"
    assert frames[-1]["data"]["status"] == "completed" and frames[-1]["data"]["exit_code"] == 0
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "output")
    assert text == "line-1\nline-2\nline-3\n"
    assert agent.get_log(started["operation_id"]) == text.encode()
    assert agent.get_log(started["operation_id"], offset=7) == b"line-2\nline-3\n"
    report_with(agent, run["run_id"], [started["operation_id"]])
    agent.ack_report(run["run_id"], agent.wait_report(run["run_id"], 0)["report_id"])


class CutStreamOnce(httpx.HTTPTransport):
    """The first answer of a stream is cut after its first chunk (a dropped
    connection); the client must resume from the last event id."""

    def __init__(self, path_end: str) -> None:
        super().__init__()
        self.path_end = path_end
        self.resumed_from: List[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not request.url.path.endswith(self.path_end):
            return response
        self.resumed_from.append(request.headers.get("last-event-id", ""))
        if len(self.resumed_from) > 1:
            return response
        chunks = iter(response.stream)

        class Cut(httpx.SyncByteStream):
            def __iter__(self):
                yield next(chunks)
                raise httpx.ReadError("connection reset mid-stream", request=request)

            def close(self) -> None:
                response.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Cut())


def test_a_console_cut_mid_stream_resumes_without_loss_or_repeat(
    kernel, run: Dict[str, str]
) -> None:
    wire = CutStreamOnce("/console")
    script = "for i in 1 2 3 4; do echo part-$i; sleep 0.3; done"
    with opkernel.Client(kernel[0], run["token"], transport=wire) as client:
        started = client.run_command(run["run_id"], ["sh", "-c", script], background=True)
        frames = list(client.console(started["operation_id"]))
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "output")
    assert text == "part-1\npart-2\npart-3\npart-4\n"
    assert frames[-1]["event"] == "done" and frames[-1]["data"]["exit_code"] == 0
    assert len(wire.resumed_from) == 2 and wire.resumed_from[0] == ""
    assert int(wire.resumed_from[1]) > 0


def test_an_events_stream_cut_mid_stream_resumes(kernel, run: Dict[str, str]) -> None:
    wire = CutStreamOnce("/events/stream")
    with opkernel.Client(kernel[0], run["token"], transport=wire) as client:
        whole = [e["seq"] for e in client.get_events(run["run_id"], limit=500)["events"]]
        streamed = [e["seq"] for e in client.events_stream(run["run_id"], idle_sec=1)]
    assert streamed[: len(whole)] == whole and len(wire.resumed_from) == 2
    assert int(wire.resumed_from[1]) in whole


def test_ops_are_listed(op: opkernel.Client, run: Dict[str, str]) -> None:
    listed = op.list_ops(run["run_id"], limit=500)["operations"]
    assert listed and all(o["run_id"] == run["run_id"] for o in listed)
    assert all(o["status"] != "completed" for o in op.list_ops(run["run_id"], live=True)["operations"])
    assert op.list_ops(surface="http", limit=5)["operations"]


def test_a_oneshot_command_runs_in_a_throwaway_container(op: opkernel.Client) -> None:
    answer = op.run_oneshot(["sh", "-c", "echo once"], timeout_sec=60)
    assert answer["exit_code"] == 0 and "once" in (answer["output"] or "")
