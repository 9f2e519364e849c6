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
pub use opkernel_domain::{approval, envelope, event_kind, lifecycle, report_text, runs, timing};

pub mod app;
pub mod base;
pub mod drills;
pub mod runtime;
pub mod store;
pub mod surfaces;

#[cfg(test)]
mod circle_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod layers_tests;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod wall_clock_tests;

#[cfg(test)]
mod layering_tests {
    /// Lower layers never name upper ones (comments aside): the kernel's
    /// state knows no observer, `probes.rs` no kernel. (The pure rules are
    /// a crate of their own, `opkernel-domain`: Cargo keeps them pure.)
    #[test]
    fn lower_layers_never_name_upper_ones() {
        let upper_than_kernel: &[&str] = &[
            "crate::runtime::observer",
            "crate::runtime::reaper",
            "crate::surfaces::api",
            "crate::app::",
            "crate::runtime::housekeeping",
        ];
        let upper_than_probes: &[&str] = &[
            "crate::runtime::kernel",
            "crate::runtime::observer",
            "crate::runtime::reaper",
            "crate::surfaces::api",
        ];
        let rules: &[(&str, &str, &[&str])] = &[
            (
                "kernel/mod.rs",
                include_str!("runtime/kernel/mod.rs"),
                upper_than_kernel,
            ),
            (
                "kernel/settle.rs",
                include_str!("runtime/kernel/settle.rs"),
                upper_than_kernel,
            ),
            (
                "kernel/containers.rs",
                include_str!("runtime/kernel/containers.rs"),
                upper_than_kernel,
            ),
            (
                "kernel/handles.rs",
                include_str!("runtime/kernel/handles.rs"),
                upper_than_probes,
            ),
            (
                "kernel/registry.rs",
                include_str!("runtime/kernel/registry.rs"),
                upper_than_probes,
            ),
            (
                "kernel/gates.rs",
                include_str!("runtime/kernel/gates.rs"),
                upper_than_probes,
            ),
            (
                "kernel/runcache.rs",
                include_str!("runtime/kernel/runcache.rs"),
                upper_than_probes,
            ),
            (
                "probes.rs",
                include_str!("runtime/probes.rs"),
                upper_than_probes,
            ),
            (
                "watcher.rs",
                include_str!("runtime/watcher.rs"),
                upper_than_probes,
            ),
            (
                "inbox.rs",
                include_str!("runtime/inbox.rs"),
                upper_than_probes,
            ),
            ("sync.rs", include_str!("base/sync.rs"), upper_than_probes),
            // a run's cached facts and the home sit below the kernel
            (
                "runmeta.rs",
                include_str!("runtime/runmeta.rs"),
                upper_than_kernel,
            ),
            (
                "home.rs",
                include_str!("runtime/home.rs"),
                upper_than_kernel,
            ),
            (
                "retention.rs",
                include_str!("runtime/retention.rs"),
                &["crate::surfaces::api", "crate::app::"],
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

    /// The pure rules stay pure: `opkernel-domain` depends on nothing that
    /// does I/O (no runtime, store, Docker or HTTP client). Adding one is a
    /// decision to make here, in the open.
    #[test]
    fn the_domain_crate_depends_on_no_runtime() {
        let manifest = include_str!("../../domain/Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .unwrap_or_default();
        let names: Vec<&str> = deps
            .lines()
            .filter_map(|l| l.split(['.', ' ', '=']).next())
            .filter(|n| !n.is_empty() && !n.starts_with('#'))
            .collect();
        let allowed = [
            "opkernel-shim",
            "chrono",
            "croner",
            "regex",
            "serde",
            "serde_json",
            "thiserror",
            // derives the API document's schemas of the domain's types
            // (SPEC §23): a description, no I/O
            "utoipa",
        ];
        let extra: Vec<&&str> = names.iter().filter(|n| !allowed.contains(n)).collect();
        assert!(extra.is_empty(), "domain depends on {extra:?}");
        assert!(names.len() >= 5, "scanned {names:?}");
    }
}
