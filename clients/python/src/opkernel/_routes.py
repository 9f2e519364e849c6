"""Every (method, path template) the client calls, in one table.

The path templates are the OpenAPI document's (`GET /v1/openapi.json`),
parameter names included, so the contract test can compare this table with
the live document in both directions.
"""

from __future__ import annotations

from typing import Dict, Tuple

#: route name -> (HTTP method, path template as the OpenAPI document says it)
ROUTES: Dict[str, Tuple[str, str]] = {
    # the kernel
    "health": ("GET", "/v1/health"),
    "whoami": ("GET", "/v1/whoami"),
    "tools": ("GET", "/v1/tools"),
    "openapi": ("GET", "/v1/openapi.json"),
    "metrics": ("GET", "/metrics"),
    "list_images": ("GET", "/v1/images"),
    # runs and their tokens
    "create_run": ("POST", "/v1/runs"),
    "list_runs": ("GET", "/v1/runs"),
    "get_run": ("GET", "/v1/runs/{run}"),
    "pause_run": ("POST", "/v1/runs/{run}/pause"),
    "resume_run": ("POST", "/v1/runs/{run}/resume"),
    "cancel_run": ("POST", "/v1/runs/{run}/cancel"),
    "complete_run": ("POST", "/v1/runs/{run}/complete"),
    "record_usage": ("POST", "/v1/runs/{run}/usage"),
    "change_network": ("POST", "/v1/runs/{run}/network"),
    "make_snapshot": ("POST", "/v1/runs/{run}/snapshots"),
    "list_snapshots": ("GET", "/v1/runs/{run}/snapshots"),
    # events, reports, notes, finish
    "get_events": ("GET", "/v1/runs/{run}/events"),
    "events_stream": ("GET", "/v1/runs/{run}/events/stream"),
    "list_reports": ("GET", "/v1/runs/{run}/reports"),
    "wait_report": ("GET", "/v1/runs/{run}/report"),
    "ack_report": ("POST", "/v1/runs/{run}/report/{report_id}/ack"),
    "add_note": ("POST", "/v1/runs/{run}/notes"),
    "finish": ("POST", "/v1/runs/{run}/finish"),
    # schedules
    "create_schedule": ("POST", "/v1/runs/{run}/schedules"),
    "list_run_schedules": ("GET", "/v1/runs/{run}/schedules"),
    "list_all_schedules": ("GET", "/v1/schedules"),
    "get_schedule": ("GET", "/v1/runs/{run}/schedules/{id}"),
    "delete_schedule": ("DELETE", "/v1/runs/{run}/schedules/{id}"),
    "pause_schedule": ("POST", "/v1/runs/{run}/schedules/{id}/pause"),
    "resume_schedule": ("POST", "/v1/runs/{run}/schedules/{id}/resume"),
    # files and workspaces
    "upload_file": ("PUT", "/v1/runs/{run}/files/{path}"),
    "download_file": ("GET", "/v1/runs/{run}/files/{path}"),
    "delete_file": ("DELETE", "/v1/runs/{run}/files/{path}"),
    "upload_archive": ("PUT", "/v1/runs/{run}/archive/{path}"),
    "download_archive": ("GET", "/v1/runs/{run}/archive/{path}"),
    "read_file": ("POST", "/v1/runs/{run}/tools/read_file"),
    "write_file": ("POST", "/v1/runs/{run}/tools/write_file"),
    "list_dir": ("POST", "/v1/runs/{run}/tools/list_dir"),
    # operations
    "run_command": ("POST", "/v1/runs/{run}/tools/run_command"),
    "run_oneshot": ("POST", "/v1/tools/run_command"),
    "kill_operation": ("POST", "/v1/runs/{run}/tools/kill_operation"),
    "write_stdin": ("POST", "/v1/runs/{run}/tools/write_stdin"),
    "read_output": ("POST", "/v1/runs/{run}/tools/read_output"),
    "resize_tty": ("POST", "/v1/runs/{run}/tools/resize_tty"),
    "nudge": ("POST", "/v1/operations/{id}/nudge"),
    "get_operation": ("GET", "/v1/operations/{id}"),
    "get_log": ("GET", "/v1/operations/{id}/log"),
    "console": ("GET", "/v1/operations/{id}/console"),
    "list_ops": ("GET", "/v1/ops"),
    # approvals
    "list_approvals": ("GET", "/v1/approvals"),
    "approve": ("POST", "/v1/operations/{id}/approve"),
    "deny": ("POST", "/v1/operations/{id}/deny"),
    # the operators' views
    "list_containers": ("GET", "/v1/containers"),
    "inspect": ("GET", "/v1/containers/{id}"),
    "reap": ("POST", "/v1/reap"),
    "list_nodes": ("GET", "/v1/nodes"),
    "drain_node": ("POST", "/v1/nodes/{name}/drain"),
    "activate_node": ("POST", "/v1/nodes/{name}/activate"),
}
