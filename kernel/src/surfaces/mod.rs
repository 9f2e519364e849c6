//! What agents and operators reach: the HTTP API ([`api`], the panel's
//! assets among its routes), MCP ([`mcp`], every tool a call of the API),
//! the `opkernel` CLI ([`cli`], a client of the API), the typed views all
//! of them exchange ([`views`]), the tool definitions ([`tools`]) and
//! tokens ([`auth`]). The panel's JS and CSS are in `panel/`.

pub mod api;
pub mod auth;
pub mod cli;
pub mod mcp;
pub mod requests;
pub mod retry;
pub mod tools;
pub mod views;
