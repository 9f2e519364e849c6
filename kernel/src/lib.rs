//! opkernel: the container sandbox operation kernel for AI agents.
//!
//! The kernel owns every op's lifecycle (the control plane in SQLite is its
//! single authority); all Docker access goes through the `sandbox` crate.

pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod drills;
#[cfg(test)]
mod fuzz_tests;
pub mod inbox;
pub mod kernel;
pub mod lifecycle;
pub mod observer;
pub mod probes;
pub mod reaper;
pub mod report;
pub mod serve;
pub mod store;
pub mod sync;
pub mod tools;
pub mod views;
pub mod watcher;
