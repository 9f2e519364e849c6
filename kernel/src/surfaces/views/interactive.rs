//! Views of interactive ops (SPEC §25): what a write to an op's stdin and
//! a read of its output answer.

use serde::{Deserialize, Serialize};

use crate::lifecycle::Status;

/// The answer of `write_stdin` and of a nudge: the output the op produced
/// since the write (until it was quiet a moment, ended, or `yield_ms`
/// passed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StdinAnswer {
    /// The op.
    pub operation_id: String,
    /// Output since the write (UTF-8, invalid bytes replaced; a character
    /// cut at the end waits for the next read).
    pub output: String,
    /// The offset after `output`: pass it to `read_output` for what follows.
    pub next_offset: u64,
    /// The op's status after the wait.
    pub status: Status,
    /// Its exit code once it ended with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Bytes written.
    pub bytes_written: u64,
}

/// The answer of `read_output`: the op's output from an offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputView {
    /// The op.
    pub operation_id: String,
    /// Output from the asked offset (bounded by `max_bytes`; UTF-8,
    /// invalid bytes replaced; a character cut at the end waits for the
    /// next read).
    pub output: String,
    /// The offset after `output`: the next call's `offset`.
    pub next_offset: u64,
    /// The op still runs (more output may come).
    pub running: bool,
    /// Its status.
    pub status: Status,
    /// Its exit code once it ended with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}
