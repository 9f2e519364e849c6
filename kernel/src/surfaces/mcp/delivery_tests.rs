use std::sync::Arc;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::*;

fn answer(report: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": 3, "result": {
        "content": [{"type": "text", "text": "report_id in the text does not count"}],
        "structuredContent": {"report_id": report, "text": "[Background operations report]"},
        "isError": false}})
    .to_string()
}

fn ledger_serving(reports: &[&str]) -> (Arc<Lock<Ledger>>, LedgerOf) {
    let ledger = Arc::new(Lock::new(Ledger::default()));
    for r in reports {
        ledger.lock().served(r);
    }
    let of: LedgerOf = {
        let ledger = ledger.clone();
        Arc::new(move || Some(ledger.clone()))
    };
    (ledger, of)
}

#[test]
fn only_a_result_carrying_a_report_id_names_a_report() {
    let line = answer("r1");
    assert_eq!(report_in(line.as_bytes()).as_deref(), Some("r1"));
    assert_eq!(
        report_in(format!("data: {line}\r").as_bytes()).as_deref(),
        Some("r1")
    );
    assert_eq!(
        report_in(format!("data:{line}").as_bytes()).as_deref(),
        Some("r1")
    );
    for other in [
        r#"{"jsonrpc":"2.0","id":3,"result":{"structuredContent":{"report_id":null}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":{"report_id":"r"}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"\"report_id\""}]}}"#,
        r#"id: 0/1"#,
        r#"data: {"report_id": broken"#,
        "",
    ] {
        assert_eq!(report_in(other.as_bytes()), None, "{other}");
    }
}

#[test]
fn a_line_is_read_whatever_the_writes_cut_it_into() {
    let text = format!(
        "id: 0/0\nretry: 3000\ndata: \n\nid: 0/1\ndata: {}\n\n",
        answer("r1")
    );
    for cut in [1, 2, 7, 64, text.len()] {
        let mut scanner = Scanner::default();
        let mut found = Vec::new();
        for chunk in text.as_bytes().chunks(cut) {
            found.extend(scanner.feed(chunk));
        }
        assert_eq!(found, ["r1"], "cut {cut}");
    }
    // a line not ended yet names nothing
    let mut scanner = Scanner::default();
    assert!(scanner.feed(answer("r1").as_bytes()).is_empty());
    assert_eq!(scanner.feed(b"\n"), ["r1"]);
}

#[tokio::test]
async fn an_sse_frame_is_delivered_once_hyper_comes_back_for_more() {
    let frames = || {
        futures::stream::iter([
            Ok::<_, std::io::Error>(Bytes::from("id: 0/0\nretry: 3000\ndata: \n\n")),
            Ok(Bytes::from(format!("id: 0/1\ndata: {}\n\n", answer("r1")))),
        ])
    };
    // hyper takes the answer's frame, then comes back: delivered
    let (ledger, of) = ledger_serving(&["r1"]);
    let mut body = TrackedBody::new(frames(), of);
    assert!(body.next().await.is_some());
    assert!(body.next().await.is_some());
    assert!(ledger.lock().arrived().is_empty(), "taken, not yet held");
    assert!(body.next().await.is_none());
    assert_eq!(ledger.lock().arrived(), ["r1"]);
    // hyper found the connection closed after taking the frame: it drops
    // the body without coming back
    let (ledger, of) = ledger_serving(&["r1"]);
    let mut body = TrackedBody::new(frames(), of);
    assert!(body.next().await.is_some());
    assert!(body.next().await.is_some());
    drop(body);
    assert!(ledger.lock().arrived().is_empty());
    assert!(ledger.lock().closed().is_empty());
}

/// A writer whose writes succeed and whose flushes succeed or fail.
struct Sink {
    flush_fails: bool,
}

impl tokio::io::AsyncWrite for Sink {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len().min(5)))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(if self.flush_fails {
            Err(std::io::ErrorKind::BrokenPipe.into())
        } else {
            Ok(())
        })
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_stdio_line_is_delivered_once_flushed() {
    let line = format!("{}\n", answer("r1"));
    let (ledger, of) = ledger_serving(&["r1"]);
    let mut out = TrackedWriter::new(Sink { flush_fails: false }, of);
    out.write_all(line.as_bytes()).await.unwrap();
    assert!(ledger.lock().arrived().is_empty(), "written, not flushed");
    out.flush().await.unwrap();
    assert_eq!(ledger.lock().arrived(), ["r1"]);
    // the host closed its end: the flush fails, nothing is delivered
    let (ledger, of) = ledger_serving(&["r1"]);
    let mut out = TrackedWriter::new(Sink { flush_fails: true }, of);
    out.write_all(line.as_bytes()).await.unwrap();
    assert!(out.flush().await.is_err());
    assert!(ledger.lock().closed().is_empty());
}
