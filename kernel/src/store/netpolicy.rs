//! A live run's network allow list changed (SPEC §27): narrowed by the run
//! itself (and so for its descendants), or set by the operator, who may
//! widen it. Only an allow list changes: `none` and an open network are
//! the run's for its life (its container's network and environment are
//! made for them).

use super::db::Tx;
use super::runs::get_run;
use super::{Store, StoreResult};
use crate::egress::{AllowList, AllowSpec, Network};
use crate::event_kind::{EventKind, NetPolicy};
use crate::vals;

/// The outcome of a change of a run's allow list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetChanged {
    /// Recorded: the run's list now, and the descendants whose lists were
    /// narrowed with it.
    Changed {
        /// The run's entries now.
        allow: Vec<String>,
        /// Descendants whose lists lost entries.
        narrowed: Vec<String>,
    },
    /// No such run.
    NoRun,
    /// The run's network is not an allow list (it is this).
    NotAllowList(String),
    /// An entry outside the bound: a run token's own list, the operator's
    /// the parent's (the entry and the bound, in words).
    Wider(String),
}

/// Writes `network` into the run's envelope.
fn set_network(tx: &mut dyn Tx, run: &str, network: Network) -> StoreResult<()> {
    let Some(record) = get_run(tx, run)? else {
        return Ok(());
    };
    let Some(mut envelope) = record.envelope else {
        return Ok(());
    };
    envelope.network = network;
    let text = serde_json::to_string(&envelope)
        .map_err(|e| super::StoreError::Corrupt(format!("envelope of {run}: {e}")))?;
    tx.execute(
        "UPDATE runs SET envelope = ?2 WHERE run_id = ?1",
        vals![run, text],
    )?;
    Ok(())
}

fn policy_event(allow: Vec<String>, by: &str, from_run: &str) -> EventKind {
    EventKind::NetPolicy(NetPolicy {
        allow,
        by: by.to_owned(),
        from_run: from_run.to_owned(),
    })
}

/// The bound a new list of `record`'s run must stay within: its own list
/// for a run token; its parent's list for the operator (a top-level run,
/// or one under an open network, has none). `Err` names the bound.
fn bound_of(
    tx: &mut dyn Tx,
    record: &super::runs::RunRecord,
    own: &AllowList,
    may_widen: bool,
) -> StoreResult<Option<(AllowList, String)>> {
    if !may_widen {
        return Ok(Some((own.clone(), "the run's allow list".to_owned())));
    }
    let Some(parent) = record.parent_run_id.as_deref() else {
        return Ok(None);
    };
    let list = get_run(tx, parent)?
        .and_then(|p| p.envelope)
        .and_then(|e| e.network.allow_list());
    Ok(list.map(|l| (l, format!("the allow list of its parent {parent}"))))
}

/// Each descendant's list cut to what `asked` allows (an entry wider than
/// the new list is narrowed to it, never dropped when part of it stays),
/// each change with its event; the descendants changed.
fn cut_descendants(
    tx: &mut dyn Tx,
    run: &str,
    asked: &AllowList,
    by: &str,
) -> StoreResult<Vec<String>> {
    let sql = "SELECT run_id FROM run_ancestry WHERE ancestor_id = ?1 AND distance > 0 \
               ORDER BY distance, run_id";
    let descendants: Vec<String> = tx
        .query(sql, vals![run])?
        .iter()
        .map(|r| r.get("run_id"))
        .collect::<StoreResult<_>>()?;
    let mut narrowed = Vec::new();
    for d in descendants {
        let Some(theirs) = get_run(tx, &d)?
            .and_then(|r| r.envelope)
            .and_then(|e| e.network.allow_list())
        else {
            continue;
        };
        if asked.wider_entry(&theirs).is_none() {
            continue;
        }
        let kept = theirs.intersect(asked).to_strings();
        let spec = AllowSpec {
            allow: kept.clone(),
        };
        set_network(tx, &d, Network::Allow(spec))?;
        super::journal::append_event(tx, &d, None, policy_event(kept, by, run))?;
        narrowed.push(d);
    }
    Ok(narrowed)
}

/// The change script: the tree's lock, the run's list, the check (a run
/// only narrows its own; the operator stays within the parent's), the
/// run's new list, then each descendant's list cut to it.
fn change_in(
    tx: &mut dyn Tx,
    run: &str,
    asked: &AllowList,
    by: &str,
    may_widen: bool,
) -> StoreResult<NetChanged> {
    super::tree::lock_tree_of(tx, run)?;
    let Some(record) = get_run(tx, run)? else {
        return Ok(NetChanged::NoRun);
    };
    let current = record.envelope.as_ref().map(|e| e.network.clone());
    let Some(list) = current.as_ref().and_then(Network::allow_list) else {
        let shown = current.map_or("the kernel's default".to_owned(), |n| n.to_string());
        return Ok(NetChanged::NotAllowList(shown));
    };
    if let Some((bound, name)) = bound_of(tx, &record, &list, may_widen)? {
        if let Some(entry) = bound.wider_entry(asked) {
            return Ok(NetChanged::Wider(format!("{entry} is not within {name}")));
        }
    }
    let allow = asked.to_strings();
    let spec = AllowSpec {
        allow: allow.clone(),
    };
    set_network(tx, run, Network::Allow(spec))?;
    super::journal::append_event(tx, run, None, policy_event(allow.clone(), by, run))?;
    let narrowed = cut_descendants(tx, run, asked, by)?;
    Ok(NetChanged::Changed { allow, narrowed })
}

impl Store {
    /// Sets a live run's allow list to `asked` (see [`NetChanged`]):
    /// `may_widen` for the operator; a run token only narrows.
    pub async fn change_allow_list(
        &self,
        run: &str,
        asked: AllowList,
        by: &str,
        may_widen: bool,
    ) -> StoreResult<NetChanged> {
        let (run, by) = (run.to_owned(), by.to_owned());
        self.write(move |tx| change_in(tx, &run, &asked, &by, may_widen))
            .await
    }
}
