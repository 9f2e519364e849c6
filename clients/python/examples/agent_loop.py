"""A minimal agent loop on opkernel: start background work, keep going with
other work, and fold each `[Background operations report]` into the
conversation as a follow-up message, acking it once it is there.

The "model" here is a fixed plan (no LLM call), so the loop runs anywhere:

    OPKERNEL_URL=http://127.0.0.1:7878 OPKERNEL_TOKEN=... python agent_loop.py

With the operator token it makes a run of its own (and cancels it at the
end); with a run token it works in that run. A real runtime would send the
conversation to its model where `plan` is and run the tool calls it asks for.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Dict, List, Mapping, Set

import opkernel
from opkernel.reports import parse_report

Message = Dict[str, str]


def tool_call(
    conversation: List[Message], name: str, arguments: Dict[str, Any], answer: Mapping[str, Any]
) -> None:
    """Records a tool call and its answer, as a model's transcript holds them."""
    conversation.append({"role": "assistant", "content": f"{name}({json.dumps(arguments)})"})
    shown = answer.get("message") or answer.get("output") or json.dumps(answer)
    conversation.append({"role": "tool", "content": shown})


def start(client: opkernel.Client, run_id: str, conversation: List[Message], argv: List[str]) -> str:
    """A background start: the answer comes at once with the op's id."""
    answer = client.run_command(run_id, argv, background=True, timeout_sec=300)
    tool_call(conversation, "run_command", {"command": argv, "background": True}, answer)
    return answer["operation_id"]


def fold_reports(
    client: opkernel.Client, run_id: str, conversation: List[Message], pending: Set[str]
) -> None:
    """Waits for reports until every pending op is resolved; each report
    becomes one user message, then is acked (so it is never served twice,
    and never lost: an unacked report is served again)."""
    while pending:
        report = client.wait_report(run_id, wait_sec=30)
        if report["report_id"] is None:
            continue  # nothing resolved in 30 s: a real agent would keep working here
        conversation.append({"role": "user", "content": report["text"]})
        client.ack_report(run_id, report["report_id"])
        for resolved in parse_report(report["text"])["resolved"]:
            pending.discard(resolved["operation_id"])


def plan(client: opkernel.Client, run_id: str, conversation: List[Message]) -> Set[str]:
    """What a model would decide: two slow jobs in the background, then
    foreground work while they run."""
    pending = {
        start(client, run_id, conversation, ["sh", "-c", "sleep 3; echo build ok"]),
        start(client, run_id, conversation, ["sh", "-c", "sleep 1; echo 12 tests passed"]),
    }
    notes = ["write the changelog while the build runs"]
    client.write_file(run_id, "/scratch/CHANGELOG.md", "\n".join(notes) + "\n")
    listing = client.run_command(run_id, ["ls", "-l", "/scratch"])
    tool_call(conversation, "run_command", {"command": ["ls", "-l", "/scratch"]}, listing)
    return pending


def main() -> None:
    with opkernel.Client() as given:  # OPKERNEL_URL, OPKERNEL_TOKEN (and OPKERNEL_CA)
        me = given.whoami()
        own_run = me["principal"] == "operator"
        run_id = f"example-{uuid.uuid4().hex[:8]}" if own_run else me["run_id"]
        token = given.create_run(run_id)["token"] if own_run else given.token
        client = given.with_token(token)
    conversation: List[Message] = [{"role": "user", "content": "Build the project and test it."}]
    began = time.monotonic()
    try:
        pending = plan(client, run_id, conversation)
        fold_reports(client, run_id, conversation, pending)
    finally:
        if own_run:
            client.cancel_run(run_id)
        client.close()
    for message in conversation:
        print(f"--- {message['role']}\n{message['content'].rstrip()}")
    print(f"--- done in {time.monotonic() - began:.1f}s")


if __name__ == "__main__":
    main()
