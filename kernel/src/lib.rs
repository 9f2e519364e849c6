//! opkernel: the container sandbox operation kernel for AI agents.
//!
//! The kernel owns every op's lifecycle (the control plane is its single
//! authority); all Docker access goes through the `sandbox` crate. Its
//! folders are its layers, each naming only those below it: the pure rules
//! (the `opkernel-domain` crate) < `sandbox` < [`base`] (locks, metrics,
//! tokens) < [`store`] (the control plane) < [`runtime`] (the kernel's
//! state, observers and background loops) < [`surfaces`] (HTTP API, MCP,
//! CLI verbs, panel) < [`drills`] (the recovery drills) < [`app`]
//! (settings, composition, the command line).

#![deny(missing_docs)]

/// The pure rules (`opkernel-domain`), under the names the kernel uses.
pub use opkernel_domain::{
    approval, egress, envelope, event_kind, lifecycle, origin, report_text, runs, timing,
};

pub mod app;
pub mod base;
pub mod drills;
pub mod runtime;
pub mod store;
pub mod surfaces;

#[cfg(test)]
mod circle_tests;
#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod layers_tests;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod wall_clock_tests;
