//! Envelopes, as pure data (SPEC §14, §16): what a run's ops and its
//! container may use, the approval rules they carry, how a top-level run's
//! envelope is resolved and how a child narrows its parent's. No I/O: the
//! API resolves envelopes with these rules, the store records them.

use serde::{Deserialize, Serialize};

use crate::egress::{AllowList, AllowSpec, Network};

/// Approval rules (SPEC §16) carried by the envelope; children may add
/// rules, never remove them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRules {
    /// Regexes matched against the command joined by spaces.
    #[serde(default, rename = "match")]
    pub patterns: Vec<String>,
    /// Every op needs approval.
    #[serde(default)]
    pub all: bool,
    /// Seconds a matching op waits for a decision before `on_timeout` applies
    /// (`None`: forever).
    pub timeout_sec: Option<u64>,
    /// What the approval timeout does (`None`: escalate).
    pub on_timeout: Option<OnTimeout>,
}

/// What happens when an approval's `timeout_sec` passes: never an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Record `approval.escalated`; the op keeps waiting (the default).
    Escalate,
    /// End the op `denied` (`approval timed out`).
    Deny,
}

impl OnTimeout {
    /// The name stored in the control plane and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Escalate => "escalate",
            OnTimeout::Deny => "deny",
        }
    }

    /// The value of a stored name; `None` for anything else.
    pub fn parse(s: &str) -> Option<OnTimeout> {
        match s {
            "escalate" => Some(OnTimeout::Escalate),
            "deny" => Some(OnTimeout::Deny),
            _ => None,
        }
    }
}

impl ApprovalRules {
    /// Whether the rules gate nothing: no pattern, and `all` off.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty() && !self.all
    }
}

/// The OCI runtime of a profile's containers (SPEC §30): `runc` shares the
/// host's kernel; `runsc` (gVisor) puts a user-space kernel between the
/// command and the host's, and is the stricter of the two: an envelope may ask for it, never
/// back from it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// Docker's default runtime.
    #[default]
    Runc,
    /// gVisor, registered with Docker under the name `runsc`.
    Runsc,
}

impl Runtime {
    /// Docker's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }

    /// The runtime called `name`; `None` for any other name.
    pub fn parse(name: &str) -> Option<Runtime> {
        match name {
            "runc" => Some(Runtime::Runc),
            "runsc" => Some(Runtime::Runsc),
            _ => None,
        }
    }

    /// Whether it is `runc` (the default, left out of fingerprints).
    pub fn is_runc(&self) -> bool {
        *self == Runtime::Runc
    }
}

/// An envelope as a request gives it: any subset of the fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeRequest {
    /// Ceiling on an op's `timeout_sec`, in seconds.
    #[schema(minimum = 1)]
    pub max_timeout_sec: Option<u64>,
    /// The container's memory limit, in bytes.
    pub memory_bytes: Option<i64>,
    /// The container's CPU limit, in CPUs (fractions allowed).
    pub cpus: Option<f64>,
    /// The container's limit on the number of processes.
    pub pids_limit: Option<i64>,
    /// The run's network: `"none"`, `"open"`, or `{"allow": [...]}`
    /// (SPEC §27).
    pub network: Option<Network>,
    /// Live ops of the run and its descendants together.
    pub max_live_ops: Option<u64>,
    /// Unfinished (active or paused) descendant runs.
    pub max_children: Option<u64>,
    /// Approval rules to add to the inherited ones (never removing any).
    pub approval: Option<ApprovalRules>,
    /// The images (by the operator's names) the run's children may be
    /// created with (SPEC §26).
    pub images: Option<Vec<String>>,
    /// Disk the tree's snapshots may hold together, in bytes (SPEC §26).
    pub disk_bytes: Option<u64>,
    /// The container's OCI runtime (SPEC §30): `runsc` (gVisor) may be
    /// asked for under `runc`, never the other way round.
    pub runtime: Option<Runtime>,
}

/// A run's envelope with every field resolved (at the run's creation, from
/// its parent's, or the kernel's defaults for a top-level run): what its
/// ops and its container may use. Fixed for the run's life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Envelope {
    /// `None`: only the kernel's own ceilings apply.
    pub max_timeout_sec: Option<u64>,
    /// The container's memory limit, in bytes (0 or less: Docker's unlimited).
    pub memory_bytes: i64,
    /// The container's CPU limit, in CPUs (0: unlimited).
    pub cpus: f64,
    /// The container's limit on processes (0 or less: unlimited).
    pub pids_limit: i64,
    /// The run's network: `none` unless the operator allowed one (a Docker
    /// network, or an allow list through the egress proxy).
    pub network: Network,
    /// Live ops of the run and its descendants together.
    pub max_live_ops: u64,
    /// Unfinished (active or paused) descendant runs.
    #[serde(default = "default_max_children")]
    pub max_children: u64,
    /// The rules every op of the run is matched against (empty: nothing is
    /// gated).
    #[serde(default, skip_serializing_if = "ApprovalRules::is_empty")]
    pub approval: ApprovalRules,
    /// The images (by name) children may be created with; `None`: every
    /// image the operator lists (SPEC §26).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    /// Disk the tree's snapshots may hold together, in bytes; `None`: no
    /// limit of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// The container's OCI runtime; `runc` unless asked (and left out of
    /// the stored form then).
    #[serde(default, skip_serializing_if = "Runtime::is_runc")]
    pub runtime: Runtime,
}

/// The kernel's default `max_children` (`OPKERNEL_MAX_CHILDREN`), also
/// for envelopes recorded before the field existed.
pub const DEFAULT_MAX_CHILDREN: u64 = 32;

fn default_max_children() -> u64 {
    DEFAULT_MAX_CHILDREN
}

/// Why a request may not have the envelope or budget it asks for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EnvelopeError {
    /// Malformed (400).
    #[error("{0}")]
    Invalid(String),
    /// Wider than the parent's (403 `envelope_exceeded`), naming the field.
    #[error("{field}: {asked} is wider than the parent allows ({allowed})")]
    Wider {
        /// The envelope or budget field, by its SPEC name.
        field: &'static str,
        /// The value the request asked for.
        asked: String,
        /// The parent's value, which the request may not exceed.
        allowed: String,
    },
}

const MAX_APPROVAL_PATTERNS: usize = 64;
/// Longest approval timeout: a year.
const MAX_APPROVAL_TIMEOUT_SEC: u64 = 366 * 24 * 3600;
const MAX_PATTERN_BYTES: usize = 1024;
const MAX_IMAGES: usize = 64;

pub(crate) fn invalid(msg: impl Into<String>) -> EnvelopeError {
    EnvelopeError::Invalid(msg.into())
}

pub(crate) fn wider(
    field: &'static str,
    asked: impl ToString,
    allowed: impl ToString,
) -> EnvelopeError {
    EnvelopeError::Wider {
        field,
        asked: asked.to_string(),
        allowed: allowed.to_string(),
    }
}

/// Checks a Docker network name (the envelope never names anything else).
fn validate_network(name: &str) -> Result<(), EnvelopeError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "envelope network must match [A-Za-z0-9_.-]{{1,64}}, got {:?}",
            name.chars().take(80).collect::<String>()
        )))
    }
}

/// The operator's open network: the kernel's own when it has one, else
/// Docker's default bridge.
fn open_network(defaults: &Envelope) -> String {
    match &defaults.network {
        Network::Named(n) if n != "none" => n.clone(),
        _ => "bridge".to_owned(),
    }
}

/// An allow list with its entries as the kernel spells them.
fn normalized(n: &Network) -> Network {
    match n.allow_list() {
        Some(list) => Network::Allow(AllowSpec {
            allow: list.to_strings(),
        }),
        None => n.clone(),
    }
}

/// A child's network within its parent's: `none` always; the parent's own
/// open network (by name or as `open`); an allow list under an open
/// network, or one whose every entry lies within the parent's list.
fn narrow_network(asked: &Network, parent: &Network) -> Result<Network, EnvelopeError> {
    match asked {
        Network::Named(n) if n == "none" => Ok(Network::none()),
        Network::Named(n) if parent.is_open() && (n == "open" || *asked == *parent) => {
            Ok(parent.clone())
        }
        Network::Named(n) => Err(wider("network", n, parent)),
        Network::Allow(_) => {
            let child = asked
                .allow_list()
                .ok_or_else(|| invalid("envelope network: a bad allow list"))?;
            if parent.is_open() {
                return Ok(normalized(asked));
            }
            match parent.allow_list() {
                Some(p) => match p.wider_entry(&child) {
                    None => Ok(normalized(asked)),
                    Some(entry) => Err(wider("network", format!("allow {entry}"), parent)),
                },
                None => Err(wider("network", asked, parent)),
            }
        }
    }
}

impl EnvelopeRequest {
    /// Checks each given field on its own (ranges, regexes).
    pub fn validate(&self) -> Result<(), EnvelopeError> {
        if self.max_timeout_sec == Some(0) {
            return Err(invalid("envelope max_timeout_sec must be at least 1"));
        }
        if let Some(m) = self.memory_bytes {
            if !(6 << 20..=1 << 50).contains(&m) {
                return Err(invalid(format!(
                    "envelope memory_bytes must be between 6291456 (6 MiB, Docker's minimum) and 2^50, got {m}"
                )));
            }
        }
        if let Some(c) = self.cpus {
            if !(c.is_finite() && (0.01..=1024.0).contains(&c)) {
                return Err(invalid(format!(
                    "envelope cpus must be between 0.01 and 1024, got {c}"
                )));
            }
        }
        if let Some(p) = self.pids_limit {
            if !(8..=1 << 22).contains(&p) {
                return Err(invalid(format!(
                    "envelope pids_limit must be between 8 and 4194304, got {p}"
                )));
            }
        }
        match &self.network {
            Some(Network::Named(n)) => validate_network(n)?,
            Some(Network::Allow(spec)) => {
                AllowList::parse(&spec.allow).map_err(|e| invalid(e.to_string()))?;
            }
            None => {}
        }
        if self.max_live_ops == Some(0) {
            return Err(invalid("envelope max_live_ops must be at least 1"));
        }
        if self.max_children.is_some_and(|c| c > 1 << 20) {
            return Err(invalid("envelope max_children must be at most 1048576"));
        }
        if let Some(images) = &self.images {
            validate_images(images)?;
        }
        if self.disk_bytes.is_some_and(|d| d > 1 << 50) {
            return Err(invalid("envelope disk_bytes must be at most 2^50"));
        }
        if let Some(a) = &self.approval {
            if a.patterns.len() > MAX_APPROVAL_PATTERNS {
                return Err(invalid(format!(
                    "envelope approval.match holds at most {MAX_APPROVAL_PATTERNS} patterns"
                )));
            }
            for p in &a.patterns {
                if p.len() > MAX_PATTERN_BYTES {
                    return Err(invalid(format!(
                        "envelope approval.match patterns are at most {MAX_PATTERN_BYTES} bytes"
                    )));
                }
                regex::Regex::new(p)
                    .map_err(|e| invalid(format!("envelope approval.match pattern {p:?}: {e}")))?;
            }
            if a.timeout_sec
                .is_some_and(|t| !(1..=MAX_APPROVAL_TIMEOUT_SEC).contains(&t))
            {
                return Err(invalid(format!(
                    "envelope approval.timeout_sec must be between 1 and {MAX_APPROVAL_TIMEOUT_SEC}"
                )));
            }
        }
        Ok(())
    }

    /// The envelope of a top-level run: the operator's values over the
    /// kernel's defaults. The operator may set any valid value.
    pub fn resolve_top_level(&self, defaults: &Envelope) -> Result<Envelope, EnvelopeError> {
        self.validate()?;
        let mut env = defaults.clone();
        env.max_timeout_sec = self.max_timeout_sec.or(defaults.max_timeout_sec);
        env.memory_bytes = self.memory_bytes.unwrap_or(defaults.memory_bytes);
        env.cpus = self.cpus.unwrap_or(defaults.cpus);
        env.pids_limit = self.pids_limit.unwrap_or(defaults.pids_limit);
        env.network = match &self.network {
            Some(Network::Named(n)) if n == "open" => Network::Named(open_network(defaults)),
            Some(n) => normalized(n),
            None => defaults.network.clone(),
        };
        env.max_live_ops = self.max_live_ops.unwrap_or(defaults.max_live_ops);
        env.max_children = self.max_children.unwrap_or(defaults.max_children);
        if let Some(a) = &self.approval {
            env.approval = add_rules(&defaults.approval, a);
        }
        env.images = self.images.clone().or(defaults.images.clone());
        env.disk_bytes = self.disk_bytes.or(defaults.disk_bytes);
        env.runtime = narrow_runtime(self.runtime, defaults.runtime)?;
        check_runtime_network(&env)?;
        Ok(env)
    }

    /// The envelope of a child: the parent's, narrowed by the request. A
    /// field wider than the parent's is refused, naming the field.
    pub fn narrow(&self, parent: &Envelope) -> Result<Envelope, EnvelopeError> {
        self.validate()?;
        let mut env = parent.clone();
        if let Some(t) = self.max_timeout_sec {
            if let Some(max) = parent.max_timeout_sec.filter(|max| t > *max) {
                return Err(wider("max_timeout_sec", t, max));
            }
            env.max_timeout_sec = Some(t);
        }
        // a parent limit of 0 (or below) is Docker's "unlimited"
        if let Some(m) = self.memory_bytes {
            if parent.memory_bytes > 0 && m > parent.memory_bytes {
                return Err(wider("memory_bytes", m, parent.memory_bytes));
            }
            env.memory_bytes = m;
        }
        if let Some(c) = self.cpus {
            if parent.cpus > 0.0 && c > parent.cpus {
                return Err(wider("cpus", c, parent.cpus));
            }
            env.cpus = c;
        }
        if let Some(p) = self.pids_limit {
            if parent.pids_limit > 0 && p > parent.pids_limit {
                return Err(wider("pids_limit", p, parent.pids_limit));
            }
            env.pids_limit = p;
        }
        if let Some(n) = &self.network {
            env.network = narrow_network(n, &parent.network)?;
        }
        if let Some(l) = self.max_live_ops {
            if l > parent.max_live_ops {
                return Err(wider("max_live_ops", l, parent.max_live_ops));
            }
            env.max_live_ops = l;
        }
        if let Some(c) = self.max_children {
            if c > parent.max_children {
                return Err(wider("max_children", c, parent.max_children));
            }
            env.max_children = c;
        }
        if let Some(a) = &self.approval {
            env.approval = add_rules(&parent.approval, a);
        }
        if let Some(images) = &self.images {
            if let Some(wide) = parent
                .images
                .as_ref()
                .and_then(|allowed| images.iter().find(|i| !allowed.contains(i)))
            {
                let allowed = parent.images.clone().unwrap_or_default().join(", ");
                return Err(wider("images", wide, format!("[{allowed}]")));
            }
            env.images = Some(images.clone());
        }
        if let Some(d) = self.disk_bytes {
            if let Some(max) = parent.disk_bytes.filter(|max| d > *max) {
                return Err(wider("disk_bytes", d, max));
            }
            env.disk_bytes = Some(d);
        }
        env.runtime = narrow_runtime(self.runtime, parent.runtime)?;
        check_runtime_network(&env)?;
        Ok(env)
    }
}

/// The runtime asked for (`None`: the parent's), never weaker than the
/// parent's: `runsc` may follow `runc`, not the other way round.
fn narrow_runtime(asked: Option<Runtime>, parent: Runtime) -> Result<Runtime, EnvelopeError> {
    match asked {
        None => Ok(parent),
        Some(Runtime::Runc) if parent == Runtime::Runsc => Err(wider("runtime", "runc", "runsc")),
        Some(rt) => Ok(rt),
    }
}

/// A `runsc` envelope has network `none`: gVisor's network stack cannot
/// start on the hosts opkernel supports, and a network (or an allow list)
/// asked for must not be dropped without a word.
fn check_runtime_network(env: &Envelope) -> Result<(), EnvelopeError> {
    if env.runtime == Runtime::Runsc && env.network != Network::none() {
        return Err(invalid(format!(
            "envelope runtime runsc runs with network \"none\" (gVisor's network stack \
             cannot start on this host); the network would be {}: ask for network \"none\"",
            env.network
        )));
    }
    Ok(())
}

/// Checks an envelope's image names: at most 64, each `[a-z0-9_.-]{1,64}`
/// (whether the operator lists them is the API's to check).
fn validate_images(images: &[String]) -> Result<(), EnvelopeError> {
    if images.len() > MAX_IMAGES {
        return Err(invalid(format!(
            "envelope images holds at most {MAX_IMAGES} names"
        )));
    }
    for name in images {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
            });
        if !ok {
            return Err(invalid(format!(
                "envelope images: {:?} is not an image name ([a-z0-9_.-]{{1,64}})",
                name.chars().take(80).collect::<String>()
            )));
        }
    }
    Ok(())
}

impl Envelope {
    /// Whether the envelope lets children use the image called `name`.
    pub fn allows_image(&self, name: &str) -> bool {
        self.images
            .as_ref()
            .is_none_or(|list| list.iter().any(|i| i == name))
    }
}

/// The parent's approval rules plus the request's: patterns are added
/// (never removed), `all` can only be switched on, and timeout settings
/// (which never approve anything) may be set.
fn add_rules(parent: &ApprovalRules, asked: &ApprovalRules) -> ApprovalRules {
    let mut rules = parent.clone();
    for p in &asked.patterns {
        if !rules.patterns.contains(p) {
            rules.patterns.push(p.clone());
        }
    }
    rules.all |= asked.all;
    if asked.timeout_sec.is_some() {
        rules.timeout_sec = asked.timeout_sec;
    }
    if asked.on_timeout.is_some() {
        rules.on_timeout = asked.on_timeout;
    }
    rules
}
