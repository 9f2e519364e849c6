"""The report text helpers: the kernel's own golden texts, and texts the
live kernel served rendered again from their parts and parsed back."""

from __future__ import annotations

from typing import Any, Dict

import pytest
from conftest import report_with, wait_until

import opkernel
from opkernel.reports import command_line, format_report, human_duration, parse_report, parts_of


def item(status: str, code: Any, killed: bool, message: Any = None, tail: Any = None) -> Dict:
    return {
        "operation_id": "op1",
        "command": ["true"],
        "status": status,
        "exit_code": code,
        "killed": killed,
        "effect": None,
        "message": message,
        "duration_sec": 252.0,
        "timeout_sec": 900,
        "output_tail": tail,
    }


def test_the_kernels_golden_report_text() -> None:
    # domain/src/report_text.rs: report_text_follows_the_spec
    resolved = [
        item("completed", 0, False, tail="added 1284 packages in 42s\n"),
        item("timed_out", 137, True),
        item("lost", None, False, message="container unreachable for 60s"),
    ]
    running = [
        {
            "operation_id": "op2",
            "command": ["docker", "build", "-t", "app", "."],
            "running_sec": 130,
            "timeout_sec": 900,
        }
    ]
    assert format_report(resolved, running) == (
        "[Background operations report]\n"
        "- op1 finished: exit_code=0 (4m12s)\n  output tail:\n  added 1284 packages in 42s\n"
        "- op1 timed out after 900s (killed)\n"
        "- op1 lost: container unreachable for 60s (effect uncertain)\n"
        "Still running in the background:\n"
        "- op2 `docker build -t app .` (running 2m10s, timeout 900s)\n"
        "Incorporate these results and continue.\n"
    )


def test_leftovers_kills_failures_notes_and_held_back_results() -> None:
    with_left = dict(item("completed", 143, True), leftovers=2)
    text = format_report(
        [with_left, item("failed", None, False, message="no such image")],
        notes=["use the staging db"],
        more_pending=7,
    )
    assert "Notes from the user:\n- use the staging db\n" in text
    assert "- op1 killed: exit_code=143 (4m12s) (2 leftover processes stopped)\n" in text
    assert "- op1 failed to start: no such image (nothing ran)\n" in text
    assert "(7 more results or notes wait for the next report" in text
    running = [
        {"operation_id": f"op{i}", "command": ["sleep", "9"], "running_sec": 1, "timeout_sec": 9}
        for i in range(60)
    ]
    long = format_report(running=running)
    assert long.count("`sleep 9`") == 50 and "- … and 10 more (see `opkernel ps`)\n" in long


def test_durations_and_command_lines() -> None:
    assert [human_duration(s) for s in (0, 252, 3725)] == ["0s", "4m12s", "1h02m05s"]
    assert command_line(["bash", "-lc", "yarn install"]) == "bash -lc 'yarn install'"
    assert command_line(["echo", "it's", ""]) == "echo 'it'\\''s' ''"
    assert command_line(["x" * 130]).endswith("…") and len(command_line(["x" * 130])) == 121


def test_parse_reads_back_what_format_writes() -> None:
    ids = [f"{n:08d}-0000-4000-8000-000000000000" for n in range(4)]
    resolved = [
        dict(item("completed", 0, False, tail="x\r\ny\n"), operation_id=ids[0]),
        dict(item("completed", 143, True), operation_id=ids[1], kill_reason="cancel"),
        dict(item("denied", None, False, message="no"), operation_id=ids[2], denied_by="operator"),
    ]
    running = [
        {"operation_id": ids[3], "command": ["rm", "-rf", "a b"], "running_sec": 5,
         "timeout_sec": 60, "awaiting_approval": True}
    ]
    text = format_report(resolved, running, ["first\nsecond", "third"], 2, "Budget: tokens 1/9")
    parsed = parse_report(text)
    assert parsed["notes"] == ["first\nsecond", "third"]
    assert [(r["operation_id"], r["outcome"], r["exit_code"]) for r in parsed["resolved"]] == [
        (ids[0], "finished", 0), (ids[1], "killed", 143), (ids[2], "denied", None)
    ]
    assert parsed["resolved"][0]["output_tail"] == "x\ny\n"
    assert parsed["running"] == [
        {"operation_id": ids[3], "command_line": "rm -rf 'a b'", "awaiting_approval": True,
         "running": "5s", "timeout_sec": None}
    ]
    assert parsed["more_pending"] == 2 and parsed["budget"] == "Budget: tokens 1/9"


def test_parse_rejects_other_texts() -> None:
    with pytest.raises(ValueError):
        parse_report("hello")


def test_served_reports_render_and_parse_as_the_kernel_wrote_them(
    op: opkernel.Client, new_run
) -> None:
    made = new_run("text", budget={"op_seconds": 100000})
    run_id = made["run_id"]
    ok = op.run_command(run_id, ["sh", "-c", "printf 'a\\r\\nb\\n\\n'; exit 4"], background=True)
    slow = op.run_command(run_id, ["sleep", "300"], background=True, timeout_sec=900)
    doomed = op.run_command(run_id, ["sleep", "200"], background=True)
    wait_until(lambda: op.get_operation(doomed["operation_id"])["status"] == "running")
    op.kill_operation(run_id, doomed["operation_id"])
    op.add_note(run_id, "two\nlines")
    seen = report_with(op, run_id, [ok["operation_id"], doomed["operation_id"]])
    for report in seen:
        assert format_report(**parts_of(report)) == report["text"]
    text = "".join(s["text"] for s in seen)
    parsed = [parse_report(s["text"]) for s in seen]
    outcomes = {r["operation_id"]: r for p in parsed for r in p["resolved"]}
    assert outcomes[ok["operation_id"]]["outcome"] == "finished"
    assert outcomes[ok["operation_id"]]["exit_code"] == 4
    assert outcomes[ok["operation_id"]]["output_tail"] == "a\nb\n"
    assert outcomes[doomed["operation_id"]]["outcome"] == "killed"
    assert any(slow["operation_id"] == r["operation_id"] for p in parsed for r in p["running"])
    assert ["two\nlines"] in [p["notes"] for p in parsed]
    assert all(p["budget"] and p["budget"].startswith("Budget: op_seconds ") for p in parsed)
    assert "Budget: op_seconds" in text
    op.ack_report(run_id, seen[-1]["report_id"])
    empty = op.wait_report(run_id, 0)
    assert format_report(**parts_of(empty)) == empty["text"]
