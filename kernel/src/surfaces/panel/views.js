// @ts-check
// The API's bodies as the panel reads them: JSDoc types mirroring the Rust
// views (kernel/src/surfaces/views/*.rs; field names from the SPEC). Types only:
// nothing here runs, and no module imports it at run time.

/**
 * `GET /v1/whoami`.
 * @typedef {object} Whoami
 * @property {"operator" | "run"} principal
 * @property {string | null} run_id the token's run (a run token)
 */

/**
 * The API's one error shape: `{"error": {"code", "message"}}`.
 * @typedef {object} ErrorBody
 * @property {{code: string, message: string}} error
 */

/**
 * An op's approval hold and its decision (ApprovalView).
 * @typedef {object} ApprovalView
 * @property {string} rule
 * @property {number | null} timeout_sec
 * @property {string | null} on_timeout
 * @property {string | null} escalated_at
 * @property {string | null} decided_by `operator`, `timeout` or `kill`
 * @property {string | null} decided_at
 */

/**
 * An op as the API shows it (OpView).
 * @typedef {object} OpView
 * @property {string} operation_id
 * @property {string} run_id
 * @property {string[]} command
 * @property {boolean} command_truncated
 * @property {boolean} background
 * @property {string} status starting, running, awaiting_approval, or a terminal status
 * @property {boolean} [live] still starting or running (server-derived; absent on older kernels)
 * @property {number | null} exit_code
 * @property {boolean} killed
 * @property {string | null} effect
 * @property {number} attempt
 * @property {string | null} container_id
 * @property {number | null} pid
 * @property {string} created_at
 * @property {string | null} started_at
 * @property {string | null} heartbeat_at
 * @property {string | null} finished_at
 * @property {number} duration_sec
 * @property {number} timeout_sec
 * @property {boolean} kill_requested
 * @property {string | null} output_tail
 * @property {string | null} log_sha256
 * @property {number | null} log_size
 * @property {number | null} cpu_ms
 * @property {number | null} max_rss_kb
 * @property {number} leftovers_stopped
 * @property {string | null} message
 * @property {boolean} delivered
 * @property {string | null} report_id
 * @property {string} [output] a foreground op's output (in its reply only)
 * @property {ApprovalView} [approval] the hold, for an op an approval rule matched
 * @property {string} [schedule_id] the schedule that fired it
 * @property {Origin} [origin] where it came from (SPEC §28)
 * @property {boolean} [stdin] its stdin is open to write_stdin
 * @property {boolean} [tty] it runs on a terminal
 */

/**
 * Where a run or an op came from (SPEC §28).
 * @typedef {object} Origin
 * @property {"http" | "cli" | "mcp" | "panel" | "schedule"} surface
 * @property {string} channel the client, its version and session; the schedule's id
 * @property {string} principal `operator` or `run:<id>`
 */

/**
 * `GET /v1/ops` and `GET /v1/approvals` (OpList).
 * @typedef {object} OpList
 * @property {OpView[]} operations
 */

/**
 * `GET /v1/operations/{id}/console`, event `output`.
 * @typedef {object} ConsoleOutput
 * @property {number} offset the log's byte offset after this text
 * @property {string} text
 */

/**
 * `GET /v1/operations/{id}/console`, event `done` (the op is terminal).
 * @typedef {object} ConsoleDone
 * @property {string} status
 * @property {string} [operation_id]
 * @property {number | null} [exit_code]
 * @property {boolean} [killed]
 * @property {string | null} [effect]
 * @property {string | null} [message]
 */

/**
 * A managed container as the operator sees it (ContainerView).
 * @typedef {object} ContainerView
 * @property {string} container_id
 * @property {string} name
 * @property {string} state
 * @property {string | null} run_id the run it serves (by label, or the run that adopted it)
 * @property {string | null} pool warm pool role: free, making, adopting, bound, unconfirmed, stray; null otherwise
 * @property {string | null} scratch_key
 * @property {string | null} run_fingerprint
 * @property {string | null} created_at
 * @property {boolean} registered in this kernel's registry of run containers
 */

/**
 * `GET /v1/containers` (ContainerList).
 * @typedef {object} ContainerList
 * @property {ContainerView[]} containers
 */

/**
 * `GET /v1/containers/{id}` (ContainerInspect).
 * @typedef {object} ContainerInspect
 * @property {string} container_id
 * @property {string} name
 * @property {string} state
 * @property {Object<string, string>} labels
 * @property {string | null} fingerprint
 * @property {{image: string, memory_bytes: number, cpus: number, pids_limit: number, network: string,
 *   run_as: string | null} | null} profile
 * @property {string | null} run_id
 * @property {{operation_id: string, status: string, age_ms: number, exit_code: number | null,
 *   command: string}[]} ops
 * @property {{pid: number, operation_id: string, user: string, cpu: number, rss: number, age: number,
 *   command: string}[] | null} processes
 * @property {string | null} processes_error
 * @property {number | null} scratch_bytes
 * @property {{verdict: "keep" | "remove", reason: string}} reaper
 */

/**
 * One of the reaper's decisions (ReapDecision).
 * @typedef {object} ReapDecision
 * @property {string} container_id
 * @property {string} name
 * @property {string | null} run_id
 * @property {"keep" | "remove"} action
 * @property {string} reason
 * @property {boolean} removed never in a dry run
 */

/**
 * `POST /v1/reap?dry_run=true` (ReapList).
 * @typedef {object} ReapList
 * @property {boolean} dry_run
 * @property {ReapDecision[]} decisions
 */

/**
 * Budget limits or amounts, keyed by the limit names (op_seconds,
 * cpu_seconds, tokens, cost_micros); a limit the budget does not set is absent.
 * @typedef {Object<string, number>} Budget
 */

/**
 * A run in `GET /v1/runs`.
 * @typedef {object} RunSummary
 * @property {string} run_id
 * @property {string | null} parent_run_id
 * @property {number} depth
 * @property {"active" | "paused" | "completed" | "cancelled"} state
 * @property {number} live_ops
 * @property {Budget} budget
 * @property {number} created_at milliseconds since the epoch
 */

/**
 * `GET /v1/runs`.
 * @typedef {object} RunList
 * @property {RunSummary[]} runs
 */

/**
 * A run as `GET /v1/runs/{run}` shows it (RunView).
 * @typedef {object} RunView
 * @property {string} run_id
 * @property {"active" | "paused" | "completed" | "cancelled"} state
 * @property {string | null} parent_run_id
 * @property {string[]} chain
 * @property {string} principal
 * @property {{run_id: string, state: string}[]} children
 * @property {object} envelope
 * @property {Budget} budget
 * @property {Budget} used over the run and its descendants
 * @property {Budget} remaining of the run's own limits
 * @property {number} created_at milliseconds since the epoch
 * @property {number | null} state_changed_at
 * @property {string | null} summary
 * @property {string | null} decided_by
 */

/**
 * One event of a run's trace (the store's Event).
 * @typedef {object} EventView
 * @property {number} seq
 * @property {number} at milliseconds since the epoch
 * @property {string} kind
 * @property {string | null} operation_id
 * @property {*} data the kind's payload
 */

/**
 * `GET /v1/runs/{run}/events`.
 * @typedef {object} EventPage
 * @property {string} run_id
 * @property {EventView[]} events
 * @property {number} next_after
 * @property {number} last_seq where a reader that wants only what comes next starts
 */

/**
 * A report as it was served, in `GET /v1/runs/{run}/reports`.
 * @typedef {object} ReportSummary
 * @property {string} report_id
 * @property {string} created_at
 * @property {string | null} acked_at
 * @property {number} resolved results in the report
 * @property {string} text
 */

/**
 * `GET /v1/runs/{run}/reports`.
 * @typedef {object} ReportList
 * @property {string} run_id
 * @property {ReportSummary[]} reports
 */

/**
 * A schedule as the API shows it (ScheduleView).
 * @typedef {object} ScheduleView
 * @property {string} schedule_id
 * @property {string} run_id
 * @property {string[]} command
 * @property {number} timeout_sec
 * @property {string} [cron]
 * @property {number} [every_sec]
 * @property {string} [at]
 * @property {"waiting" | "running" | "paused" | "done"} [state] server-derived; absent on older kernels
 * @property {string} [when] the timing as text, server-derived; absent on older kernels
 * @property {boolean} catch_up
 * @property {boolean} delete_after_success
 * @property {boolean} enabled
 * @property {boolean} paused
 * @property {string | null} next_due_at
 * @property {string | null} current_operation_id the op its current due time fired, while it lives
 * @property {string | null} last_due_at
 * @property {string | null} last_operation_id
 * @property {string | null} last_status
 * @property {number | null} last_exit_code
 * @property {string | null} last_output_tail
 * @property {string | null} last_finished_at
 * @property {string} created_at
 */

/**
 * `GET /v1/schedules`.
 * @typedef {object} ScheduleList
 * @property {ScheduleView[]} schedules
 */

export {};
