//! What every layer of the kernel shares, below the store: locks that
//! cannot poison and the loops' stop ([`sync`]), the Prometheus metrics
//! ([`metrics`]), tokens ([`tokens`]) and TLS ([`tls`]).

pub mod metrics;
pub mod sync;
pub mod tls;
pub mod tokens;
