"""One MCP stdio session (the official client) whose `run_command` is sent
while the kernel is down: `opkernel mcp` retries it with one key until the
kernel is back (issue 36 item 18). Driven by tests/tests/mcp.rs: prints
"ready" once connected, waits for a line on stdin, then calls the tool and
prints its structured result as JSON."""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters

URL = os.environ["OPKERNEL_URL"].rstrip("/")


async def main():
    params = StdioServerParameters(
        command=os.environ["OPKERNEL_BIN"],
        args=["mcp", "--run", os.environ["RUN"]],
        env={**os.environ, "OPKERNEL_URL": URL, "OPKERNEL_TOKEN": os.environ["RUN_TOKEN"]},
    )
    async with Client(params) as c:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        side = "echo once >> /scratch/side; wc -l < /scratch/side"
        r = await c.call_tool("run_command", {"command": ["sh", "-c", side]})
        print(json.dumps({"error": r.is_error, "result": r.structured_content}), flush=True)


asyncio.run(main())
