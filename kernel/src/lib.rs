//! opkernel: the container sandbox operation kernel for AI agents.

pub mod lifecycle;
pub mod report;
pub mod store;
