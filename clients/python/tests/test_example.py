"""The example agent loop runs against the live kernel and folds both
background results into its conversation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agent_loop.py"


def test_the_example_agent_loop_folds_its_reports(kernel) -> None:
    env = dict(os.environ, OPKERNEL_URL=kernel[0], OPKERNEL_TOKEN=kernel[1])
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    reports = out.stdout.split("--- user\n")[2:]
    folded = "".join(reports)
    assert folded.count("[Background operations report]") == len(reports) >= 1
    assert "build ok" in folded and "12 tests passed" in folded
    assert "Started in background as operation" in out.stdout
    assert "CHANGELOG.md" in out.stdout
