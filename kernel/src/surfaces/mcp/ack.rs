//! When a report a session served counts as received (SPEC §5, §17), pure.
//!
//! A handler finishing a `wait_background_report` call is not the client
//! receiving its answer: rmcp keeps answering into a session's resume
//! cache after the client hung up on the request's stream. So a session
//! (stdio, or a legacy HTTP session) acknowledges a report only on
//! evidence that the client has it:
//!
//! 1. the transport wrote an answer carrying the report out to the client
//!    and the write held: over HTTP the SSE frame was handed to hyper and
//!    hyper came back to the body for more (a connection it knows to be
//!    closed drops the body instead); over stdio the line was written and
//!    flushed into stdout ([`super::delivery`]);
//! 2. and then a later call arrived in the session (a call already in
//!    flight when the answer went out cannot show the client read it), or
//!    the session closed cleanly (stdio EOF, HTTP DELETE);
//!
//! or the client passed the report's id as `ack`. Anything else is served
//! again by the API, under the same `report_id`.
//!
//! The session's clock orders writes and arrivals: a write takes a tick
//! when its bytes go to the transport, a call takes one when it arrives.
//!
//! What transport evidence cannot show: a client that hangs up while the
//! answer's bytes are already on their way to it (after hyper took the
//! frame, before they arrive), or a host that reads an answer and drops it
//! without cancelling the call (stdio has nothing but the pipe). Its next
//! call acknowledges that report; only `ack` says more.

/// How a client is connected: what can show that it has a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A 2025 revision over HTTP: a session (`Mcp-Session-Id`) whose later
    /// calls, or its clean close (DELETE), show what it received.
    Session2025,
    /// The stateless 2026-07-28 revision: every request stands alone, so
    /// nothing but the client's own `ack` acknowledges a report.
    Stateless2026,
    /// `opkernel mcp` over stdio: one session for the process's life, closed
    /// cleanly by EOF on stdin.
    Stdio,
}

impl Transport {
    /// The transport of a call: stdio, or over HTTP by the negotiated
    /// revision (`None`: not negotiated, a 2025 client; `Some(true)`: a
    /// revision with `initialize`, i.e. a 2025 session).
    pub fn of(stdio: bool, has_initialize: Option<bool>) -> Transport {
        match (stdio, has_initialize) {
            (true, _) => Transport::Stdio,
            (false, None | Some(true)) => Transport::Session2025,
            (false, Some(false)) => Transport::Stateless2026,
        }
    }

    /// Whether a report served over it is tracked in the session's
    /// [`Ledger`] (acknowledged on transport evidence); otherwise it is
    /// served again until the client passes `ack`.
    pub fn tracks(self) -> bool {
        !matches!(self, Transport::Stateless2026)
    }
}

/// How many served reports a session remembers (one is usual: the API
/// serves the same unacknowledged report until it is acked). Forgetting one
/// only means it is served again.
const MAX_SERVED: usize = 16;

/// A session's reports served and not yet acknowledged, and its clock.
#[derive(Debug, Default)]
pub struct Ledger {
    clock: u64,
    served: Vec<Served>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Served {
    report: String,
    /// The earliest tick at which an answer carrying the report went out
    /// and held; `None` while no answer reached the client.
    delivered: Option<u64>,
}

impl Ledger {
    /// The next tick of the session's clock.
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// A wait answered `report` to a client that had not gone away.
    pub fn served(&mut self, report: &str) {
        if self.served.iter().any(|s| s.report == report) {
            return;
        }
        if self.served.len() >= MAX_SERVED {
            self.served.remove(0);
        }
        self.served.push(Served {
            report: report.to_owned(),
            delivered: None,
        });
    }

    /// An answer carrying `report`, handed to the transport at tick `at`,
    /// held (see the module doc). A report this session did not serve as
    /// pending (stateless, already acknowledged) is not tracked.
    pub fn delivered(&mut self, report: &str, at: u64) {
        if let Some(s) = self.served.iter_mut().find(|s| s.report == report) {
            s.delivered = Some(s.delivered.map_or(at, |d| d.min(at)));
        }
    }

    /// A call arrived: the reports delivered before it are acknowledged
    /// (returned, and forgotten here).
    pub fn arrived(&mut self) -> Vec<String> {
        let now = self.tick();
        self.take(|delivered| delivered < now)
    }

    /// The client acknowledged `report` itself (`ack`).
    pub fn acked(&mut self, report: &str) {
        self.served.retain(|s| s.report != report);
    }

    /// The session closed cleanly: every report delivered is acknowledged.
    pub fn closed(&mut self) -> Vec<String> {
        self.take(|_| true)
    }

    fn take(&mut self, due: impl Fn(u64) -> bool) -> Vec<String> {
        let (acked, kept) = std::mem::take(&mut self.served)
            .into_iter()
            .partition(|s| s.delivered.is_some_and(&due));
        self.served = kept;
        acked.into_iter().map(|s| s.report).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a session's life.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// A wait answered the report.
        Serve(&'static str),
        /// The transport took an answer carrying the report (a tick).
        Write(&'static str),
        /// That write held (the frame's stream went on, the flush succeeded).
        Hold(&'static str),
        /// The stream carrying the write went away before it held.
        Drop(&'static str),
        /// A call arrived; it acknowledges exactly these.
        Arrive(&'static [&'static str]),
        /// The client passed `ack`.
        Ack(&'static str),
        /// A clean close; it acknowledges exactly these.
        Close(&'static [&'static str]),
    }
    use Step::*;

    fn play(steps: &[Step]) {
        play_over(Transport::Session2025, steps)
    }

    /// Plays `steps` as the kernel does over `transport`: a served report
    /// is tracked only where the transport tracks, and a close happens only
    /// where it has one.
    fn play_over(transport: Transport, steps: &[Step]) {
        let mut ledger = Ledger::default();
        let mut writes: Vec<(&str, u64)> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let acked = match *step {
                Serve(r) => {
                    if transport.tracks() {
                        ledger.served(r);
                    }
                    continue;
                }
                Write(r) => {
                    let at = ledger.tick();
                    writes.push((r, at));
                    continue;
                }
                Hold(r) | Drop(r) => {
                    let at = writes.iter().position(|(w, _)| *w == r).expect("a write");
                    let (_, at) = writes.remove(at);
                    if matches!(step, Hold(_)) {
                        ledger.delivered(r, at);
                    }
                    continue;
                }
                Ack(r) => {
                    ledger.acked(r);
                    continue;
                }
                Arrive(want) | Close(want) => {
                    let got = if matches!(step, Arrive(_)) {
                        ledger.arrived()
                    } else {
                        ledger.closed()
                    };
                    (got, want)
                }
            };
            let (got, want) = acked;
            assert_eq!(got, want, "step {i} {step:?} of {steps:?}");
        }
    }

    #[test]
    fn a_report_is_acknowledged_only_on_evidence_the_client_has_it() {
        let table: &[&[Step]] = &[
            // the ordinary case: written, held, then the next call
            &[
                Serve("r"),
                Write("r"),
                Hold("r"),
                Arrive(&["r"]),
                Arrive(&[]),
            ],
            // issue 22: the client hung up on the wait before its answer
            // went out; the next call acknowledges nothing, and the report
            // served again to that call is acknowledged by the one after
            &[
                Serve("r"),
                Arrive(&[]),
                Serve("r"),
                Write("r"),
                Hold("r"),
                Arrive(&["r"]),
            ],
            // the stream went away under the write: nothing delivered
            &[Serve("r"), Write("r"), Drop("r"), Arrive(&[]), Close(&[])],
            // a call already in flight when the answer went out shows nothing
            &[
                Serve("r"),
                Arrive(&[]),
                Write("r"),
                Hold("r"),
                Arrive(&["r"]),
            ],
            // a call arriving between the write and its hold shows nothing yet
            &[
                Serve("r"),
                Write("r"),
                Arrive(&[]),
                Hold("r"),
                Arrive(&["r"]),
            ],
            // served twice, delivered once: the earliest delivery counts
            &[
                Serve("r"),
                Write("r"),
                Hold("r"),
                Serve("r"),
                Write("r"),
                Arrive(&["r"]),
                Drop("r"),
                Arrive(&[]),
            ],
            // a clean close acknowledges what was delivered, not what was not
            &[Serve("r"), Serve("s"), Write("s"), Hold("s"), Close(&["s"])],
            &[Serve("r"), Close(&[])],
            // an explicit ack needs no delivery, and leaves nothing behind
            &[Serve("r"), Ack("r"), Write("r"), Hold("r"), Arrive(&[])],
            // a delivery of a report this session did not serve is ignored
            &[Write("x"), Hold("x"), Arrive(&[]), Close(&[])],
        ];
        for steps in table {
            play(steps);
        }
    }

    /// The same life (a report served, written out and held, then a later
    /// call or a clean close) over each revision's transport.
    #[test]
    fn what_acknowledges_a_report_depends_on_the_revision() {
        use Transport::*;
        let later_call: &[Step] = &[Serve("r"), Write("r"), Hold("r"), Arrive(&["r"])];
        let clean_close: &[Step] = &[Serve("r"), Write("r"), Hold("r"), Close(&["r"])];
        let unacknowledged: &[Step] = &[Serve("r"), Write("r"), Hold("r"), Arrive(&[]), Close(&[])];
        let acked_by_the_client: &[Step] = &[Serve("r"), Ack("r"), Arrive(&[])];
        let table: &[(Transport, &[Step])] = &[
            (Session2025, later_call),
            (Session2025, clean_close),
            (Session2025, acked_by_the_client),
            (Stdio, later_call),
            (Stdio, clean_close),
            (Stdio, acked_by_the_client),
            // stateless: no evidence but the client's own ack; the report
            // is served again (same report_id) until then
            (Stateless2026, unacknowledged),
            (Stateless2026, acked_by_the_client),
        ];
        for (transport, steps) in table {
            play_over(*transport, steps);
        }
        assert_eq!(Transport::of(true, Some(false)), Stdio);
        assert_eq!(Transport::of(false, None), Session2025);
        assert_eq!(Transport::of(false, Some(true)), Session2025);
        assert_eq!(Transport::of(false, Some(false)), Stateless2026);
    }

    #[test]
    fn a_session_remembers_a_bounded_number_of_reports() {
        let mut ledger = Ledger::default();
        let names: Vec<String> = (0..MAX_SERVED + 2).map(|i| format!("r{i}")).collect();
        for name in &names {
            ledger.served(name);
            let at = ledger.tick();
            ledger.delivered(name, at);
        }
        let acked = ledger.arrived();
        assert_eq!(acked, names[2..].to_vec(), "the oldest are forgotten");
    }
}
