//! The CLI's HTTP client: one daemon, one bearer token.

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

/// A client of one daemon with one bearer token; cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// The daemon at `base` with `token`, else the operator token in
    /// `home`; an error when neither is there.
    pub fn connect(base: String, token: Option<String>, home: &Path) -> anyhow::Result<Client> {
        let token = match token {
            Some(t) => t,
            None => {
                let path = home.join("operator.token");
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!(
                            "no OPKERNEL_TOKEN and cannot read {} (is the kernel started?)",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_owned()
            }
        };
        Ok(Client::new(base, token).as_cli())
    }

    /// The same client, its calls saying they come from the CLI (SPEC
    /// §28: surface `cli`, channel `opkernel <version>`).
    pub fn as_cli(mut self) -> Client {
        use reqwest::header::{HeaderMap, HeaderValue};
        let mut headers = HeaderMap::new();
        let version = concat!("opkernel ", env!("CARGO_PKG_VERSION"));
        headers.insert(
            crate::surfaces::auth::SURFACE_HEADER,
            HeaderValue::from_static("cli"),
        );
        headers.insert(
            crate::surfaces::auth::CHANNEL_HEADER,
            HeaderValue::from_static(version),
        );
        if let Ok(http) = crate::base::tls::client().default_headers(headers).build() {
            self.http = http;
        }
        self
    }

    /// A client of the daemon at `base` (trailing `/` dropped) with
    /// `token`, trusting the system's roots and the CAs given to
    /// [`crate::base::tls::trust`] (`OPKERNEL_CA`).
    pub fn new(base: String, token: String) -> Client {
        Client {
            http: crate::base::tls::client().build().unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            token,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn check(resp: reqwest::Response) -> anyhow::Result<reqwest::Response> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("request failed");
        bail!("{message} (HTTP {})", status.as_u16())
    }

    /// With its causes: "invalid peer certificate: UnknownIssuer" tells
    /// an operator to set `OPKERNEL_CA`, "error sending request" does not.
    fn send_err(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow!(
            "cannot reach the kernel at {}: {:#}",
            self.base,
            anyhow::Error::from(e)
        )
    }

    /// Sends with the bearer token; a connection failure or an error
    /// status becomes an error carrying the API's message.
    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.send_err(e))?;
        Self::check(resp).await
    }

    /// A raw request with the token (`body` streamed when given): the
    /// answer, an error status turned into an error with the API's message.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<reqwest::Body>,
    ) -> anyhow::Result<reqwest::Response> {
        let mut req = self.http.request(method, self.url(path));
        if let Some(body) = body {
            req = req
                .header("content-type", "application/octet-stream")
                .body(body);
        }
        self.send(req).await
    }

    /// `GET` with the token, the JSON answer as it came; an error status
    /// becomes an error with the API's message.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(self
            .send(self.http.get(self.url(path)))
            .await?
            .json()
            .await?)
    }

    /// `get`, read as a typed view.
    pub async fn get_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let v = self.get(path).await?;
        serde_json::from_value(v).with_context(|| format!("unexpected answer from GET {path}"))
    }

    /// `post_with` of a typed request body, read as a typed view.
    pub async fn post_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl serde::Serialize + ?Sized),
        idempotency_key: Option<&str>,
    ) -> anyhow::Result<T> {
        let body = serde_json::to_value(body)?;
        let v = self.post_with(path, &body, idempotency_key).await?;
        serde_json::from_value(v).with_context(|| format!("unexpected answer from POST {path}"))
    }

    /// A `POST` that carries no body (an action named by its path), read as
    /// a typed view.
    pub async fn post_empty_as<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> anyhow::Result<T> {
        let v: Value = self
            .send(self.http.post(self.url(path)))
            .await?
            .json()
            .await?;
        serde_json::from_value(v).with_context(|| format!("unexpected answer from POST {path}"))
    }

    /// `DELETE`, read as a typed view.
    pub async fn delete_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let v: Value = self
            .send(self.http.delete(self.url(path)))
            .await?
            .json()
            .await?;
        serde_json::from_value(v).with_context(|| format!("unexpected answer from DELETE {path}"))
    }

    /// `GET` of a raw body (an op's log), as bytes.
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        Ok(self
            .send(self.http.get(self.url(path)))
            .await?
            .bytes()
            .await?
            .to_vec())
    }

    /// `POST` of a JSON body, the JSON answer as it came.
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.post_with(path, body, None).await
    }

    /// `post` with an optional `Idempotency-Key` header, so a retried
    /// start returns the same op.
    pub async fn post_with(
        &self,
        path: &str,
        body: &Value,
        idempotency_key: Option<&str>,
    ) -> anyhow::Result<Value> {
        let mut req = self.http.post(self.url(path)).json(body);
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key);
        }
        Ok(self.send(req).await?.json().await?)
    }

    /// Streams an SSE endpoint, calling `on_event(event, data)` per event
    /// until the stream ends or `on_event` returns false.
    pub async fn sse(
        &self,
        path: &str,
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> anyhow::Result<()> {
        use futures::StreamExt;
        let mut stream = self
            .send(self.http.get(self.url(path)))
            .await?
            .bytes_stream();
        let mut buf = String::new();
        let (mut event, mut data) = (String::new(), String::new());
        while let Some(chunk) = stream.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk?));
            while let Some(nl) = buf.find('\n') {
                let line = buf[..nl].trim_end_matches('\r').to_owned();
                buf.drain(..=nl);
                if line.is_empty() {
                    if (!event.is_empty() || !data.is_empty()) && !on_event(&event, &data) {
                        return Ok(());
                    }
                    event.clear();
                    data.clear();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
        }
        Ok(())
    }
}

impl Client {
    /// Any request; returns the HTTP status and the JSON body (or `Null`).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self
            .http
            .request(method, self.url(path))
            .bearer_auth(&self.token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| self.send_err(e))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// A start (`POST` of `body` to `path`) with one `Idempotency-Key`
    /// (`key`, else one made for this call), sent again with the same key
    /// while the kernel does not answer or answers `503`
    /// ([`crate::surfaces::retry`]): the command runs once.
    pub async fn start_once<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl serde::Serialize + ?Sized),
        key: Option<&str>,
    ) -> anyhow::Result<T> {
        let body = &serde_json::to_value(body)?;
        let made = uuid::Uuid::new_v4().to_string();
        let headers = [("Idempotency-Key", key.unwrap_or(&made))];
        let post = || self.request(reqwest::Method::POST, path, Some(body), &headers);
        let status = |a: &anyhow::Result<(u16, Value)>| a.as_ref().ok().map(|(s, _)| *s);
        let (status, v) = crate::surfaces::retry::until_answered(post, status).await?;
        if !(200..300).contains(&status) {
            let message = v["error"]["message"].as_str().unwrap_or("request failed");
            bail!("{message} (HTTP {status})");
        }
        serde_json::from_value(v).with_context(|| format!("unexpected answer from POST {path}"))
    }

    /// The daemon's base URL, without a trailing `/`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The bearer token this client sends.
    pub fn token(&self) -> &str {
        &self.token
    }
}
