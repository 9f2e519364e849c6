//! opkernel's pure rules, apart from everything that does I/O.
//!
//! Each module holds one set of rules as functions of values: the kernel's
//! runtime (observers, store, API) gathers the facts, asks here, and carries
//! out the answer. Nothing here reads a clock, touches a file, a database, a
//! container or the async runtime, and Cargo enforces it: this crate depends
//! on no runtime, store or Docker client.

#![deny(missing_docs)]

pub mod approval;
pub mod decide;
pub mod egress;
pub mod envelope;
pub mod event_kind;
pub mod evidence;
pub mod lifecycle;
pub mod origin;
pub mod report_text;
pub mod runs;
pub mod timing;
pub mod wake;
