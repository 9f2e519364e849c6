"""Runs and their tokens, children, notes, events, usage, state changes,
finish, and the kernel's own endpoints."""

from __future__ import annotations

import itertools
from typing import Callable, Dict

import pytest
from conftest import fresh_id, remember, report_with

import opkernel


def test_the_kernel_answers_health_whoami_tools_images_metrics(
    op: opkernel.Client, agent: opkernel.Client, run: Dict[str, str]
) -> None:
    assert op.health()["ok"] is True
    assert op.whoami()["principal"] == "operator"
    me = agent.whoami()
    assert me["principal"] == "run" and me["run_id"] == run["run_id"]
    names = {t["name"] for t in op.tools()["tools"]}
    assert {"run_command", "kill_operation", "write_stdin", "read_output"} <= names
    assert any(i["default"] for i in op.list_images()["images"])
    assert "opkernel_" in op.metrics()


def test_a_created_run_has_a_token_acting_on_it_alone(
    op: opkernel.Client, new_run: Callable[..., Dict[str, str]], kernel
) -> None:
    mine, other = new_run("tok"), new_run("tok")
    view = op.get_run(mine["run_id"])
    assert view["state"] == "active" and view["parent_run_id"] is None
    with opkernel.Client(kernel[0], mine["token"]) as agent:
        assert agent.get_run(mine["run_id"])["run_id"] == mine["run_id"]
        with pytest.raises(opkernel.ApiError) as refused:
            agent.run_command(other["run_id"], ["true"])
        assert refused.value.status == 403
    listed = {r["run_id"] for r in op.list_runs()["runs"]}
    assert {mine["run_id"], other["run_id"]} <= listed


def test_a_run_token_creates_a_narrower_child(
    kernel, run: Dict[str, str], agent: opkernel.Client, op: opkernel.Client
) -> None:
    child = agent.create_run(fresh_id("child"), envelope={"max_timeout_sec": 60})
    # a child's id is named under its parent's
    child_id = child["run_id"]
    assert child_id.startswith(run["run_id"] + ".")
    assert child["parent_run_id"] == run["run_id"] and child["chain"] == [run["run_id"]]
    assert child_id in {c["run_id"] for c in agent.get_run(run["run_id"])["children"]}
    with agent.with_token(child["token"]) as child_agent:
        done = child_agent.run_command(child_id, ["echo", "child"])
        assert done["exit_code"] == 0
        with pytest.raises(opkernel.ApiError) as over:
            child_agent.run_command(child_id, ["true"], background=True, timeout_sec=120)
        assert over.value.status == 403 and over.value.code == "envelope_exceeded"
        with pytest.raises(opkernel.ApiError) as parent:
            child_agent.get_run(run["run_id"])
        assert parent.value.status == 403
    assert {r["run_id"] for r in agent.list_runs()["runs"]} >= {run["run_id"], child_id}
    remember(child_id)


def test_a_note_wakes_the_report_and_is_delivered(
    agent: opkernel.Client, op: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    added = op.add_note(run_id, "use the staging db\nplease")
    assert added["run_id"] == run_id
    report = agent.wait_report(run_id, 10)
    assert "use the staging db\nplease" in report["notes"]
    assert "Notes from the user:\n- use the staging db\n  please\n" in report["text"]
    agent.ack_report(run_id, report["report_id"])


def test_usage_is_recorded_once_per_key(agent: opkernel.Client, run: Dict[str, str]) -> None:
    run_id = run["run_id"]
    first = agent.record_usage(run_id, "m1", 10, 5, 7, idempotency_key="pyc-usage-1")
    again = agent.record_usage(run_id, "m1", 10, 5, 7, idempotency_key="pyc-usage-1")
    assert first["seq"] == again["seq"]
    assert agent.get_run(run_id)["used"]["tokens"] == 15


def test_events_stream_and_pages(agent: opkernel.Client, run: Dict[str, str]) -> None:
    run_id = run["run_id"]
    done = agent.run_command(run_id, ["echo", "traced"])
    stream = agent.events_stream(run_id, idle_sec=2)
    events = list(itertools.islice(stream, 200))
    assert events, "the events stream yielded nothing"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    started = [e for e in events if e["kind"] == "tool.started"]
    assert done["operation_id"] in {e["operation_id"] for e in started}
    page = agent.get_events(run_id, after=events[0]["seq"], limit=2)
    assert [e["seq"] for e in page["events"]] == [e["seq"] for e in events[1:3]]
    tail = agent.get_events(run_id, tail=1)
    assert tail["events"][-1]["seq"] == tail["last_seq"]
    resumed = list(agent.events_stream(run_id, after=events[-2]["seq"], idle_sec=1))
    assert resumed[0]["seq"] == events[-1]["seq"]


def test_pause_resume_and_admission_codes(
    op: opkernel.Client, new_run: Callable[..., Dict[str, str]]
) -> None:
    run_id = new_run("state")["run_id"]
    assert op.pause_run(run_id)["run"]["state"] == "paused"
    with pytest.raises(opkernel.ApiError) as paused:
        op.run_command(run_id, ["true"])
    assert paused.value.status == 409 and paused.value.code == "run_paused"
    assert op.resume_run(run_id)["run"]["state"] == "active"
    assert op.run_command(run_id, ["true"])["exit_code"] == 0
    assert op.complete_run(run_id, "all done")["run"]["state"] == "completed"
    with pytest.raises(opkernel.ApiError) as completed:
        op.run_command(run_id, ["true"])
    assert completed.value.code == "run_completed"


def test_finish_waits_for_every_op(op: opkernel.Client, new_run) -> None:
    run_id = new_run("fin")["run_id"]
    started = op.run_command(run_id, ["sh", "-c", "sleep 1; echo fin"], background=True)
    finished = op.finish(run_id)
    outcome = {o["operation_id"]: o for o in finished["operations"]}
    assert outcome[started["operation_id"]]["status"] == "completed"
    assert finished["report"] is not None
    assert started["operation_id"] in {r["operation_id"] for r in finished["report"]["resolved"]}


def test_cancel_kills_live_ops(op: opkernel.Client, new_run) -> None:
    run_id = new_run("cancel")["run_id"]
    started = op.run_command(run_id, ["sleep", "300"], background=True)
    answer = op.cancel_run(run_id)
    assert answer["run"]["state"] == "cancelled"
    assert started["operation_id"] in answer["kill_requested"]
    seen = report_with(op, run_id, [started["operation_id"]])
    item = next(
        r for s in seen for r in s["resolved"] if r["operation_id"] == started["operation_id"]
    )
    assert item["killed"] is True
    with pytest.raises(opkernel.ApiError) as cancelled:
        op.run_command(run_id, ["true"])
    assert cancelled.value.code == "run_cancelled"
