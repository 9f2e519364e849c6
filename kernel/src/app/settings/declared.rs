//! The declared schedules file (`OPKERNEL_SCHEDULES`, SPEC §28): TOML, one
//! `[[schedule]]` table each, with the API's own field names. Read and
//! checked whole at start; anything wrong stops the start with the line
//! at fault.
//!
//! ```toml
//! version = 3              # optional: files with versions apply in order
//!
//! [[schedule]]
//! name = "nightly-build"   # optional: its key (else its run and command)
//! run = "nightly"          # made as a top-level run if absent
//! command = ["make", "nightly"]
//! cron = "0 3 * * *"       # or every_sec = 3600, or at = "2027-01-01T00:00:00Z"
//! timeout_sec = 900
//! catch_up = false
//! ```

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::store::{Declared, DeclaredFile};
use crate::timing::Timing;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: Option<i64>,
    #[serde(default)]
    schedule: Vec<toml::Spanned<Entry>>,
}

/// The largest file read, and the most entries it may hold.
const MAX_BYTES: u64 = 1 << 20;
const MAX_ENTRIES: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: Option<String>,
    run: String,
    command: Vec<String>,
    cron: Option<String>,
    every_sec: Option<u64>,
    at: Option<String>,
    timeout_sec: Option<u64>,
    #[serde(default)]
    catch_up: bool,
}

/// The line (from 1) of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The timeouts a declared schedule's op may have: the default (a
/// background op's) and the most (`OPKERNEL_BG_MAX_TIMEOUT`).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Without `timeout_sec`.
    pub default_sec: u64,
    /// The most `timeout_sec` may be.
    pub max_sec: u64,
}

/// One entry checked as the API checks a schedule: its key, or why not.
fn check(e: Entry, t: Timeouts) -> Result<Declared, String> {
    sandbox::profile::validate_run_id(&e.run).map_err(|err| err.to_string())?;
    sandbox::shim::validate_command(&e.command).map_err(|err| err.to_string())?;
    let timing = Timing::from_request(e.cron.as_deref(), e.every_sec, e.at.as_deref())?;
    if timing.is_recurring() && timing.first_due(crate::store::now_ms()).is_none() {
        return Err("this cron expression never matches a future time".to_owned());
    }
    let timeout_sec = e.timeout_sec.unwrap_or(t.default_sec.min(t.max_sec));
    if timeout_sec == 0 || timeout_sec > t.max_sec {
        return Err(format!(
            "timeout_sec must be between 1 and {} (OPKERNEL_BG_MAX_TIMEOUT), got {timeout_sec}",
            t.max_sec
        ));
    }
    let key = match &e.name {
        Some(name)
            if name.trim().is_empty()
                || name.chars().count() > 128
                || name.chars().any(char::is_control) =>
        {
            return Err("name must be 1 to 128 characters, none a control character".to_owned())
        }
        Some(name) => format!("{}/{name}", e.run),
        None => {
            let argv = serde_json::to_string(&e.command).unwrap_or_default();
            let digest = hex::encode(Sha256::digest(argv.as_bytes()));
            format!("{}/{}", e.run, &digest[..16])
        }
    };
    Ok(Declared {
        key,
        run_id: e.run,
        command: e.command,
        timeout_sec,
        timeout_given: e.timeout_sec.is_some(),
        timing,
        catch_up: e.catch_up,
    })
}

/// Reads and checks the file at `path`; an error names the file and the
/// line at fault.
pub fn read(path: &Path, t: Timeouts) -> Result<DeclaredFile, String> {
    let shown = path.display();
    let size = std::fs::metadata(path)
        .map_err(|e| format!("{shown}: {e}"))?
        .len();
    if size > MAX_BYTES {
        return Err(format!(
            "{shown}: {size} bytes, over the {MAX_BYTES} a file may hold"
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    let text = String::from_utf8(bytes.clone()).map_err(|_| format!("{shown}: not UTF-8"))?;
    let file: File = toml::from_str(&text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(&text, s.start));
        format!("{shown}:{line}: {}", e.message())
    })?;
    if file.schedule.len() > MAX_ENTRIES {
        return Err(format!(
            "{shown}: {} schedules, over the {MAX_ENTRIES} a file may declare",
            file.schedule.len()
        ));
    }
    if file.version.is_some_and(|v| v < 0) {
        return Err(format!("{shown}: version must be 0 or more"));
    }
    let mut schedules: Vec<Declared> = Vec::new();
    for spanned in file.schedule {
        let line = line_of(&text, spanned.span().start);
        let d = check(spanned.into_inner(), t).map_err(|why| format!("{shown}:{line}: {why}"))?;
        if schedules.iter().any(|s| s.key == d.key) {
            return Err(format!(
                "{shown}:{line}: a second schedule {} (give each a distinct name)",
                d.key
            ));
        }
        schedules.push(d);
    }
    Ok(DeclaredFile {
        path: path.display().to_string(),
        sha256: hex::encode(Sha256::digest(&bytes)),
        version: file.version,
        schedules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        default_sec: 900,
        max_sec: 3600,
    };

    fn read_text(text: &str) -> Result<DeclaredFile, String> {
        let dir = std::env::temp_dir().join(format!("opk-declared-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("schedules.toml");
        std::fs::write(&path, text).unwrap();
        let read = read(&path, T);
        let _ = std::fs::remove_dir_all(&dir);
        read
    }

    #[test]
    fn entries_are_read_with_keys_and_a_bad_one_names_its_line() {
        let ok = read_text(
            "[[schedule]]\nname = \"n\"\nrun = \"r\"\ncommand = [\"true\"]\nevery_sec = 60\n\n\
             [[schedule]]\nrun = \"r\"\ncommand = [\"make\"]\ncron = \"0 3 * * *\"\ntimeout_sec = 60\n",
        )
        .unwrap();
        assert_eq!(ok.schedules.len(), 2);
        assert_eq!(ok.schedules[0].key, "r/n");
        assert_eq!(ok.schedules[0].timeout_sec, 900);
        assert!(ok.schedules[1].key.starts_with("r/"));
        let cases = [
            ("[[schedule]]\nrun = \"r\"\ncommand = [\"true\"]\nevery_sec = 60\nbogus = 1\n", ":5:"),
            ("[[schedule]]\nrun = \"r\"\ncommand = [\"true\"]\n", ":1:"),
            ("\n\n[[schedule]]\nrun = \"bad id!\"\ncommand = [\"x\"]\nevery_sec = 1\n", ":3:"),
            ("[[schedule]]\nrun = \"r\"\ncommand = [\"x\"]\nevery_sec = 1\ntimeout_sec = 99999\n", ":1:"),
            ("[[schedule]\n", ":1:"),
        ];
        for (text, line) in cases {
            let err = read_text(text).unwrap_err();
            assert!(err.contains(line), "{text:?}: {err}");
        }
        let twice = "[[schedule]]\nname = \"a\"\nrun = \"r\"\ncommand = [\"x\"]\nevery_sec = 1\n\
                     [[schedule]]\nname = \"a\"\nrun = \"r\"\ncommand = [\"y\"]\nevery_sec = 1\n";
        assert!(read_text(twice)
            .unwrap_err()
            .contains(":6: a second schedule r/a"));
    }
}
