//! The MCP server (SPEC §17), built on `rmcp`: agent hosts use opkernel as
//! their command tool. One handler serves both transports: stdio
//! (`opkernel mcp --run RUN`, one process per agent, talking to the daemon
//! over HTTP) and streamable HTTP at `/mcp` on the daemon (the run token as
//! bearer). Tools go through the kernel's HTTP API ([`backend`]), so their
//! schemas, limits and messages are the API's own.
//!
//! Exactly once without loss: a report is acknowledged only when the
//! client shows it has it. A session (stdio, or a legacy 2025-xx HTTP
//! session) acks the report it served on its next call or clean exit; on
//! the stateless 2026-07-28 revision the client passes `ack` = the
//! previous `report_id`. A report not acknowledged is served again.

pub mod backend;
pub mod http;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

// logging notifications are how the 2025 revisions tell a client news
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    Implementation, InitializeRequestParams, InitializeResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
    ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig, SubscribeRequestParams,
    SubscriptionFilter, Tool, UnsubscribeRequestParams,
};
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use serde_json::{json, Value};

use crate::sync::Lock;
use backend::{Answer, Backend};

/// How long an HTTP session's follower outlives its client's last request.
const FOLLOW_IDLE_MS: i64 = 10 * 60 * 1000;

/// The URI of an op's resource.
pub fn op_uri(id: &str) -> String {
    format!("opkernel://operations/{id}")
}

fn op_of_uri(uri: &str) -> Option<&str> {
    uri.strip_prefix("opkernel://operations/")
        .filter(|id| uuid::Uuid::parse_str(id).is_ok())
}

/// Who the handler acts as: a run token and its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAuth {
    pub token: String,
    pub run: String,
}

/// The tools an MCP client sees: `run_command` and `kill_operation` exactly
/// as `GET /v1/tools` publishes them (fetched from the API), and the two
/// MCP-only tools.
pub fn tools_from_api(api_tools: &Value) -> Result<Vec<Tool>, String> {
    let mut out = Vec::new();
    for t in api_tools["tools"].as_array().into_iter().flatten() {
        let name = t["name"]
            .as_str()
            .ok_or("a tool without a name")?
            .to_owned();
        let description = t["description"].as_str().unwrap_or_default().to_owned();
        let Value::Object(schema) = t["parameters"].clone() else {
            return Err(format!("tool {name} has no parameter schema"));
        };
        out.push(Tool::new(name, description, Arc::new(schema)));
    }
    let extra = [
        (
            "operation_state",
            "The state of one of this run's operations (or a delegated run's): status, exit code, \
             output tail, timing. Background results also arrive through wait_background_report.",
            json!({
                "type": "object",
                "properties": {"operation_id": {"type": "string", "format": "uuid"}},
                "required": ["operation_id"],
                "additionalProperties": false
            }),
        ),
        (
            "wait_background_report",
            "Wait up to wait_sec seconds for background operations to resolve (or a note to arrive) \
             and return one [Background operations report] with its report_id. Each result is \
             reported exactly once. Pass the previous report's report_id as ack to confirm you have \
             it; a report not confirmed is served again (in a session it is confirmed by your next \
             call).",
            json!({
                "type": "object",
                "properties": {
                    "wait_sec": {"type": "integer", "minimum": 0,
                                 "maximum": crate::api::reports::MAX_REPORT_WAIT_SEC, "default": 0},
                    "ack": {"type": "string", "format": "uuid",
                            "description": "report_id of the previous report"}
                },
                "additionalProperties": false
            }),
        ),
    ];
    for (name, description, schema) in extra {
        let Value::Object(schema) = schema else {
            return Err(format!("tool {name}: schema is not an object"));
        };
        out.push(Tool::new(name, description, Arc::new(schema)));
    }
    Ok(out)
}

/// One MCP handler: per stdio process, per legacy HTTP session, or per
/// stateless HTTP request.
#[derive(Clone)]
pub struct OpkernelMcp {
    backend: Arc<dyn Backend>,
    tools: Arc<Vec<Tool>>,
    /// Fixed (stdio); per request from the bearer token (HTTP).
    fixed_auth: Option<RunAuth>,
    session: Arc<Session>,
    /// HTTP: the handlers of open legacy sessions by `Mcp-Session-Id`, so a
    /// session's clean close (DELETE) acks what it was served.
    sessions: Option<Sessions>,
}

/// Open legacy HTTP sessions' handlers by `Mcp-Session-Id`.
pub type Sessions = Arc<Lock<std::collections::HashMap<String, OpkernelMcp>>>;

/// A session handler forgotten after this long without a request (its
/// session expired without a DELETE).
const SESSION_FORGET_MS: i64 = 60 * 60 * 1000;

/// What a session remembers between calls.
#[derive(Default)]
struct Session {
    /// The report served and not yet acknowledged, with the number of
    /// calls that had arrived when it was served: only a call arriving
    /// after that acknowledges it (one already in flight cannot show the
    /// client has it).
    pending_ack: Lock<Option<(String, u64)>>,
    /// Calls arrived so far.
    calls: std::sync::atomic::AtomicU64,
    /// When the client last asked anything (unix ms).
    last_seen: std::sync::atomic::AtomicI64,
    /// The run this session acts as (its first authenticated request's).
    auth: Lock<Option<RunAuth>>,
    /// Resource URIs a legacy client subscribed to.
    subscribed: Lock<HashSet<String>>,
    /// The resolution follower runs (once per session).
    following: std::sync::atomic::AtomicBool,
}

/// A tool's answer from an API answer: structured content plus the text a
/// model reads; an API error is a tool error with the API's message.
fn tool_result(answer: Answer, text: impl FnOnce(&Value) -> String) -> CallToolResult {
    let (status, body) = answer;
    if (200..300).contains(&status) {
        let mut r = CallToolResult::success(vec![Content::text(text(&body))]);
        r.structured_content = Some(body);
        return r;
    }
    tool_error(status, &body)
}

fn tool_error(status: u16, body: &Value) -> CallToolResult {
    let message = body["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("request failed with HTTP {status}"));
    let mut r = CallToolResult::error(vec![Content::text(message.clone())]);
    r.structured_content = Some(json!({
        "error": {"status": status, "code": body["error"]["code"], "message": message}
    }));
    r
}

fn bad_arguments(message: impl Into<String>) -> CallToolResult {
    tool_error(
        400,
        &json!({"error": {"code": "bad_request", "message": message.into()}}),
    )
}

/// Whether a negotiated version is one of the 2025 (session) revisions.
fn legacy(version: Option<&ProtocolVersion>) -> bool {
    version.is_none_or(|v| v.has_initialize())
}

impl OpkernelMcp {
    pub fn new(
        backend: Arc<dyn Backend>,
        tools: Arc<Vec<Tool>>,
        fixed_auth: Option<RunAuth>,
    ) -> Self {
        OpkernelMcp {
            backend,
            tools,
            fixed_auth,
            session: Arc::new(Session::default()),
            sessions: None,
        }
    }

    /// Registers the handler's legacy sessions in `sessions` (HTTP).
    pub fn with_sessions(mut self, sessions: Sessions) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// A legacy session closed cleanly (DELETE): it has what it was served.
    pub async fn close_session(sessions: &Sessions, id: &str) {
        let handler = sessions.lock().remove(id);
        if let Some(handler) = handler {
            handler.finish().await;
        }
    }

    /// Remembers this handler under the request's session id.
    fn register(&self, ctx: &RequestContext<RoleServer>) {
        let Some(sessions) = &self.sessions else {
            return;
        };
        let Some(id) = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
        else {
            return;
        };
        let mut map = sessions.lock();
        if !map.contains_key(id) {
            let now = crate::store::now_ms();
            map.retain(|_, h| {
                now - h
                    .session
                    .last_seen
                    .load(std::sync::atomic::Ordering::Relaxed)
                    < SESSION_FORGET_MS
            });
            map.insert(id.to_owned(), self.clone());
        }
    }

    /// The run this request acts as: the fixed one, or the bearer token's
    /// (set on the request by the `/mcp` layer).
    fn auth(&self, ctx: &RequestContext<RoleServer>) -> Result<RunAuth, McpError> {
        if let Some(auth) = &self.fixed_auth {
            return Ok(auth.clone());
        }
        let from_request = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<RunAuth>())
            .cloned();
        match from_request {
            Some(auth) => {
                let mut session = self.session.auth.lock();
                match session.as_ref() {
                    // a session belongs to one run
                    Some(held) if held.run != auth.run => Err(McpError::invalid_request(
                        "this MCP session belongs to another run",
                        None,
                    )),
                    _ => {
                        *session = Some(auth.clone());
                        Ok(auth)
                    }
                }
            }
            None => self
                .session
                .auth
                .lock()
                .clone()
                .ok_or_else(|| McpError::invalid_request("no run token on this request", None)),
        }
    }

    async fn call(
        &self,
        auth: &RunAuth,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, McpError> {
        self.backend
            .call(&auth.token, method, path, body)
            .await
            .map_err(|e| McpError::internal_error(e, None))
    }

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

    /// Counts a call arriving; returns its number.
    fn arrive(&self) -> u64 {
        self.session
            .last_seen
            .store(crate::store::now_ms(), std::sync::atomic::Ordering::Relaxed);
        self.session
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// Acks what this session served before this call arrived (the call
    /// shows the client has it).
    async fn ack_pending(&self, auth: &RunAuth, arrival: Option<u64>) {
        let pending = {
            let mut pending = self.session.pending_ack.lock();
            match (&*pending, arrival) {
                (Some((_, served_at)), Some(arrival)) if arrival < *served_at => None,
                _ => pending.take().map(|(id, _)| id),
            }
        };
        if let Some(id) = pending {
            match self.ack(auth, &id).await {
                Ok(None) => tracing::debug!(report = %id, "report acknowledged by the next call"),
                Ok(Some(_)) | Err(_) => {
                    tracing::warn!(report = %id, "cannot acknowledge the report; it will be served again")
                }
            }
        }
    }

    /// Acks the report this session served last (a clean stdio exit).
    pub async fn finish(&self) {
        let auth = self
            .fixed_auth
            .clone()
            .or_else(|| self.session.auth.lock().clone());
        if let Some(auth) = auth {
            self.ack_pending(&auth, None).await;
        }
    }

    async fn wait_report(
        &self,
        auth: &RunAuth,
        args: &serde_json::Map<String, Value>,
        session: bool,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let wait = match args.get("wait_sec") {
            None | Some(Value::Null) => 0,
            Some(v) => match v.as_u64() {
                Some(w) => w,
                None => return Ok(bad_arguments("wait_sec must be a whole number of seconds")),
            },
        };
        for key in args.keys() {
            if key != "wait_sec" && key != "ack" {
                return Ok(bad_arguments(format!("unknown argument {key:?}")));
            }
        }
        if let Some(ack) = args.get("ack").filter(|v| !v.is_null()) {
            let Some(id) = ack.as_str().filter(|id| uuid::Uuid::parse_str(id).is_ok()) else {
                return Ok(bad_arguments(
                    "ack must be the report_id (a uuid) of the previous report",
                ));
            };
            if let Some(refused) = self.ack(auth, id).await? {
                return Ok(refused);
            }
            let mut pending = self.session.pending_ack.lock();
            if pending.as_ref().is_some_and(|(p, _)| p == id) {
                *pending = None;
            }
        }
        let path = format!("/v1/runs/{}/report?wait={wait}", auth.run);
        // a wait the client cancelled (or gave up on) ends here: its answer
        // would be dropped, so nothing it drained may count as delivered
        let (status, body) = tokio::select! {
            answer = self.call(auth, reqwest::Method::GET, &path, None) => answer?,
            _ = ctx.ct.cancelled() => {
                return Err(McpError::internal_error("the request was cancelled", None));
            }
        };
        // served in a session that still has its client: acknowledged by a
        // later call (or a clean exit); an unacknowledged report is served
        // again, under the same report_id
        let listening = !ctx.ct.is_cancelled() && !ctx.peer.is_transport_closed();
        if session && listening && (200..300).contains(&status) {
            if let Some(id) = body["report_id"].as_str() {
                let served_at = self.session.calls.load(std::sync::atomic::Ordering::SeqCst);
                *self.session.pending_ack.lock() = Some((id.to_owned(), served_at));
            }
        }
        Ok(tool_result((status, body), |r| {
            r["text"].as_str().unwrap_or_default().to_owned()
        }))
    }

    /// Follows the run's trace and tells a legacy session when one of its
    /// background ops resolves: a log message (older revisions' means) and
    /// `resources/updated` for a subscribed op. Ends with the session.
    fn follow(&self, auth: RunAuth, peer: Peer<RoleServer>) {
        if self
            .session
            .following
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let mut after = match this.last_seq(&auth).await {
                Some(seq) => seq,
                None => {
                    // not following after all: the next request tries again
                    this.session
                        .following
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
            };
            while !peer.is_transport_closed() && !this.idle() {
                let Some((resolved, next)) = this.resolutions(&auth, after, 20).await else {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                };
                after = next;
                for (op, data) in resolved {
                    let uri = op_uri(&op);
                    #[allow(deprecated)]
                    let logged = peer
                        .notify_logging_message(LoggingMessageNotificationParam::new(
                            LoggingLevel::Info,
                            json!({"operation_id": op, "uri": uri, "resolved": data}),
                        ))
                        .await;
                    if logged.is_err() {
                        return;
                    }
                    if this.session.subscribed.lock().contains(&uri) {
                        let _ = peer
                            .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                            .await;
                    }
                }
            }
        });
    }

    /// An HTTP session whose client has asked nothing for a while: its
    /// follower stops, so the session can expire (a stdio session lasts as
    /// long as its pipe).
    fn idle(&self) -> bool {
        let seen = self
            .session
            .last_seen
            .load(std::sync::atomic::Ordering::Relaxed);
        self.fixed_auth.is_none() && crate::store::now_ms() - seen > FOLLOW_IDLE_MS
    }

    /// The run's latest event sequence number now.
    async fn last_seq(&self, auth: &RunAuth) -> Option<i64> {
        let path = format!("/v1/runs/{}/events?after={}&limit=1", auth.run, i64::MAX);
        match self
            .backend
            .call(&auth.token, reqwest::Method::GET, &path, None)
            .await
        {
            Ok((200, body)) => body["last_seq"].as_i64(),
            _ => None,
        }
    }

    /// Background ops of the run resolved after `after` (waiting up to
    /// `wait` seconds for one), and the sequence number to go on from.
    async fn resolutions(
        &self,
        auth: &RunAuth,
        after: i64,
        wait: u64,
    ) -> Option<(Vec<(String, Value)>, i64)> {
        let path = format!("/v1/runs/{}/events?after={after}&wait={wait}", auth.run);
        let (status, body) = self
            .backend
            .call(&auth.token, reqwest::Method::GET, &path, None)
            .await
            .ok()?;
        if status != 200 {
            return None;
        }
        let next = body["next_after"].as_i64().unwrap_or(after);
        let resolved = body["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                matches!(e["kind"].as_str(), Some("tool.completed" | "tool.failed"))
                    && e["data"]["background"] == true
            })
            .filter_map(|e| Some((e["operation_id"].as_str()?.to_owned(), e["data"].clone())))
            .collect();
        Some((resolved, next))
    }
}

impl ServerHandler for OpkernelMcp {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_logging()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("opkernel", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Run commands in this agent run's sandbox container with run_command (background: true \
                 for long ones); their results arrive through wait_background_report, each exactly once. \
                 Each operation is also a resource, opkernel://operations/<id>.",
            )
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        ctx.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request)?;
        self.arrive();
        // a legacy session: resolutions are pushed to it as they happen
        if let Ok(auth) = self.auth(&ctx) {
            self.follow(auth, ctx.peer.clone());
        }
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let auth = self.auth(&ctx)?;
        self.register(&ctx);
        let arrival = self.arrive();
        let session = legacy(ctx.protocol_version().as_ref()) || self.fixed_auth.is_some();
        // a session's next call shows the client has the report it was served
        if session {
            self.ack_pending(&auth, Some(arrival)).await;
        }
        let args = request.arguments.unwrap_or_default();
        let run = auth.run.clone();
        let result = match request.name.as_ref() {
            "run_command" => {
                let path = format!("/v1/runs/{run}/tools/run_command");
                let answer = self
                    .call(&auth, reqwest::Method::POST, &path, Some(Value::Object(args)))
                    .await?;
                tool_result(answer, |op| match op["message"].as_str() {
                    Some(m) => m.to_owned(),
                    // a foreground op: its output and exit code
                    None => format!(
                        "exit_code={} status={}\n{}",
                        op["exit_code"],
                        op["status"].as_str().unwrap_or("-"),
                        op["output"].as_str().unwrap_or_default()
                    ),
                })
            }
            "kill_operation" => {
                let path = format!("/v1/runs/{run}/tools/kill_operation");
                let answer = self
                    .call(&auth, reqwest::Method::POST, &path, Some(Value::Object(args)))
                    .await?;
                tool_result(answer, |op| {
                    op["message"].as_str().unwrap_or("kill requested").to_owned()
                })
            }
            "operation_state" => {
                let Some(id) = args
                    .get("operation_id")
                    .and_then(Value::as_str)
                    .filter(|id| uuid::Uuid::parse_str(id).is_ok())
                else {
                    return Ok(bad_arguments("operation_id is required: the operation's id (a uuid)").into());
                };
                if args.len() > 1 {
                    return Ok(bad_arguments("operation_state takes only operation_id").into());
                }
                let answer = self
                    .call(&auth, reqwest::Method::GET, &format!("/v1/operations/{id}"), None)
                    .await?;
                tool_result(answer, |op| {
                    format!(
                        "operation {} {} exit_code={} killed={}{}",
                        op["operation_id"].as_str().unwrap_or("-"),
                        op["status"].as_str().unwrap_or("-"),
                        op["exit_code"],
                        op["killed"],
                        op["output_tail"]
                            .as_str()
                            .filter(|t| !t.is_empty())
                            .map(|t| format!("\noutput tail:\n{t}"))
                            .unwrap_or_default()
                    )
                })
            }
                        "wait_background_report" => self.wait_report(&auth, &args, session, &ctx).await?,
            other => {
                return Err(McpError::invalid_params(
                    format!("unknown tool {other:?}: the tools are run_command, kill_operation, operation_state, wait_background_report"),
                    None,
                ))
            }
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let auth = self.auth(&ctx)?;
        let path = format!("/v1/ops?run={}&limit=500", auth.run);
        let (status, body) = self.call(&auth, reqwest::Method::GET, &path, None).await?;
        if status != 200 {
            return Err(McpError::internal_error(
                format!("cannot list operations: HTTP {status}"),
                None,
            ));
        }
        let resources = body["operations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|op| {
                let id = op["operation_id"].as_str()?;
                Some(
                    Resource::new(op_uri(id), crate::report::command_line_json(&op["command"]))
                        .with_description(format!(
                            "operation {id}: {}",
                            op["status"].as_str().unwrap_or("-")
                        ))
                        .with_mime_type("application/json"),
                )
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let auth = self.auth(&ctx)?;
        let Some(id) = op_of_uri(&request.uri) else {
            return Err(McpError::resource_not_found(
                format!(
                    "no resource {}: operations are opkernel://operations/<id>",
                    request.uri
                ),
                None,
            ));
        };
        let (status, body) = self
            .call(
                &auth,
                reqwest::Method::GET,
                &format!("/v1/operations/{id}"),
                None,
            )
            .await?;
        if status != 200 {
            return Err(McpError::resource_not_found(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("no such operation")
                    .to_owned(),
                None,
            ));
        }
        let text = serde_json::to_string_pretty(&body).unwrap_or_default();
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, request.uri.clone()).with_mime_type("application/json")
        ])
        .into())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let auth = self.auth(&ctx)?;
        self.session.subscribed.lock().insert(request.uri.clone());
        self.follow(auth, ctx.peer.clone());
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.session.subscribed.lock().remove(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    /// The 2026 revision's means: `resources/updated` for each listened op
    /// of the run that resolves, while the client listens.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let auth = self.auth(context.request_context())?;
        let Some(mut after) = self.last_seq(&auth).await else {
            return Err(McpError::internal_error(
                "cannot read the run's events",
                None,
            ));
        };
        // an op that resolved between the acknowledgment and the cursor
        // above is announced now: a listener misses nothing
        for uri in context.requested().resource_subscriptions.iter().flatten() {
            let Some(id) = op_of_uri(uri) else { continue };
            let path = format!("/v1/operations/{id}");
            if let Ok((200, op)) = self
                .backend
                .call(&auth.token, reqwest::Method::GET, &path, None)
                .await
            {
                let done = !matches!(
                    op["status"].as_str(),
                    Some("starting" | "running" | "awaiting_approval")
                );
                if done {
                    let _ = context.sink().notify_resource_updated(uri.clone()).await;
                }
            }
        }
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                step = self.resolutions(&auth, after, 20) => {
                    let Some((resolved, next)) = step else {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    };
                    after = next;
                    for (op, _) in resolved {
                        // the sink drops what the client did not listen for
                        let _ = context
                            .sink()
                            .notify_resource_updated(op_uri(&op))
                            .await;
                    }
                }
            }
        }
    }
}
