//! The control plane's schema versions: one list for both dialects, each
//! version a file of the same name in `kernel/migrations/` (SQLite) and
//! `kernel/migrations/postgres/` (PostgreSQL). A dialect applies them in
//! order, one transaction each; a schema past the last is refused.

/// One schema version, in both dialects.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its number: the schema version it makes.
    pub version: i64,
    /// Its SQL for SQLite.
    pub sqlite: &'static str,
    /// Its SQL for PostgreSQL.
    pub postgres: &'static str,
}

macro_rules! migration {
    ($version:expr, $file:literal) => {
        Migration {
            version: $version,
            sqlite: include_str!(concat!("../../../migrations/", $file)),
            postgres: include_str!(concat!("../../../migrations/postgres/", $file)),
        }
    };
}

/// Every version, in order.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_control_plane.sql"),
    migration!(2, "0002_kill_evidence.sql"),
    migration!(3, "0003_usage.sql"),
    migration!(4, "0004_launcher.sql"),
    migration!(5, "0005_runs_as_tasks.sql"),
    migration!(6, "0006_approvals_schedules.sql"),
    migration!(7, "0007_leftovers.sql"),
    migration!(8, "0008_retention.sql"),
    migration!(9, "0009_webhooks.sql"),
    migration!(10, "0010_pool.sql"),
    migration!(11, "0011_cluster.sql"),
    migration!(12, "0012_cluster_features.sql"),
    migration!(13, "0013_interactive.sql"),
    migration!(14, "0014_workspaces.sql"),
    migration!(15, "0015_egress.sql"),
    migration!(16, "0016_origin.sql"),
    migration!(17, "0017_declared_schedules.sql"),
    migration!(18, "0018_undelivered_order.sql"),
];

/// The newest schema version this kernel knows.
pub fn known() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Versions count up from 1 without a gap, and every file of both
    /// folders is one of them (a migration written for one dialect only
    /// fails here).
    #[test]
    fn one_list_names_every_file_of_both_dialects() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1);
            assert!(!m.sqlite.trim().is_empty() && !m.postgres.trim().is_empty());
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        for folder in [dir.clone(), dir.join("postgres")] {
            let files = std::fs::read_dir(&folder)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.path().extension().is_some_and(|x| x == "sql"))
                        .count()
                })
                .unwrap_or(0);
            assert_eq!(files, MIGRATIONS.len(), "{}", folder.display());
        }
    }
}
