//! The top of the kernel crate: the settings ([`settings`]), the
//! composition of a serving kernel with its routers and loops
//! ([`serve`]) and its TLS listener ([`tls`]), and the binary's command
//! line ([`cli`]).

pub mod cli;
pub mod serve;
pub mod settings;
pub mod tls;
