"""The live kernel these tests talk to: ``OPKERNEL_URL`` and
``OPKERNEL_OPERATOR_TOKEN`` must be set (a missing one fails every test
that needs the kernel; nothing is skipped). Runs made here are named
``pyc-<tag>-<random>`` and cancelled at the end."""

from __future__ import annotations

import os
import time
import uuid
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

import opkernel

_made: List[str] = []


@pytest.fixture(scope="session")
def kernel() -> Tuple[str, str]:
    url = os.environ.get("OPKERNEL_URL")
    token = os.environ.get("OPKERNEL_OPERATOR_TOKEN")
    if not url or not token:
        pytest.fail("OPKERNEL_URL and OPKERNEL_OPERATOR_TOKEN must name a live kernel")
    return url, token.strip()


@pytest.fixture(scope="session")
def op(kernel: Tuple[str, str]) -> Iterator[opkernel.Client]:
    """The operator's client."""
    client = opkernel.Client(*kernel, timeout=30.0)
    yield client
    # tidy: every run made here is cancelled and finished, so the kernel's
    # reaper removes its container ("run finished and no op is live")
    for run_id in _made:
        for end in (client.cancel_run, client.finish):
            try:
                end(run_id)
            except opkernel.OpkernelError:
                pass
    client.close()


def fresh_id(tag: str) -> str:
    return f"pyc-{tag}-{uuid.uuid4().hex[:8]}"


def remember(run_id: str) -> str:
    """Marks a run made outside ``new_run`` for the cleanup at the end."""
    _made.append(run_id)
    return run_id


@pytest.fixture(scope="session")
def new_run(op: opkernel.Client) -> Callable[..., Dict[str, str]]:
    """Creates a top-level run: ``{"run_id", "token"}``."""

    def make(tag: str, **options) -> Dict[str, str]:
        created = op.create_run(fresh_id(tag), **options)
        remember(created["run_id"])
        return {"run_id": created["run_id"], "token": created["token"]}

    return make


@pytest.fixture(scope="module")
def run(new_run: Callable[..., Dict[str, str]]) -> Dict[str, str]:
    """One run shared by a module's tests."""
    return new_run("mod")


@pytest.fixture()
def agent(kernel: Tuple[str, str], run: Dict[str, str]) -> Iterator[opkernel.Client]:
    """A client acting with the module run's own token, as an agent does."""
    client = opkernel.Client(kernel[0], run["token"])
    yield client
    client.close()


def wait_until(check: Callable[[], object], timeout: float = 30.0, what: str = "it") -> object:
    """Polls ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(0.2)


def report_with(client: opkernel.Client, run_id: str, op_ids: List[str], wait_sec: int = 60):
    """Waits for a report (unacked, so it is served again until acked)
    delivering every op of ``op_ids``; returns the reports seen, acking
    each one that does not hold them all."""
    seen = []
    deadline = time.monotonic() + wait_sec
    while time.monotonic() < deadline:
        report = client.wait_report(run_id, 10)
        if report["report_id"] is None:
            continue
        seen.append(report)
        delivered = {r["operation_id"] for s in seen for r in s["resolved"]}
        if set(op_ids) <= delivered:
            return seen
        client.ack_report(run_id, report["report_id"])
    raise AssertionError(f"no report delivered {op_ids} within {wait_sec}s")
