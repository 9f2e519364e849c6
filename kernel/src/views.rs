//! JSON views of ops for the API and the CLI (field names from SPEC §8).

use serde_json::{json, Value};

use crate::report::{bounded_argv, MAX_VIEW_ARGV_BYTES};
use crate::store::{now_ms, Op};

/// RFC 3339 UTC time of a unix-millisecond timestamp.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil-from-days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

pub fn op_json(op: &Op) -> Value {
    let end = op.finished_at.unwrap_or_else(now_ms);
    let started = op.started_at.map(rfc3339);
    let (command, command_truncated) = bounded_argv(&op.command, MAX_VIEW_ARGV_BYTES);
    json!({
        "operation_id": op.id,
        "run_id": op.run_id,
        "command": command,
        "command_truncated": command_truncated,
        "background": op.background,
        "status": op.status.as_str(),
        "exit_code": op.exit_code,
        "killed": op.killed,
        "effect": op.effect,
        "attempt": op.attempt,
        "container_id": op.container_id,
        "pid": op.pid.as_ref().map(|p| p.pid),
        "created_at": rfc3339(op.created_at),
        "started_at": started,
        "heartbeat_at": op.heartbeat_at.map(rfc3339),
        "finished_at": op.finished_at.map(rfc3339),
        "duration_sec": ((end - op.budget_start_ms()).max(0) as f64) / 1000.0,
        "timeout_sec": op.timeout_sec,
        "kill_requested": op.kill_requested_at.is_some(),
        "output_tail": op.output_tail,
        "log_sha256": op.log_sha256,
        "log_size": op.log_size,
        "message": op.error,
        "delivered": op.report_id.is_some() || op.delivered_inline,
        "report_id": op.report_id,
    })
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_910_400_000), "2026-11-29T00:00:00.000Z");
    }
}
