"""Schedules (create, list, get, pause, resume, delete, a firing) and
approval gates (approve, deny, withdraw)."""

from __future__ import annotations

from typing import Dict

import pytest
from conftest import report_with, wait_until

import opkernel


def test_schedules_are_created_listed_paused_and_deleted(
    agent: opkernel.Client, op: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    created = agent.create_schedule(run_id, ["echo", "tick"], every_sec=3600, timeout_sec=60)
    sid = created["schedule_id"]
    assert created["next_due_at"] and created["schedule"]["every_sec"] == 3600
    assert sid in {s["schedule_id"] for s in agent.list_schedules(run_id)["schedules"]}
    assert sid in {s["schedule_id"] for s in op.list_schedules()["schedules"]}
    assert agent.get_schedule(run_id, sid)["command"] == ["echo", "tick"]
    assert agent.pause_schedule(run_id, sid)["paused"] is True
    assert agent.resume_schedule(run_id, sid)["paused"] is False
    deleted = agent.delete_schedule(run_id, sid)
    assert deleted["deleted"] is True and deleted["schedule_id"] == sid
    assert sid not in {s["schedule_id"] for s in agent.list_schedules(run_id)["schedules"]}
    with pytest.raises(opkernel.ApiError) as gone:
        agent.get_schedule(run_id, sid)
    assert gone.value.status == 404 and gone.value.code == "not_found"


def test_a_schedule_fires_as_a_background_op_of_its_run(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    run_id = run["run_id"]
    created = agent.create_schedule(
        run_id, ["echo", "fired"], every_sec=1, delete_after_success=False
    )
    sid = created["schedule_id"]
    fired = wait_until(
        lambda: agent.get_schedule(run_id, sid).get("last_operation_id"),
        timeout=30,
        what="a firing",
    )
    agent.delete_schedule(run_id, sid)
    assert agent.get_operation(str(fired))["schedule_id"] == sid
    seen = report_with(agent, run_id, [str(fired)])
    agent.ack_report(run_id, seen[-1]["report_id"])


def test_a_bad_schedule_is_refused(agent: opkernel.Client, run: Dict[str, str]) -> None:
    with pytest.raises(opkernel.ApiError) as bad:
        agent.create_schedule(run["run_id"], ["true"], cron="not a cron")
    assert bad.value.status == 400 and bad.value.code == "bad_request"


@pytest.fixture(scope="module")
def gated(new_run) -> Dict[str, str]:
    """A run whose `rm` commands wait for an operator."""
    return new_run("gate", envelope={"approval": {"match": ["^rm "]}})


def test_an_approved_op_runs_and_a_denied_one_does_not(
    op: opkernel.Client, kernel, gated: Dict[str, str]
) -> None:
    run_id = gated["run_id"]
    with opkernel.Client(kernel[0], gated["token"]) as agent:
        held = agent.run_command(run_id, ["rm", "-f", "/scratch/none"])
        assert held["status"] == "awaiting_approval"
        assert held["message"].startswith("Awaiting operator approval as operation ")
        other = agent.run_command(run_id, ["rm", "-f", "/scratch/other"], background=True)
        waiting = {o["operation_id"] for o in op.list_approvals()["operations"]}
        assert {held["operation_id"], other["operation_id"]} <= waiting
        with pytest.raises(opkernel.ApiError) as self_approval:
            agent.approve(held["operation_id"])
        assert self_approval.value.status == 403
        assert op.approve(held["operation_id"])["operation_id"] == held["operation_id"]
        denied = op.deny(other["operation_id"], "not today")
        assert denied["status"] == "denied"
        seen = report_with(agent, run_id, [held["operation_id"], other["operation_id"]])
        text = "".join(s["text"] for s in seen)
        assert f"- {other['operation_id']} denied by operator: not today" in text
        assert f"- {held['operation_id']} finished: exit_code=0" in text
        agent.ack_report(run_id, seen[-1]["report_id"])


def test_killing_a_waiting_op_withdraws_it(op: opkernel.Client, gated: Dict[str, str]) -> None:
    held = op.run_command(gated["run_id"], ["rm", "-rf", "/scratch/x"], background=True)
    assert held["status"] == "awaiting_approval"
    withdrawn = op.kill_operation(gated["run_id"], held["operation_id"])
    assert withdrawn["status"] == "denied"
    with pytest.raises(opkernel.ApiError) as late:
        op.approve(held["operation_id"])
    assert late.value.status == 409
