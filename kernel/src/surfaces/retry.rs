//! A start sent again with its one `Idempotency-Key` (the CLI's `opkernel
//! run` and the MCP server's `run_command` both): while no answer came (a
//! cut connection, a kernel restarting) or the answer was `503` (the store
//! away), for a minute from the first failure. A commit whose answer was
//! lost is found by the key, so the command runs once and the caller never
//! sees the blip. An attempt answered after a long wait (a foreground
//! command) starts the patience again, within a hard cap.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long failing attempts are retried, from the first failure.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// However the attempts went, none is sent after this long.
const HARD_CAP: Duration = Duration::from_secs(1800);
/// An attempt that lasted this long was answered by a kernel that was up.
const LONG_ATTEMPT: Duration = Duration::from_secs(30);

/// Sends `attempt()` until it is answered with something but a `503`
/// (`status` reads an answer's HTTP status; `None`: no answer), or the
/// patience ran out; the last answer.
pub async fn until_answered<T, E, Fut>(
    mut attempt: impl FnMut() -> Fut,
    status: impl Fn(&Result<T, E>) -> Option<u16>,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    let began = Instant::now();
    let mut failing_since: Option<Instant> = None;
    let mut pause = Duration::from_millis(200);
    loop {
        let sent = Instant::now();
        let answer = attempt().await;
        let again = status(&answer).is_none_or(|s| s == 503);
        if sent.elapsed() > LONG_ATTEMPT && began.elapsed() < HARD_CAP {
            failing_since = None;
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        if !again || since.elapsed() + pause > PATIENCE {
            return answer;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
