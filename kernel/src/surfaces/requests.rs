//! The request bodies of the HTTP API: the one definition the handlers
//! parse and the CLI and MCP send (the answers are in `views`). Their
//! limits beyond what a type says are checked by the handlers.

use serde::{Deserialize, Serialize};

use crate::runs::{Budget, EnvelopeRequest};

/// The body of `run_command` (`POST /v1/runs/{run}/tools/run_command`,
/// `POST /v1/tools/run_command`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// The argv (no shell unless it names one).
    #[schema(schema_with = crate::surfaces::api::schema::argv)]
    pub command: Vec<String>,
    /// Run in the background: the answer is the op's id at once, its
    /// result comes in a report.
    #[serde(default)]
    pub background: bool,
    /// Seconds from the command's start (at least 1; at most the kernel's
    /// ceiling: 900 in the foreground and 3600 in the background by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub timeout_sec: Option<u64>,
    /// Keep the command's stdin open: write to it with `write_stdin` (a
    /// REPL, a prompt to answer); without it stdin is `/dev/null`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// Run it on a terminal (`true`: 24x80, or a size): programs that
    /// need one (`bash -i`, editors, `top`); implies `stdin`. Its output
    /// is the terminal's stream (input echoed, CRLF line ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<Tty>,
    /// Foreground only: answer after this many ms if it has not ended,
    /// with its output so far and `running: true`; it goes on as a
    /// background op whose result comes in a report. Default for a
    /// foreground op with stdin or a terminal: 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 600000)]
    pub yield_ms: Option<u64>,
}

/// `tty`: a terminal (24x80) or none, or a terminal of a size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Tty {
    /// `true`: a 24x80 terminal; `false`: none.
    On(bool),
    /// A terminal of this size.
    Size(TtySize),
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TtySize {
    /// Rows (1 to 1000).
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: u16,
    /// Columns (1 to 1000).
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: u16,
}

/// The body of `kill_operation` (`POST /v1/runs/{run}/tools/kill_operation`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillOperation {
    /// The op to kill (a lowercase UUID).
    #[schema(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub operation_id: String,
    /// Send only this signal to the op's foreground process group (on a
    /// terminal, `INT` is Ctrl-C) and answer; the op ends only if the
    /// command does. Without it: TERM, a grace, then KILL, and the op ends
    /// killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<SignalName>,
}

/// A signal an agent may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum SignalName {
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGTERM.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hup,
    /// SIGQUIT (Ctrl-\).
    Quit,
    /// SIGUSR1.
    Usr1,
    /// SIGUSR2.
    Usr2,
}

impl SignalName {
    /// The shim's signal.
    pub fn signal(self) -> sandbox::Signal {
        use sandbox::Signal;
        match self {
            SignalName::Int => Signal::Int,
            SignalName::Term => Signal::Term,
            SignalName::Kill => Signal::Kill,
            SignalName::Hup => Signal::Hup,
            SignalName::Quit => Signal::Quit,
            SignalName::Usr1 => Signal::Usr1,
            SignalName::Usr2 => Signal::Usr2,
        }
    }
}

/// The body of `write_stdin` (`POST /v1/runs/{run}/tools/write_stdin`):
/// `text` or `data_base64` (or neither, with `eof`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteStdin {
    /// The op started with `stdin` or `tty`.
    #[schema(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub operation_id: String,
    /// Text to write, as is (add `\n` to end a line; on a terminal `\r`
    /// is Enter, `\u0003` Ctrl-C, `\u0004` Ctrl-D).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Bytes to write, base64 (instead of `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Close stdin after the bytes (a terminal gets Ctrl-D).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eof: bool,
    /// How long to wait for output after the write, ms (default 1000, at
    /// most 30000): the answer comes once the output has been quiet a
    /// moment, the op ended, or this passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 30000)]
    pub yield_ms: Option<u64>,
}

/// The body of `read_output` (`POST /v1/runs/{run}/tools/read_output`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOutput {
    /// Any op of the run (or of its descendants).
    #[schema(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub operation_id: String,
    /// Byte offset in its output to read from (default 0; pass the last
    /// answer's `next_offset` to read only what is new).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// While nothing is new past `offset` and it runs, wait up to this
    /// many ms (default 0, at most 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 30000)]
    pub wait_ms: Option<u64>,
    /// Bytes at most (default 65536, at most 1048576).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1048576)]
    pub max_bytes: Option<u64>,
}

/// The body of `resize_tty` (`POST /v1/runs/{run}/tools/resize_tty`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeTty {
    /// An op started with `tty`.
    #[schema(pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub operation_id: String,
    /// Rows (1 to 1000).
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: u16,
    /// Columns (1 to 1000).
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: u16,
}

/// The body of `POST /v1/operations/{id}/nudge` (seed 002).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Nudge {
    /// One line for the command (a newline is added; 1 to 4096 bytes, no
    /// NUL, no newline).
    #[schema(min_length = 1, max_length = 4096, pattern = r"^[^\u0000\n]+$")]
    pub text: String,
}

/// The body of `POST /v1/operations/{id}/deny`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Deny {
    /// Why, for the run's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The body of `POST /v1/runs`: a top-level run (operator) or a child of
/// the token's run, whose envelope and budget only narrow the parent's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The new run's id.
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    pub run_id: String,
    /// Its envelope (a child's: within its parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<EnvelopeRequest>,
    /// Its budget (a child's: within what its parent has left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Its image, by the operator's name (`GET /v1/images`); fixed for its
    /// life. A child inherits its parent's unless it names one its
    /// parent's envelope `images` allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^[a-z0-9_.-]{1,64}$")]
    pub image: Option<String>,
    /// Start with a copy of this run's workspace (`/scratch`, never its
    /// `.ops`): `RUN` or `RUN@SNAPSHOT`. A run token may fork its own run
    /// or its parent; the operator any run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}(@[A-Za-z0-9_.-]{1,64})?$")]
    pub fork_from: Option<String>,
    /// Freeze the source run's container while its workspace is copied
    /// (a consistent copy; its commands pause meanwhile).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consistent: bool,
}

/// The body of `POST /v1/runs/{run}/network` (SPEC §27).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeNetwork {
    /// The run's allow list from now on: a run token may only drop
    /// entries or narrow them; the operator may also widen.
    pub allow: Vec<String>,
}

/// The body of `POST /v1/runs/{run}/snapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeSnapshot {
    /// Its name, unique in the run.
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    pub name: String,
    /// Freeze the run's container during the copy.
    #[serde(default)]
    pub consistent: bool,
}

/// The body of `POST /v1/runs/{run}/complete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Complete {
    /// What the run achieved (1 to 16384 bytes, no NUL).
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = r"^[^\u0000]*\S[^\u0000]*$"
    )]
    pub summary: String,
}

/// The body of `POST /v1/runs/{run}/usage`: one model call's usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageRequest {
    /// The model used (1 to 128 characters, no control characters).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$"
    )]
    pub model: String,
    /// Input tokens (at most 2^48).
    #[serde(default)]
    #[schema(maximum = 281474976710656_u64)]
    pub input_tokens: u64,
    /// Output tokens (at most 2^48).
    #[serde(default)]
    #[schema(maximum = 281474976710656_u64)]
    pub output_tokens: u64,
    /// Cost in millionths of the currency unit (at most 2^48).
    #[serde(default)]
    #[schema(maximum = 281474976710656_u64)]
    pub cost_micros: u64,
}

/// Body of `POST /v1/runs/{run}/schedules`: the command, an optional
/// `timeout_sec`, exactly one of `cron` (5-field, UTC), `every_sec` or `at`
/// (RFC 3339), and the `catch_up` and `delete_after_success` flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// The argv each firing runs.
    #[schema(schema_with = crate::surfaces::api::schema::argv)]
    pub command: Vec<String>,
    /// Seconds from the command's start (at least 1; at most the kernel's
    /// ceiling: 900 in the foreground and 3600 in the background by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub timeout_sec: Option<u64>,
    /// A 5-field cron expression, in UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The period, in seconds (1 to 366 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub every_sec: Option<u64>,
    /// One time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Fire once for the due times missed while the kernel was down.
    #[serde(default)]
    pub catch_up: bool,
    /// Delete the schedule once a firing succeeds.
    #[serde(default)]
    pub delete_after_success: bool,
}

/// Body of `POST /v1/runs/{run}/notes`: `{"text"}`, a human steer for
/// the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Note {
    /// The note (1 to 16384 bytes, no NUL).
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = r"^[^\u0000]*\S[^\u0000]*$"
    )]
    pub text: String,
}

/// The body of `read_file` (`POST /v1/runs/{run}/tools/read_file`): a
/// bounded slice of a file, for a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// The file's path in the run's container (`/scratch/a.txt`).
    #[schema(min_length = 1, max_length = 4096)]
    pub path: String,
    /// Byte offset to read from (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Bytes at most (default 65536, at most 1048576).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1048576)]
    pub length: Option<u64>,
    /// `text` (the default: UTF-8, invalid bytes replaced) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

/// How file content travels in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// UTF-8 text.
    Text,
    /// Base64 of the raw bytes.
    Base64,
}

/// The body of `write_file` (`POST /v1/runs/{run}/tools/write_file`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// The file's path in the run's container (parents are made).
    #[schema(min_length = 1, max_length = 4096)]
    pub path: String,
    /// The whole content, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The whole content, as base64 (instead of `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Permission bits in octal (default `644`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^[0-7]{1,4}$")]
    pub mode: Option<String>,
}

/// The body of `list_dir` (`POST /v1/runs/{run}/tools/list_dir`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDir {
    /// The directory's path in the run's container (default `/scratch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub path: Option<String>,
}
