//! The MCP server (SPEC §17), built on `rmcp`: agent hosts use opkernel as
//! their command tool. One handler serves both transports: stdio
//! (`opkernel mcp --run RUN`, one process per agent, talking to the daemon
//! over HTTP) and streamable HTTP at `/mcp` on the daemon (the run token as
//! bearer). Tools go through the kernel's HTTP API ([`backend`]), so their
//! schemas, limits and messages are the API's own (`tools`).
//!
//! Exactly once without loss: a report is acknowledged only when the
//! client shows it has it. A session (stdio, or a legacy 2025-xx HTTP
//! session) acks a report once its answer was written out to the client
//! and a later call (or a clean close) followed ([`ack`], [`delivery`]);
//! on the stateless 2026-07-28 revision, or whenever it likes, the client
//! passes `ack` = the previous `report_id`. A report not acknowledged is
//! served again.

pub mod ack;
pub mod backend;
mod call;
pub mod delivery;
mod follow;
pub mod http;
mod reports;
mod tools;

use std::collections::HashSet;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, SubscribeRequestParams, SubscriptionFilter,
    Tool, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;

use crate::base::sync::Lock;
use crate::surfaces::views::{OpList, OpView};
use ack::{Ledger, Transport};
use backend::{Answer, Backend, Caller};
pub use call::{BadCall, ToolCall};
pub use tools::tools_from_api;
use tools::{
    bad_arguments, kill_operation_text, operation_state_text, run_command_text, tool_result,
};

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
    /// The run's bearer token, sent with every API call the handler makes.
    pub token: String,
    /// The run the token belongs to; the handler's tools act on it.
    pub run: String,
    /// The client and session, the origin's channel (SPEC §28); filled in
    /// for each request.
    pub channel: String,
}

impl RunAuth {
    /// The caller of an API request made for this auth.
    pub fn caller(&self) -> Caller<'_> {
        Caller {
            token: &self.token,
            channel: &self.channel,
        }
    }
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
    /// HTTP: the handlers of open legacy sessions by `Mcp-Session-Id`, so
    /// `/mcp`'s responses reach the session's ledger and a clean close
    /// (DELETE) acks what was written out to it.
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
    /// The reports it served and not yet acknowledged, with the evidence
    /// its client has them (shared with the transport that writes them).
    ledger: Arc<Lock<Ledger>>,
    /// When the client last asked anything (unix ms).
    last_seen: std::sync::atomic::AtomicI64,
    /// The run this session acts as (its first authenticated request's).
    auth: Lock<Option<RunAuth>>,
    /// Resource URIs a legacy client subscribed to.
    subscribed: Lock<HashSet<String>>,
    /// The resolution follower runs (once per session).
    following: std::sync::atomic::AtomicBool,
    /// This handler's own session id (stdio, which has no header's).
    id: String,
}

impl OpkernelMcp {
    /// A handler with a fresh session over `backend`, publishing `tools`;
    /// `fixed_auth` is the run for stdio, `None` over HTTP (each request's
    /// bearer token says).
    pub fn new(
        backend: Arc<dyn Backend>,
        tools: Arc<Vec<Tool>>,
        fixed_auth: Option<RunAuth>,
    ) -> Self {
        OpkernelMcp {
            backend,
            tools,
            fixed_auth,
            session: Arc::new(Session {
                id: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
                ..Session::default()
            }),
            sessions: None,
        }
    }

    /// Registers the handler's legacy sessions in `sessions` (HTTP).
    pub fn with_sessions(mut self, sessions: Sessions) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// A legacy session closed cleanly (DELETE): it has what was written
    /// out to it.
    pub async fn close_session(sessions: &Sessions, id: &str) {
        let handler = sessions.lock().remove(id);
        if let Some(handler) = handler {
            handler.finish().await;
        }
    }

    /// The session's ledger, for the transport writing its answers.
    pub fn ledger(&self) -> Arc<Lock<Ledger>> {
        self.session.ledger.clone()
    }

    /// The ledger of the open legacy session `id`, once it made a call.
    pub fn ledger_of(sessions: &Sessions, id: &str) -> Option<Arc<Lock<Ledger>>> {
        sessions.lock().get(id).map(OpkernelMcp::ledger)
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
    /// Who the request acts as, with its channel: the client's name and
    /// version from its `initialize`, and its session (`Mcp-Session-Id`;
    /// stdio: this process's own session; else `stateless`).
    fn auth(&self, ctx: &RequestContext<RoleServer>) -> Result<RunAuth, McpError> {
        let mut auth = self.auth_of(ctx)?;
        let client = ctx.peer.peer_info().map_or_else(
            || "unknown client".to_owned(),
            |p| format!("{} {}", p.client_info.name, p.client_info.version),
        );
        let header = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let session = match (header, &self.fixed_auth) {
            // a digest: the session id itself is a bearer of the session
            (Some(id), _) => {
                use sha2::Digest;
                hex::encode(sha2::Sha256::digest(id.as_bytes()))[..12].to_owned()
            }
            (None, Some(_)) => self.session.id.clone(),
            (None, None) => "stateless".to_owned(),
        };
        auth.channel = format!("{client} session {session}");
        Ok(auth)
    }

    fn auth_of(&self, ctx: &RequestContext<RoleServer>) -> Result<RunAuth, McpError> {
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
            .call(auth.caller(), method, path, body)
            .await
            .map_err(|e| McpError::internal_error(e, None))
    }

    /// A tool that is one `POST` of the API's tool endpoint of the same
    /// name, its answer read back as its typed view.
    async fn plain<A: serde::Serialize, V: serde::de::DeserializeOwned>(
        &self,
        auth: &RunAuth,
        tool: &str,
        args: &A,
        text: impl FnOnce(&V) -> String,
    ) -> Result<rmcp::model::CallToolResult, McpError> {
        let path = format!("/v1/runs/{}/tools/{tool}", auth.run);
        let body = serde_json::to_value(args).ok();
        let answer = self.call(auth, reqwest::Method::POST, &path, body).await?;
        Ok(tool_result(answer, text))
    }

    /// Carries out a parsed tool call: each tool is a call of the API,
    /// its answer read back as its typed view.
    async fn dispatch(
        &self,
        auth: &RunAuth,
        call: ToolCall,
        session: bool,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResult, McpError> {
        let run = &auth.run;
        let post = reqwest::Method::POST;
        Ok(match call {
            ToolCall::RunCommand(args) => {
                // one key per tool call, kept across this server's own
                // retries: a store blip or a restart never starts it twice
                let path = format!("/v1/runs/{run}/tools/run_command");
                let answer = backend::start_once(
                    self.backend.as_ref(),
                    auth.caller(),
                    &path,
                    serde_json::to_value(&args)
                        .map_err(|e| McpError::internal_error(e.to_string(), None))?,
                )
                .await
                .map_err(|e| McpError::internal_error(e, None))?;
                tool_result(answer, run_command_text)
            }
            ToolCall::KillOperation(args) => {
                let path = format!("/v1/runs/{run}/tools/kill_operation");
                let answer = self
                    .call(auth, post, &path, serde_json::to_value(&args).ok())
                    .await?;
                tool_result(answer, kill_operation_text)
            }
            ToolCall::WriteStdin(args) => {
                // keyed like a start: a retried write is applied once
                let path = format!("/v1/runs/{run}/tools/write_stdin");
                let body = serde_json::to_value(&args)
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                let answer = backend::start_once(self.backend.as_ref(), auth.caller(), &path, body)
                    .await
                    .map_err(|e| McpError::internal_error(e, None))?;
                tool_result(answer, tools::stdin_text)
            }
            ToolCall::ReadOutput(args) => {
                self.plain(auth, "read_output", &args, tools::output_text)
                    .await?
            }
            ToolCall::ResizeTty(args) => {
                self.plain(auth, "resize_tty", &args, kill_operation_text)
                    .await?
            }
            ToolCall::ReadFile(args) => {
                self.plain(auth, "read_file", &args, tools::file_text)
                    .await?
            }
            ToolCall::WriteFile(args) => {
                self.plain(auth, "write_file", &args, tools::written_text)
                    .await?
            }
            ToolCall::ListDir(args) => {
                self.plain(auth, "list_dir", &args, tools::listing_text)
                    .await?
            }
            ToolCall::OperationState { operation_id } => {
                let path = format!("/v1/operations/{operation_id}");
                let answer = self.call(auth, reqwest::Method::GET, &path, None).await?;
                tool_result(answer, operation_state_text)
            }
            ToolCall::WaitBackgroundReport { wait_sec, ack } => {
                self.wait_report(auth, wait_sec, ack, session, ctx).await?
            }
        })
    }

    /// Notes the client asking something.
    fn arrive(&self) {
        self.session
            .last_seen
            .store(crate::store::now_ms(), std::sync::atomic::Ordering::Relaxed);
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
        self.arrive();
        let transport = Transport::of(
            self.fixed_auth.is_some(),
            ctx.protocol_version().as_ref().map(|v| v.has_initialize()),
        );
        let session = transport.tracks();
        // a session's call shows the client has what was written out to it
        if session {
            self.ack_delivered(&auth).await;
        }
        let args = request.arguments.unwrap_or_default();
        let result = match ToolCall::parse(request.name.as_ref(), args) {
            Ok(call) => self.dispatch(&auth, call, session, &ctx).await?,
            Err(BadCall::UnknownTool(message)) => {
                return Err(McpError::invalid_params(message, None))
            }
            Err(BadCall::Arguments(message)) => bad_arguments(message),
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
        let list: OpList = serde_json::from_value(body)
            .map_err(|e| McpError::internal_error(format!("cannot list operations: {e}"), None))?;
        let resources = list
            .operations
            .iter()
            .map(|op| {
                let id = &op.operation_id;
                Resource::new(op_uri(id), crate::report_text::command_line(&op.command))
                    .with_description(format!("operation {id}: {}", op.status))
                    .with_mime_type("application/json")
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
        let op: OpView = serde_json::from_value(body)
            .map_err(|e| McpError::internal_error(format!("operation {id}: {e}"), None))?;
        // the op's state as JSON, keys in order
        let text = serde_json::to_value(&op)
            .and_then(|v| serde_json::to_string_pretty(&v))
            .unwrap_or_default();
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
        self.listen_resolutions(context).await
    }
}
