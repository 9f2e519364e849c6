//! The interactive client verbs (SPEC §25): `opkernel write`, `opkernel
//! output`, and `opkernel run --stdin | --tty` attached to the caller's
//! terminal (keys in, output out, the exit code last).

use std::io::{Read, Write};

use anyhow::{bail, Context};

use super::client::Client;
use super::{exit_status, or_dash};
use crate::lifecycle::Status;
use crate::surfaces::requests::{ReadOutput, ResizeTty, WriteStdin};
use crate::surfaces::views::{ConsoleDone, ConsoleOutput, OpView, OutputView, StdinAnswer};

/// `opkernel write`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct WriteArgs {
    /// Operation to write to (started with --stdin or --tty)
    pub operation_id: String,
    /// The text; a newline is added unless -n
    pub text: String,
    /// Do not add a newline
    #[arg(short = 'n')]
    pub no_newline: bool,
    /// Close stdin after the text
    #[arg(long)]
    pub eof: bool,
    /// Milliseconds to wait for the output it produces
    #[arg(long, default_value_t = 1000)]
    pub yield_ms: u64,
}

/// `opkernel output`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Operation whose output to print
    pub operation_id: String,
    /// Byte offset to start from
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    /// Keep printing until the operation ends; exit with its code
    #[arg(long, short)]
    pub follow: bool,
}

/// The run an op belongs to (the tools' paths name it).
async fn run_of(client: &Client, op: &str) -> anyhow::Result<String> {
    let state: OpView = client.get_as(&format!("/v1/operations/{op}")).await?;
    Ok(state.run_id)
}

/// `opkernel write OP TEXT`: writes, prints the output since.
pub(super) async fn write(client: &Client, a: WriteArgs) -> anyhow::Result<i32> {
    let run = run_of(client, &a.operation_id).await?;
    let text = match a.no_newline {
        true => a.text,
        false => format!("{}\n", a.text),
    };
    let body = WriteStdin {
        operation_id: a.operation_id,
        text: Some(text),
        data_base64: None,
        eof: a.eof,
        yield_ms: Some(a.yield_ms),
    };
    let path = format!("/v1/runs/{run}/tools/write_stdin");
    let answer: StdinAnswer = client.start_once(&path, &body, None).await?;
    print!("{}", answer.output);
    std::io::stdout().flush()?;
    Ok(0)
}

/// `opkernel output OP`: the output from an offset; with `--follow`, until
/// the op ends (exiting with its status).
pub(super) async fn output(client: &Client, a: OutputArgs) -> anyhow::Result<i32> {
    let run = run_of(client, &a.operation_id).await?;
    let path = format!("/v1/runs/{run}/tools/read_output");
    let mut offset = a.offset;
    let mut out = std::io::stdout();
    loop {
        let body = ReadOutput {
            operation_id: a.operation_id.clone(),
            offset: Some(offset),
            wait_ms: Some(if a.follow { 10_000 } else { 0 }),
            max_bytes: Some(1 << 20),
        };
        let got: OutputView = client.post_as(&path, &body, None).await?;
        out.write_all(got.output.as_bytes())?;
        out.flush()?;
        let more = got.next_offset > offset;
        offset = got.next_offset;
        if !a.follow && !more {
            return Ok(0);
        }
        if a.follow && !got.running && !more {
            eprintln!(
                "[opkernel: {} exit_code={}]",
                got.status,
                or_dash(&got.exit_code)
            );
            return Ok(exit_status(Some(got.status), got.exit_code));
        }
    }
}

/// The detach key: Ctrl-] leaves the op running and the client exits.
const DETACH: u8 = 0x1d;

/// The local terminal in raw mode (keys go through unechoed, Ctrl-C
/// included) until dropped; nothing when stdin is not a terminal.
struct Raw(Option<String>);

impl Raw {
    fn enter(tty: bool) -> Raw {
        if !tty || !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            return Raw(None);
        }
        let saved = stty(&["-g"]).ok().map(|s| s.trim().to_owned());
        if saved.is_some() && stty(&["raw", "-echo"]).is_err() {
            return Raw(None);
        }
        Raw(saved)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = stty(&[saved]);
        }
    }
}

/// `stty` on the caller's terminal (its stdin).
fn stty(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("stty")
        .args(args)
        .stdin(std::process::Stdio::inherit())
        .output()
        .context("cannot run stty")?;
    if !out.status.success() {
        bail!("stty {args:?} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The caller's terminal size (`stty size`), when it has one.
pub(super) fn local_size() -> Option<(u16, u16)> {
    let size = stty(&["size"]).ok()?;
    let mut parts = size.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some((parts.next()??, parts.next()??))
}

/// Attaches the caller's terminal to a running op: its output printed as
/// it comes, the caller's input written to its stdin (Ctrl-] detaches);
/// the op's exit status last.
pub(super) async fn attach(client: &Client, op: &OpView, tty: bool) -> anyhow::Result<i32> {
    let raw = Raw::enter(tty);
    if raw.0.is_some() {
        if let Some((rows, cols)) = local_size() {
            let body = ResizeTty {
                operation_id: op.operation_id.clone(),
                rows,
                cols,
            };
            let path = format!("/v1/runs/{}/tools/resize_tty", op.run_id);
            let _: OpView = client.post_as(&path, &body, None).await?;
        }
    }
    let input = tokio::spawn(pump_input(client.clone(), op.clone()));
    let status = follow(client, &op.operation_id).await;
    input.abort();
    drop(raw);
    match status? {
        Some(done) => {
            let state = done.status.map_or("unknown", Status::as_str);
            eprintln!(
                "\r\n[opkernel: {state} exit_code={}]",
                or_dash(&done.exit_code)
            );
            Ok(exit_status(done.status, done.exit_code))
        }
        None => {
            eprintln!(
                "\r\n[opkernel: detached; operation {} goes on]",
                op.operation_id
            );
            Ok(0)
        }
    }
}

/// The op's console printed until its `done` (`None`: the stream ended).
async fn follow(client: &Client, op: &str) -> anyhow::Result<Option<ConsoleDone>> {
    let mut out = std::io::stdout();
    let mut done = None;
    client
        .sse(&format!("/v1/operations/{op}/console"), |event, data| {
            match event {
                "output" => {
                    if let Ok(o) = serde_json::from_str::<ConsoleOutput>(data) {
                        let _ = out.write_all(o.text.as_bytes());
                        let _ = out.flush();
                    }
                }
                "done" => {
                    done = Some(serde_json::from_str(data).unwrap_or_default());
                    return false;
                }
                _ => {}
            }
            true
        })
        .await?;
    Ok(done)
}

/// The caller's input, read on a thread, written to the op as it comes;
/// the end of the input closes the op's stdin; Ctrl-] ends the attach.
async fn pump_input(client: Client, op: OpView) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin();
        loop {
            let n = stdin.read(&mut buf).unwrap_or(0);
            if tx.blocking_send(buf[..n].to_vec()).is_err() || n == 0 {
                return;
            }
        }
    });
    let path = format!("/v1/runs/{}/tools/write_stdin", op.run_id);
    while let Some(mut bytes) = rx.recv().await {
        let detaching = bytes.iter().position(|&b| b == DETACH);
        if let Some(at) = detaching {
            bytes.truncate(at);
            if bytes.is_empty() {
                std::process::exit(detach(&op));
            }
        }
        let body = WriteStdin {
            operation_id: op.operation_id.clone(),
            text: None,
            data_base64: Some(base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                &bytes,
            )),
            eof: bytes.is_empty(),
            yield_ms: Some(0),
        };
        let written: anyhow::Result<StdinAnswer> = client.start_once(&path, &body, None).await;
        if let Err(e) = written {
            // the op ended or closed its stdin: the rest of the input has
            // nowhere to go (its output and code still come)
            eprintln!("\r\n[opkernel: input not written: {e:#}]\r");
            return Ok(());
        }
        if detaching.is_some() {
            std::process::exit(detach(&op));
        }
        if bytes.is_empty() {
            return Ok(());
        }
    }
    Ok(())
}

/// Leaves the op running: the terminal is restored and the client exits.
fn detach(op: &OpView) -> i32 {
    let _ = stty(&["sane"]);
    eprintln!(
        "\r\n[opkernel: detached; operation {} goes on]",
        op.operation_id
    );
    0
}
