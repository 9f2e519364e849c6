//! The kernel at run time: its shared state by job ([`kernel`]), one
//! supervised observer per live op ([`observer`]), the control layer every
//! start, kill and change goes through ([`control`]), the background loops
//! ([`housekeeping`]: heartbeat, approval timeouts, [`reaper`],
//! [`retention`], the observers' watchdog, [`webhooks`], [`scheduler`]), the evidence
//! sources ([`probes`], [`watcher`], [`inbox`]).
//! Its settings, one options struct per concern, are [`config`]. Everything here carries out the domain crate's rules
//! against the store and Docker.

pub mod config;
pub mod control;
pub mod egress;
#[cfg(test)]
pub(crate) mod fake_backend;
pub mod home;
pub mod housekeeping;
pub mod inbox;
pub mod interactive;
pub mod kernel;
pub mod node;
pub mod observer;
pub mod pool;
pub mod probes;
pub mod reaper;
pub mod retention;
pub mod runmeta;
pub mod scheduler;
pub mod stop;
pub mod watcher;
pub mod webhooks;
pub mod workspace;
