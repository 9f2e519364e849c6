//! `wait_background_report`, and acknowledging what a session served only
//! on evidence its client has it ([`super::ack`]).

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};

use super::tools::{answer_view, success, tool_error};
use super::{OpkernelMcp, RunAuth};
use crate::surfaces::views::Report;

impl OpkernelMcp {
    /// Acknowledges a report; a tool error when the API refuses.
    async fn ack(
        &self,
        auth: &RunAuth,
        report_id: &str,
    ) -> Result<Option<CallToolResult>, McpError> {
        let path = format!("/v1/runs/{}/report/{report_id}/ack", auth.run);
        let (status, body) = self.call(auth, reqwest::Method::POST, &path, None).await?;
        Ok((!(200..300).contains(&status)).then(|| tool_error(status, &body)))
    }

    /// Acknowledges reports the session's client has shown it has.
    async fn ack_all(&self, auth: &RunAuth, reports: Vec<String>, why: &str) {
        for id in reports {
            match self.ack(auth, &id).await {
                Ok(None) => tracing::debug!(report = %id, "report acknowledged by {why}"),
                Ok(Some(_)) | Err(_) => {
                    tracing::warn!(report = %id, "cannot acknowledge the report; it will be served again")
                }
            }
        }
    }

    /// A call arrived in a session: it shows the client has the reports
    /// whose answers were written out to it before.
    pub(super) async fn ack_delivered(&self, auth: &RunAuth) {
        let due = self.session.ledger.lock().arrived();
        self.ack_all(auth, due, "the next call").await;
    }

    /// The session closed cleanly (stdio EOF, HTTP DELETE): the client has
    /// every report written out to it.
    pub async fn finish(&self) {
        let auth = self
            .fixed_auth
            .clone()
            .or_else(|| self.session.auth.lock().clone());
        if let Some(auth) = auth {
            let due = self.session.ledger.lock().closed();
            self.ack_all(&auth, due, "a clean close").await;
        }
    }

    /// `wait_background_report`: the client's own `ack` first, then the
    /// run's report (waiting up to `wait_sec`).
    pub(super) async fn wait_report(
        &self,
        auth: &RunAuth,
        wait_sec: u64,
        ack: Option<String>,
        session: bool,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        if let Some(id) = ack {
            if let Some(refused) = self.ack(auth, &id).await? {
                return Ok(refused);
            }
            self.session.ledger.lock().acked(&id);
        }
        let path = format!("/v1/runs/{}/report?wait={wait_sec}", auth.run);
        // a wait the client cancelled ends here: nothing it drained may
        // count as delivered
        let answer = tokio::select! {
            answer = self.call(auth, reqwest::Method::GET, &path, None) => answer?,
            _ = ctx.ct.cancelled() => {
                return Err(McpError::internal_error("the request was cancelled", None));
            }
        };
        let (report, body) = match answer_view::<Report>(answer) {
            Ok(served) => served,
            Err(error) => return Ok(error),
        };
        // served in a session that still has its client: acknowledged once
        // the answer was written out to the client and a later call (or a
        // clean close) followed; otherwise served again, same report_id
        let listening = !ctx.ct.is_cancelled() && !ctx.peer.is_transport_closed();
        if session && listening {
            if let Some(id) = &report.report_id {
                self.session.ledger.lock().served(id);
            }
        }
        Ok(success(report.text, body))
    }
}
