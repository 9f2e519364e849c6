"""The ``[Background operations report]`` text, as the kernel writes it.

``format_report`` renders a report's parts exactly as the kernel does (the
Rust ``report_text::render`` of the ``domain`` crate, plus the closing
``Budget:`` line when one applies), so ``format_report(**parts_of(r))``
equals ``r["text"]`` for a report ``r`` the kernel served. ``parse_report``
reads such a text back into its parts: an agent runtime that only kept the
text (a conversation log, say) can still tell which ops it delivered."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

HEADER = "[Background operations report]"
FOOTER = "Incorporate these results and continue."
#: output lines shown per op
TAIL_LINES = 20
#: bound of a report's text (bytes); tails that would pass it are left out
MAX_REPORT_TEXT = 64 * 1024
#: still-running ops listed by name
MAX_RUNNING_LINES = 50

_PLAIN = re.compile(r"[A-Za-z0-9\-_./=:,@%+]+")
# what Rust's `char::is_whitespace` calls white space (Unicode White_Space)
_RUST_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000")
_RUST_SPACE.update(chr(c) for c in range(0x2000, 0x200B))


def human_duration(secs: int) -> str:
    """``4m12s``, ``12s``, ``1h02m05s``."""
    h, m, s = secs // 3600, (secs % 3600) // 60, secs % 60
    if h == 0 and m == 0:
        return f"{s}s"
    if h == 0:
        return f"{m}m{s:02d}s"
    return f"{h}h{m:02d}m{s:02d}s"


def command_line(command: Sequence[str]) -> str:
    """A shell-like one-line rendering of an argv, cut at 120 characters."""
    quoted = [a if _PLAIN.fullmatch(a) else "'" + a.replace("'", "'\\''") + "'" for a in command]
    joined = " ".join(quoted)
    return joined[:120] + "…" if len(joined) > 120 else joined


def _round(x: float) -> int:
    # Rust's f64::round: halves away from zero
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def _code(item: Mapping[str, Any]) -> str:
    code = item.get("exit_code")
    return "?" if code is None else str(code)


def _headline(item: Mapping[str, Any]) -> str:
    op, status, message = item["operation_id"], item["status"], item.get("message")
    took = human_duration(_round(float(item.get("duration_sec", 0.0))))
    if status == "completed" and item.get("killed"):
        cancelled = " (run cancelled)" if item.get("kill_reason") == "cancel" else ""
        return f"- {op} killed{cancelled}: exit_code={_code(item)} ({took})"
    if status == "completed":
        return f"- {op} finished: exit_code={_code(item)} ({took})"
    if status == "timed_out":
        return f"- {op} timed out after {item['timeout_sec']}s (killed)"
    if status == "lost":
        return f"- {op} lost: {message or 'no exit code recorded'} (effect uncertain)"
    if status == "failed":
        return f"- {op} failed to start: {message or 'unknown error'} (nothing ran)"
    if status == "denied" and item.get("denied_by") == "operator":
        return f"- {op} denied by operator: {message or 'no reason given'}"
    if status == "denied":
        return f"- {op} denied: {message or 'not approved'} (nothing ran)"
    if status == "awaiting_approval":
        return f"- {op} is awaiting approval"
    return f"- {op} is still running"


def resolution_line(item: Mapping[str, Any]) -> str:
    """The line of one resolved op, with its stopped leftovers if any."""
    line = _headline(item)
    left = int(item.get("leftovers", 0) or 0)
    if left == 1:
        line += " (1 leftover process stopped)"
    elif left > 1:
        line += f" ({left} leftover processes stopped)"
    return line


def _tail_lines(tail: str) -> List[str]:
    # Rust: tail.trim_end_matches('\n').lines() (a "\r\n" ends a line too)
    text = tail.rstrip("\n")
    if not text:
        return []
    pieces = text.split("\n")
    return [p[:-1] if p.endswith("\r") else p for p in pieces[:-1]] + [pieces[-1]]


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _resolved_block(out: str, item: Mapping[str, Any]) -> str:
    tail = item.get("output_tail")
    if not tail or all(ch in _RUST_SPACE for ch in tail):
        return ""
    lines = _tail_lines(tail)[-TAIL_LINES:]
    block = "".join(f"  {line}\n" for line in lines)
    if _size(out) + _size(block) > MAX_REPORT_TEXT:
        return (
            "  (output tail left out to keep this report short; "
            f"see `opkernel logs {item['operation_id']}`)\n"
        )
    return "  output tail:\n" + block


def _running_line(r: Mapping[str, Any]) -> str:
    op, cmd = r["operation_id"], command_line(r["command"])
    took = human_duration(int(r["running_sec"]))
    if r.get("awaiting_approval"):
        return (
            f"- {op} `{cmd}` (awaiting approval for {took}; "
            "it starts only if an operator approves it)\n"
        )
    return f"- {op} `{cmd}` (running {took}, timeout {r['timeout_sec']}s)\n"


def format_report(
    resolved: Sequence[Mapping[str, Any]] = (),
    running: Sequence[Mapping[str, Any]] = (),
    notes: Sequence[str] = (),
    more_pending: int = 0,
    budget: Optional[str] = None,
) -> str:
    """The report text of these parts, as the kernel renders it (``budget``:
    the closing ``Budget: ...`` line, when the run has a budget)."""
    out = HEADER + "\n"
    if notes:
        out += "Notes from the user:\n"
        out += "".join("- " + n.replace("\n", "\n  ") + "\n" for n in notes)
    for item in resolved:
        out += resolution_line(item) + "\n"
        out += _resolved_block(out, item)
    if more_pending > 0:
        out += (
            f"({more_pending} more results or notes wait for the next report: "
            "ask for it right after this one.)\n"
        )
    if running:
        out += "Still running in the background:\n"
        out += "".join(_running_line(r) for r in running[:MAX_RUNNING_LINES])
        if len(running) > MAX_RUNNING_LINES:
            extra = len(running) - MAX_RUNNING_LINES
            out += f"- … and {extra} more (see `opkernel ps`)\n"
    out += FOOTER + "\n"
    if budget:
        out += budget.rstrip("\n") + "\n"
    return out


def parts_of(report: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``format_report`` arguments of a report the kernel served (its
    ``Budget:`` line taken from its text)."""
    return {
        "resolved": report.get("resolved", []),
        "running": report.get("running", []),
        "notes": report.get("notes", []),
        "more_pending": report.get("more_pending", 0),
        "budget": parse_report(report["text"])["budget"],
    }


_RESOLVED = re.compile(
    r"^- (?P<id>[0-9a-f-]{36}) (?P<what>finished|killed(?: \(run cancelled\))?|timed out"
    r"|lost|failed to start|denied by operator|denied|is awaiting approval|is still running)"
    r"(?P<rest>.*)$"
)
_RUNNING = re.compile(
    r"^- (?P<id>[0-9a-f-]{36}) `(?P<command>.*)` \((?:running (?P<running>\S+), timeout "
    r"(?P<timeout>\d+)s|awaiting approval for (?P<waiting>\S+);.*)\)$"
)
_EXIT = re.compile(r"exit_code=(-?\d+)")
_OUTCOMES = {
    "finished": "finished",
    "killed": "killed",
    "timed out": "timed_out",
    "lost": "lost",
    "failed to start": "failed",
    "denied by operator": "denied",
    "denied": "denied",
    "is awaiting approval": "awaiting_approval",
    "is still running": "running",
}


def _resolved_entry(match: "re.Match[str]") -> Dict[str, Any]:
    what = match.group("what")
    code = _EXIT.search(match.group("rest"))
    return {
        "operation_id": match.group("id"),
        "outcome": _OUTCOMES.get(what.split(" (")[0], what),
        "exit_code": int(code.group(1)) if code else None,
        "line": match.group(0),
        "output_tail": None,
    }


def _running_entry(match: "re.Match[str]") -> Dict[str, Any]:
    waiting = match.group("waiting")
    return {
        "operation_id": match.group("id"),
        "command_line": match.group("command"),
        "awaiting_approval": waiting is not None,
        "running": waiting or match.group("running"),
        "timeout_sec": int(match.group("timeout")) if match.group("timeout") else None,
    }


def parse_report(text: str) -> Dict[str, Any]:
    """The parts of a report text: ``notes``, ``resolved`` (each with
    ``operation_id``, ``outcome`` — ``finished``, ``killed``, ``timed_out``,
    ``lost``, ``failed``, ``denied`` —, ``exit_code``, ``line``
    and ``output_tail``), ``running`` (``operation_id``, ``command_line``,
    ``awaiting_approval``, ``running``, ``timeout_sec``), ``more_pending``
    and ``budget`` (the ``Budget:`` line or ``None``)."""
    lines = text.split("\n")
    if not lines or lines[0] != HEADER:
        raise ValueError("not a [Background operations report] text")
    parsed: Dict[str, Any] = {
        "notes": [], "resolved": [], "running": [], "more_pending": 0, "budget": None
    }
    section, tail = "resolved", None
    for line in lines[1:]:
        section, tail = _parse_line(parsed, section, tail, line)
    for entry in parsed["resolved"]:
        if entry["output_tail"] is not None:
            entry["output_tail"] = "\n".join(entry["output_tail"]) + "\n"
    return parsed


def _parse_line(parsed: Dict[str, Any], section: str, tail: Any, line: str) -> Tuple[str, Any]:
    if line == "Notes from the user:":
        return "notes", None
    if line == "Still running in the background:":
        return "running", None
    if line == FOOTER:
        return "end", None
    if section == "end":
        if line.startswith("Budget: "):
            parsed["budget"] = line
        return section, None
    if section == "notes" and line.startswith("- ") and not _RESOLVED.match(line):
        parsed["notes"].append(line[2:])
        return section, None
    if section == "notes" and line.startswith("  ") and parsed["notes"]:
        parsed["notes"][-1] += "\n" + line[2:]
        return section, None
    return _parse_op_line(parsed, section, tail, line)


def _parse_op_line(
    parsed: Dict[str, Any], section: str, tail: Any, line: str
) -> Tuple[str, Any]:
    more = re.match(r"^\((\d+) more results or notes wait", line)
    if more:
        parsed["more_pending"] = int(more.group(1))
        return section, None
    resolved = _RESOLVED.match(line)
    if resolved and section in ("notes", "resolved"):
        parsed["resolved"].append(_resolved_entry(resolved))
        return "resolved", None
    running = _RUNNING.match(line)
    if running and section == "running":
        parsed["running"].append(_running_entry(running))
        return section, None
    if line == "  output tail:" and parsed["resolved"]:
        tail = []
        parsed["resolved"][-1]["output_tail"] = tail
        return section, tail
    if tail is not None and line.startswith("  "):
        tail.append(line[2:])
    return section, tail
