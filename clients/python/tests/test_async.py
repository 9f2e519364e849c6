"""The same flows through ``AsyncClient`` (each test runs its own event
loop: no plugin needed)."""

from __future__ import annotations

import asyncio
import uuid
from typing import List

import httpx
import pytest
from conftest import fresh_id, remember

import opkernel


def run_async(make) -> None:
    asyncio.run(make())


async def report_with(client: opkernel.AsyncClient, run_id: str, op_ids: List[str]):
    for _ in range(12):
        report = await client.wait_report(run_id, 10)
        delivered = {r["operation_id"] for r in report["resolved"]}
        if report["report_id"] is not None and set(op_ids) <= delivered:
            return report
        if report["report_id"] is not None:
            await client.ack_report(run_id, report["report_id"])
    raise AssertionError(f"no report delivered {op_ids}")


def test_async_runs_commands_and_delivers_reports_once(kernel) -> None:
    async def flow() -> None:
        async with opkernel.AsyncClient(*kernel) as op:
            made = await op.create_run(fresh_id("async"))
            run_id = remember(made["run_id"])
            async with op.with_token(made["token"]) as agent:
                done = await agent.run_command(run_id, ["sh", "-c", "echo async-fg; exit 2"])
                assert done["exit_code"] == 2 and "async-fg" in done["output"]
                started = await agent.run_command(run_id, ["echo", "async-bg"], background=True)
                report = await report_with(agent, run_id, [started["operation_id"]])
                again = await agent.wait_report(run_id, 0)
                assert again["report_id"] == report["report_id"]
                await agent.ack_report(run_id, report["report_id"])
                empty = await agent.wait_report(run_id, 1)
                assert empty["report_id"] is None and empty["resolved"] == []
            await op.cancel_run(run_id)

    run_async(flow)


def test_async_kill_console_and_events(kernel) -> None:
    async def flow() -> None:
        async with opkernel.AsyncClient(*kernel) as op:
            run_id = remember((await op.create_run(fresh_id("async")))["run_id"])
            sleeper = await op.run_command(run_id, ["sleep", "300"], background=True)
            while (await op.get_operation(sleeper["operation_id"]))["status"] != "running":
                await asyncio.sleep(0.2)
            killed = await op.kill_operation(run_id, sleeper["operation_id"])
            assert killed["operation_id"] == sleeper["operation_id"]
            script = "echo one; sleep 0.3; echo two"
            talker = await op.run_command(run_id, ["sh", "-c", script], background=True)
            frames = [f async for f in op.console(talker["operation_id"])]
            assert frames[-1]["event"] == "done" and frames[-1]["data"]["exit_code"] == 0
            out = "".join(f["data"]["text"] for f in frames if f["event"] == "output")
            assert out == "one\ntwo\n"
            kinds = [e["kind"] async for e in op.events_stream(run_id, idle_sec=2)]
            assert "tool.started" in kinds and "tool.completed" in kinds
            state = await op.get_operation(sleeper["operation_id"])
            assert state["killed"] is True and state["exit_code"] in (137, 143)
            await op.cancel_run(run_id)

    run_async(flow)


def test_async_files_schedules_and_errors(kernel) -> None:
    async def chunks():
        for part in (b"first,", b"second"):
            yield part

    async def flow() -> None:
        async with opkernel.AsyncClient(*kernel) as op:
            run_id = remember((await op.create_run(fresh_id("async")))["run_id"])
            await op.upload_file(run_id, "/scratch/a.bin", b"\x00\x01\x02")
            assert await op.download_file(run_id, "/scratch/a.bin") == b"\x00\x01\x02"
            await op.upload_file(run_id, "/scratch/b.txt", chunks())
            assert await op.download_file(run_id, "/scratch/b.txt") == b"first,second"
            made = await op.create_schedule(run_id, ["true"], cron="0 3 * * *")
            listed = await op.list_schedules(run_id)
            assert made["schedule_id"] in {s["schedule_id"] for s in listed["schedules"]}
            assert (await op.delete_schedule(run_id, made["schedule_id"]))["deleted"] is True
            with pytest.raises(opkernel.ApiError) as missing:
                await op.get_operation(str(uuid.uuid4()))
            assert missing.value.status == 404 and missing.value.code == "not_found"
            await op.cancel_run(run_id)

    run_async(flow)


class DropFirstAnswer(httpx.AsyncHTTPTransport):
    """The first start reaches the kernel; its answer is lost."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: List[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path.endswith("/tools/run_command"):
            self.keys.append(request.headers["idempotency-key"])
            if len(self.keys) == 1:
                await response.aread()
                await response.aclose()
                raise httpx.RemoteProtocolError("peer closed", request=request)
        return response


def test_async_retry_reuses_the_key(kernel) -> None:
    async def flow() -> None:
        wire = DropFirstAnswer()
        async with opkernel.AsyncClient(*kernel, transport=wire) as op:
            run_id = remember((await op.create_run(fresh_id("async")))["run_id"])
            done = await op.run_command(run_id, ["echo", "once"])
            assert done["exit_code"] == 0
            ops = (await op.list_ops(run_id))["operations"]
            assert [o["operation_id"] for o in ops] == [done["operation_id"]]
            assert len(wire.keys) == 2 and wire.keys[0] == wire.keys[1]
            await op.cancel_run(run_id)

    run_async(flow)
