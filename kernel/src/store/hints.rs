//! Hand-off hints between cluster nodes (SPEC §20): a node whose
//! transaction admits or approves an op placed on another node, or takes a
//! kill for one (a cancel's included), notifies the channel
//! `opkernel_nodes` with `"<node> start|kill <op id>"` in that transaction
//! (delivered at its commit); the addressed node's loop looks at that op at once instead of
//! at its next poll. A hint only: the poll (every second) finds every op a
//! lost hint would have named, and a hint names nothing the op's row does
//! not say again (the addressed node re-reads the row before it acts).

use std::sync::Mutex;
use std::time::Duration;

use super::db::{Dialect, Tx};
use super::{Store, StoreResult};
use crate::vals;

/// The channel of the hints.
pub const CHANNEL: &str = "opkernel_nodes";

/// Most hints held between two looks (more are dropped: the poll finds
/// their ops).
#[cfg(feature = "postgres")]
const MAX_HELD: usize = 10_000;

/// What a hint asks of the addressed node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintKind {
    /// An op was placed on it: observe it (which claims and starts it).
    Start,
    /// A kill was taken for one of its ops: wake that op's observer.
    Kill,
}

impl HintKind {
    fn as_str(self) -> &'static str {
        match self {
            HintKind::Start => "start",
            HintKind::Kill => "kill",
        }
    }
}

/// The hints heard for this kernel's node, until its loop takes them.
#[derive(Default)]
pub struct Hints {
    /// The node they are for (the store's, fixed at its open); `None`: a
    /// single kernel, which hears none.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    node: Option<String>,
    held: Mutex<Vec<(HintKind, String)>>,
    wake: tokio::sync::Notify,
}

impl Hints {
    /// The hints of `node` (`None`: a single kernel's, always empty).
    pub(super) fn new(node: Option<String>) -> Hints {
        Hints {
            node,
            ..Hints::default()
        }
    }

    /// A notification's payload: kept when it is addressed to this node;
    /// `""` (the listener reconnected: something may have been missed)
    /// only wakes the loop (its next full look, within a second, finds
    /// what was missed).
    #[cfg(feature = "postgres")]
    pub(super) fn heard(&self, payload: &str) {
        let Some(me) = &self.node else {
            return;
        };
        if !payload.is_empty() {
            let mut words = payload.splitn(3, ' ');
            let (node, kind, op) = (words.next(), words.next(), words.next());
            let kind = match kind {
                Some("start") => HintKind::Start,
                Some("kill") => HintKind::Kill,
                _ => return,
            };
            let (Some(node), Some(op)) = (node, op) else {
                return;
            };
            if node != me {
                return;
            }
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if held.len() < MAX_HELD {
                held.push((kind, op.to_owned()));
            }
        }
        self.wake.notify_one();
    }

    /// Waits up to `d` for a hint; then takes every hint held.
    pub async fn wait(&self, d: Duration) -> Vec<(HintKind, String)> {
        let _ = tokio::time::timeout(d, self.wake.notified()).await;
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Store {
    /// The hints heard for this node.
    pub fn hints(&self) -> &Hints {
        &self.hints
    }
}

/// In a node's transaction: tells `node` about `op` when it is another
/// node than this one (a `NOTIFY`, delivered once the transaction commits,
/// never if it rolls back).
pub(super) fn notify_in(
    tx: &mut dyn Tx,
    node: Option<&str>,
    kind: HintKind,
    op: &str,
) -> StoreResult<()> {
    let (Some(me), Some(node)) = (tx.node(), node) else {
        return Ok(());
    };
    if me == node || tx.dialect() != Dialect::Postgres {
        return Ok(());
    }
    let payload = format!("{node} {} {op}", kind.as_str());
    // pg_notify returns void: selected through a subquery
    tx.query(
        &format!("SELECT 1 AS sent FROM (SELECT pg_notify('{CHANNEL}', ?1)) AS n"),
        vals![payload],
    )?;
    Ok(())
}

impl super::Store {
    /// Tells `node` about `op` outside any other change (a kill asked for
    /// an op already settled, whose processes only its node can stop).
    pub async fn hint(&self, node: &str, kind: HintKind, op: &str) -> StoreResult<()> {
        let (node, op) = (node.to_owned(), op.to_owned());
        self.write(move |tx| notify_in(tx, Some(&node), kind, &op))
            .await
    }
}

impl super::Store {
    /// Records that a stop was asked for a `lost` op whose command may
    /// still run (its node polls for these, so a lost hint only delays
    /// the stop): false when it is not lost, or was asked already.
    pub async fn request_lost_stop(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            let n = tx.execute(
                "UPDATE ops SET kill_requested_at = ?2 WHERE id = ?1 AND status = 'lost' \
                 AND kill_requested_at IS NULL",
                crate::vals![&id, super::now_ms()],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// This node's `lost` ops whose stop was asked since `since_ms`: what
    /// its loop stops (once each) when a hint did not arrive.
    pub async fn lost_stops_asked(&self, since_ms: i64) -> StoreResult<Vec<super::Op>> {
        let Some(node) = self.node().map(str::to_owned) else {
            return Ok(Vec::new());
        };
        self.read(move |tx| {
            let sql = format!(
                "SELECT {} FROM ops WHERE node = ?1 AND status = 'lost' \
                 AND kill_requested_at IS NOT NULL AND kill_requested_at >= ?2",
                super::ops::COLUMNS
            );
            super::ops::ops_of(tx, &sql, crate::vals![node, since_ms])
        })
        .await
    }
}
