//! The settings: one declarative table ([`table`]), one reader with one
//! syntax per kind (durations `500ms`, `10s`, `5m`, `7d`; sizes `512MiB`),
//! the kernel's [`Config`](crate::runtime::config::Config) loaded from it
//! ([`load`]) and its reference rendered from it ([`docs`]).
//!
//! Precedence: a `serve` flag, then the variable, then its old name (read
//! in its old unit, with a warning), then the default. A value that does
//! not parse refuses the start, naming the setting.

pub mod declared;
pub mod docs;
pub mod load;
pub mod table;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// What a setting's value is, and so how it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A whole number.
    Count,
    /// A size: bytes, or a number with a unit (`512MiB`, `1GB`).
    Bytes,
    /// A number with a unit: `500ms`, `10s`, `5m`, `12h`, `7d`.
    Duration,
    /// `host:port`, or a bare port meaning that port on loopback.
    Address,
    /// One item per line.
    List,
    /// `on`/`off` (also `1`/`0`, `true`/`false`, `yes`/`no`).
    Switch,
    /// Free text, checked where it is used.
    Text,
    /// A file or directory.
    Path,
    /// A URL.
    Url,
    /// Text that is never shown.
    Secret,
}

impl Kind {
    /// The kind's placeholder in `--help`.
    pub fn value_name(self) -> &'static str {
        match self {
            Kind::Count => "COUNT",
            Kind::Bytes => "BYTES",
            Kind::Duration => "DURATION",
            Kind::Address => "ADDRESS",
            Kind::List => "LIST",
            Kind::Switch => "SWITCH",
            Kind::Text => "TEXT",
            Kind::Path => "PATH",
            Kind::Url => "URL",
            Kind::Secret => "SECRET",
        }
    }

    /// The kind's name in the docs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Count => "count",
            Kind::Bytes => "bytes",
            Kind::Duration => "duration",
            Kind::Address => "address",
            Kind::List => "list",
            Kind::Switch => "switch",
            Kind::Text => "text",
            Kind::Path => "path",
            Kind::Url => "url",
            Kind::Secret => "secret",
        }
    }
}

/// Who reads a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `opkernel serve`.
    Serve,
    /// The client verbs and `opkernel mcp`.
    Client,
    /// Both.
    Both,
    /// The recovery drills' hooks.
    Drills,
}

/// The unit an old name's bare number was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldUnit {
    /// Whole milliseconds (`OPKERNEL_GRACE_MS=3000`).
    Millis,
    /// Whole seconds (`OPKERNEL_REAP_TTL_SECONDS=3600`).
    Seconds,
    /// The same syntax as the new name (sizes always took units).
    Bytes,
}

/// A setting's name before this release, kept for one release with a
/// warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias {
    /// The old variable.
    pub env: &'static str,
    /// What its bare number meant.
    pub unit: OldUnit,
}

/// One setting, declared once in [`table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Its environment variable.
    pub env: &'static str,
    /// Its `opkernel serve` flag (without `--`), where it has one.
    pub flag: Option<&'static str>,
    /// How its value is read.
    pub kind: Kind,
    /// Who reads it.
    pub scope: Scope,
    /// Its default in its own syntax; empty: none.
    pub default: &'static str,
    /// What it does (the table's doc comment).
    pub doc: &'static str,
    /// Its old name, read with a warning.
    pub alias: Option<Alias>,
}

impl Setting {
    /// The doc comment as one line.
    pub fn doc_line(&self) -> String {
        self.doc.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// Reads settings from flags and an environment, collecting what does not
/// parse (`invalid`) and old names in use (`warnings`).
pub struct Reader<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    flags: BTreeMap<&'static str, String>,
    /// Each setting that could not be read, with its reason.
    pub invalid: Vec<String>,
    /// Each old name in use, with its new one.
    pub warnings: Vec<String>,
}

impl<'a> Reader<'a> {
    /// A reader of `env` (a variable's value by name) with `flags` (by
    /// variable name) above it.
    pub fn new(
        env: &'a dyn Fn(&str) -> Option<String>,
        flags: BTreeMap<&'static str, String>,
    ) -> Reader<'a> {
        Reader {
            env,
            flags,
            invalid: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn var(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }

    /// The text given for `s`, in its own syntax; `None`: its default.
    pub fn raw(&mut self, s: &Setting) -> Option<String> {
        if let Some(v) = self.flags.get(s.env) {
            return Some(v.clone());
        }
        let new = self.var(s.env);
        let old = s.alias.and_then(|a| self.var(a.env).map(|v| (a, v)));
        match (new, old) {
            (Some(v), Some((a, _))) => {
                self.invalid.push(format!(
                    "{}: also set under its old name {}; keep only {}",
                    s.env, a.env, s.env
                ));
                Some(v)
            }
            (Some(v), None) => Some(v),
            (None, Some((a, v))) => {
                self.warnings.push(format!(
                    "{} is the old name of {} (in {}); it is read until opkernel 0.2.0",
                    a.env,
                    s.env,
                    s.kind.name()
                ));
                self.in_new_syntax(s, a, &v)
            }
            (None, None) => None,
        }
    }

    /// An old name's value in the new syntax: a bare number gets its unit.
    fn in_new_syntax(&mut self, s: &Setting, a: Alias, v: &str) -> Option<String> {
        let suffix = match a.unit {
            OldUnit::Bytes => return Some(v.to_owned()),
            OldUnit::Millis => "ms",
            OldUnit::Seconds => "s",
        };
        match v.trim().parse::<u64>() {
            Ok(n) => Some(format!("{n}{suffix}")),
            Err(_) => {
                let unit = if suffix == "ms" {
                    "milliseconds"
                } else {
                    "seconds"
                };
                self.invalid.push(format!(
                    "{} (old name of {}): {v:?} is not a whole number of {unit}",
                    a.env, s.env
                ));
                None
            }
        }
    }

    /// The value of `s` parsed by `parse`; a refusal names the setting and
    /// the default stands in (the start is refused anyway).
    fn value<T>(&mut self, s: &Setting, parse: fn(&str) -> Result<T, String>) -> T {
        let default = || match parse(s.default) {
            Ok(v) => v,
            Err(e) => panic!("the default of {} does not parse: {e}", s.env),
        };
        match self.raw(s) {
            Some(text) => parse(&text).unwrap_or_else(|e| {
                self.invalid.push(format!("{}: {e}", s.env));
                default()
            }),
            None => default(),
        }
    }

    /// A [`Kind::Duration`].
    pub fn duration(&mut self, s: &Setting) -> Duration {
        debug_assert_eq!(s.kind, Kind::Duration, "{}", s.env);
        self.value(s, parse_duration)
    }

    /// A [`Kind::Bytes`].
    pub fn bytes(&mut self, s: &Setting) -> u64 {
        debug_assert_eq!(s.kind, Kind::Bytes, "{}", s.env);
        self.value(s, parse_bytes)
    }

    /// A [`Kind::Count`].
    pub fn count(&mut self, s: &Setting) -> u64 {
        debug_assert_eq!(s.kind, Kind::Count, "{}", s.env);
        self.value(s, parse_count)
    }

    /// A [`Kind::Switch`].
    pub fn switch(&mut self, s: &Setting) -> bool {
        debug_assert_eq!(s.kind, Kind::Switch, "{}", s.env);
        self.value(s, parse_switch)
    }

    /// A [`Kind::Address`]; `None` when unset without a default.
    pub fn address(&mut self, s: &Setting) -> Option<SocketAddr> {
        debug_assert_eq!(s.kind, Kind::Address, "{}", s.env);
        self.value(s, |t| match t.trim() {
            "" => Ok(None),
            t => parse_address(t).map(Some),
        })
    }

    /// A [`Kind::List`]: its non-blank lines, trimmed.
    pub fn list(&mut self, s: &Setting) -> Vec<String> {
        debug_assert_eq!(s.kind, Kind::List, "{}", s.env);
        let text = self.raw(s).unwrap_or_else(|| s.default.to_owned());
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Any other kind, as given (trimmed); `None` when unset without a
    /// default.
    pub fn text(&mut self, s: &Setting) -> Option<String> {
        let text = self.raw(s).unwrap_or_else(|| s.default.to_owned());
        Some(text.trim().to_owned()).filter(|t| !t.is_empty())
    }
}

/// A duration: a number with a unit (`500ms`, `10s`, `5m`, `12h`, `7d`,
/// or several: `1h 30m`), at most 100 years.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{text:?} needs a unit: ms, s, m, h or d (e.g. 10s)"
        ));
    }
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration such as 500ms, 10s, 5m or 7d ({e})"))?;
    if d > Duration::from_secs(100 * 365 * 86_400) {
        return Err(format!("{text:?} is longer than 100 years"));
    }
    Ok(d)
}

/// A size: a whole number of bytes, or a number with a unit (`512MiB`,
/// `1GB`, `64KiB`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.starts_with('-') || text.is_empty() {
        return Err(format!("{text:?} is not a size such as 512MiB"));
    }
    text.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{text:?} is not a size such as 512MiB ({e})"))
}

/// A whole number.
pub fn parse_count(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))
}

/// `on`, `1`, `true`, `yes` or `off`, `0`, `false`, `no`.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

/// `host:port`, or a bare port meaning that port on loopback.
pub fn parse_address(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse()
        .map_err(|_| format!("{text:?} is neither a port nor an address such as 127.0.0.1:9464"))
}

#[cfg(test)]
mod table_tests;
