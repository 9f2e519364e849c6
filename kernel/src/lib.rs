//! opkernel: the container sandbox operation kernel for AI agents.
//!
//! The kernel owns every op's lifecycle (the control plane in SQLite is its
//! single authority); all Docker access goes through the `sandbox` crate.

pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod control;
pub mod drills;
pub mod envelope;
pub mod event_kind;
#[cfg(test)]
mod fuzz_tests;
pub mod home;
pub mod inbox;
pub mod kernel;
pub mod lifecycle;
#[cfg(test)]
mod limits_tests;
pub mod mcp;
pub mod observer;
pub mod probes;
pub mod reaper;
pub mod report;
pub mod retention;
pub mod runmeta;
pub mod schedule;
pub mod scheduler;
pub mod serve;
pub mod store;
pub mod sync;
pub mod tasks;
pub mod tools;
pub mod views;
#[cfg(test)]
mod wall_clock_tests;
pub mod watcher;

#[cfg(test)]
mod layering_tests {
    /// Lower layers never name upper ones (comments aside): `kernel.rs`
    /// knows no observer, `probes.rs` no kernel, and the decision core
    /// touches neither the kernel, the store nor the async runtime.
    #[test]
    fn lower_layers_never_name_upper_ones() {
        let upper_than_kernel: &[&str] = &[
            "crate::observer",
            "crate::reaper",
            "crate::api",
            "crate::serve",
        ];
        let upper_than_probes: &[&str] = &[
            "crate::kernel",
            "crate::observer",
            "crate::reaper",
            "crate::api",
        ];
        let rules: &[(&str, &str, &[&str])] = &[
            ("kernel.rs", include_str!("kernel.rs"), upper_than_kernel),
            ("probes.rs", include_str!("probes.rs"), upper_than_probes),
            ("watcher.rs", include_str!("watcher.rs"), upper_than_probes),
            ("inbox.rs", include_str!("inbox.rs"), upper_than_probes),
            ("sync.rs", include_str!("sync.rs"), upper_than_probes),
            // the rules of runs as tasks are pure: the store applies them
            (
                "tasks.rs",
                include_str!("tasks.rs"),
                &[
                    "crate::kernel",
                    "crate::store",
                    "crate::api",
                    "tokio",
                    "rusqlite",
                ],
            ),
            // so are envelopes
            (
                "envelope.rs",
                include_str!("envelope.rs"),
                &[
                    "crate::kernel",
                    "crate::store",
                    "crate::api",
                    "tokio",
                    "rusqlite",
                ],
            ),
            // so are the kinds of events and their payloads
            (
                "event_kind.rs",
                include_str!("event_kind.rs"),
                &[
                    "crate::kernel",
                    "crate::store",
                    "crate::api",
                    "tokio",
                    "rusqlite",
                ],
            ),
            // a run's cached facts and the home sit below the kernel
            ("runmeta.rs", include_str!("runmeta.rs"), upper_than_kernel),
            ("home.rs", include_str!("home.rs"), upper_than_kernel),
            (
                "retention.rs",
                include_str!("retention.rs"),
                &["crate::api", "crate::serve"],
            ),
            // so is schedule timing
            (
                "schedule.rs",
                include_str!("schedule.rs"),
                &[
                    "crate::kernel",
                    "crate::store",
                    "crate::api",
                    "tokio",
                    "rusqlite",
                ],
            ),
            (
                "observer/evidence.rs",
                include_str!("observer/evidence.rs"),
                &[
                    "crate::kernel",
                    "crate::store",
                    "crate::probes",
                    "tokio",
                    "Kernel",
                ],
            ),
            (
                "observer/decide.rs",
                include_str!("observer/decide.rs"),
                &[
                    "crate::kernel",
                    "crate::store",
                    "crate::probes",
                    "tokio",
                    "Kernel",
                ],
            ),
        ];
        let mut found = Vec::new();
        for (file, text, forbidden) in rules {
            for (n, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                for name in *forbidden {
                    if code.contains(name) {
                        found.push(format!("{file}:{}: {name}", n + 1));
                    }
                }
            }
        }
        assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
    }
}
