//! What every layer of the kernel shares, below the store: locks that
//! cannot poison and the loops' stop ([`sync`]), the Prometheus metrics
//! ([`metrics`]) and tokens ([`tokens`]).

pub mod metrics;
pub mod sync;
pub mod tokens;
