"""Interactive operations: stdin writes, output reads, EOF, nudges,
terminals and signals."""

from __future__ import annotations

from typing import Dict

import pytest
from conftest import wait_until

import opkernel


def test_stdin_is_written_read_back_and_closed(agent: opkernel.Client, run: Dict[str, str]) -> None:
    run_id = run["run_id"]
    started = agent.run_command(run_id, ["cat"], background=True, stdin=True)
    op_id = started["operation_id"]
    answer = agent.write_stdin(run_id, op_id, "hello stdin\n", yield_ms=3000)
    assert "hello stdin" in answer["output"] and answer["bytes_written"] == 12
    agent.write_stdin(run_id, op_id, data=b"raw bytes\n", yield_ms=2000)
    read = agent.read_output(run_id, op_id, offset=0, wait_ms=1000)
    assert read["output"] == "hello stdin\nraw bytes\n" and read["running"] is True
    assert read["next_offset"] == len(read["output"])
    nudged = agent.nudge(op_id, "nudged")
    assert nudged["operation_id"] == op_id
    closed = agent.write_stdin(run_id, op_id, eof=True, yield_ms=5000)
    final = wait_until(
        lambda: (lambda o: o if o["status"] == "completed" else None)(agent.get_operation(op_id)),
        what="cat's end",
    )
    assert final["exit_code"] == 0, closed
    rest = agent.read_output(run_id, op_id, offset=read["next_offset"])
    assert "nudged" in rest["output"] and rest["running"] is False
    with pytest.raises(opkernel.ApiError) as late:
        agent.write_stdin(run_id, op_id, "too late")
    assert late.value.status == 409


def test_stdin_of_an_op_without_one_is_refused(agent: opkernel.Client, run: Dict[str, str]) -> None:
    started = agent.run_command(run["run_id"], ["sleep", "30"], background=True)
    with pytest.raises(opkernel.ApiError) as refused:
        agent.write_stdin(run["run_id"], started["operation_id"], "x")
    assert refused.value.status == 409 and refused.value.code == "no_stdin"
    agent.kill_operation(run["run_id"], started["operation_id"])


def test_a_terminal_op_is_resized_and_interrupted(agent: opkernel.Client, run: Dict[str, str]) -> None:
    run_id = run["run_id"]
    script = "trap 'echo got-int; exit 7' INT; stty size; while :; do sleep 0.1; done"
    started = agent.run_command(
        run_id, ["bash", "-c", script], background=True, tty={"rows": 30, "cols": 100}
    )
    op_id = started["operation_id"]
    wait_until(lambda: "30 100" in agent.read_output(run_id, op_id)["output"], what="stty size")
    resized = agent.resize_tty(run_id, op_id, 40, 120)
    assert resized["operation_id"] == op_id
    agent.kill_operation(run_id, op_id, signal="INT")
    final = wait_until(
        lambda: (lambda o: o if o["status"] == "completed" else None)(agent.get_operation(op_id)),
        what="the interrupt",
    )
    assert final["exit_code"] == 7
    assert "got-int" in agent.get_log(op_id).decode()


def test_a_foreground_command_yields_to_the_background(
    agent: opkernel.Client, run: Dict[str, str]
) -> None:
    answer = agent.run_command(
        run["run_id"], ["sh", "-c", "echo early; sleep 2; echo late"], yield_ms=500
    )
    assert answer["running"] is True and "early" in (answer["output"] or "")
    final = wait_until(
        lambda: (lambda o: o if o["status"] == "completed" else None)(
            agent.get_operation(answer["operation_id"])
        ),
        what="the yielded op's end",
    )
    assert final["background"] is True
