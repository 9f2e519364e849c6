//! A cluster node's loop (SPEC §20): the lease renewed every TTL/5 on the
//! database's clock (a lapsed lease or a changed epoch: no claim until the
//! node has joined again with a new epoch); the sweep of lapsed nodes
//! (theirs ops settled, their runs' waiters woken); and the hand-off: the
//! ops placed on this node by another one get an observer here within a
//! second, and a kill taken by another node wakes the observer here; and
//! the late results (hand-off and kills are also hinted by the node that
//! took them, and acted on at once): a node back from the dead watches the ops it lost for
//! a real `.code`, recorded as `tool.late_result` (the op stays `lost`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::sync::Stop;
use crate::event_kind::ToolLateResult;
use crate::runtime::kernel::Kernel;
use crate::store::hints::HintKind;
use crate::store::{Op, StoreError};

/// How often the hand-off looks for this node's ops without an observer.
const HAND_OFF_EVERY: Duration = Duration::from_secs(1);

/// Lets this node's lease lapse at once (a start refused after the join:
/// no tree is placed here meanwhile; a later start joins afresh).
pub async fn lapse(k: &Kernel) {
    if let Some(node) = &k.node {
        let (name, epoch) = (&node.config.name, node.epoch());
        let _ = k.store.renew_lease(name, epoch, -1, (0, 0)).await;
    }
}

/// Refuses the start of a node whose webhook settings differ from those
/// of the cluster's live nodes (SPEC §24: the outbox is the cluster's, so
/// every node writes and posts it alike). The secret is compared by a
/// digest, never stored.
pub async fn agree_settings(k: &Kernel) -> anyhow::Result<()> {
    use sha2::Digest;
    let Some(node) = &k.node else {
        return Ok(());
    };
    // digests only: the URL may carry credentials
    let digest = |text: &str| hex::encode(sha2::Sha256::digest(text.as_bytes()))[..16].to_owned();
    let value = match &k.config.webhook {
        Some(hook) => format!(
            "url sha256 {}, secret sha256 {}",
            digest(&hook.url),
            digest(&hook.secret)
        ),
        None => "none".to_owned(),
    };
    let name = "OPKERNEL_WEBHOOK_URL/OPKERNEL_WEBHOOK_SECRET";
    let agreed = k
        .store
        .agree_shared_setting(&node.config.name, name, &value)
        .await?;
    if let Err(why) = agreed {
        // joined already: its lease is let lapse at once, so no tree is
        // placed here meanwhile (a later start with the right settings
        // joins afresh, active)
        let (name, epoch) = (&node.config.name, node.epoch());
        let _ = k.store.renew_lease(name, epoch, -1, (0, 0)).await;
        anyhow::bail!("invalid setting: {why}");
    }
    Ok(())
}

/// Joins the cluster (a new epoch): at start, before recovery (then
/// `keep_lease` keeps it), and again whenever the lease lapsed. The ops
/// this node lost while it was away (declared dead) have their processes
/// stopped before it starts anything again (`stop_lost`).
pub async fn join(k: &Arc<Kernel>) -> Result<(), StoreError> {
    let Some(node) = &k.node else {
        return Ok(());
    };
    let c = &node.config;
    let asked = Instant::now();
    node.broken();
    let epoch = k
        .store
        .join_node(&c.name, &c.advertise_url, c.ttl_ms())
        .await?;
    let lost = lost_here(k).await?;
    if !lost.is_empty() {
        // set before the epoch: no start slips in before the stop
        node.begin_stopping();
        tokio::spawn(stop_lost(k.clone(), lost));
    }
    node.set_epoch(epoch);
    node.renewed(asked);
    node.joined();
    tracing::info!(node = %c.name, epoch, url = %c.advertise_url, "joined the cluster");
    Ok(())
}

/// The ops this node lost (settled `lost` by a sweep of it) whose command
/// may still run here: no `.code` yet, and a `.pid`, or a request the
/// launcher claimed (its `.pid` is waited for by [`stop_lost`]). A request
/// still waiting in the inbox is taken back first: it never runs.
async fn lost_here(k: &Kernel) -> Result<Vec<(Op, Option<sandbox::PidRecord>)>, StoreError> {
    let Some(node) = &k.node else {
        return Ok(Vec::new());
    };
    let since = crate::store::now_ms() - look_back_ms(k);
    let mut running = Vec::new();
    let lost = k.store.lost_with_node_on_lease(&node.config.name, since);
    for op in lost.await? {
        let dir = k.backend.ops_dir(&op.scratch_key);
        if dir.read_code(&op.id).is_ok() || op.container_id.is_none() {
            continue;
        }
        match dir.read_pid(&op.id) {
            Ok(rec) => running.push((op, Some(rec))),
            Err(_) => {
                if let Ok(sandbox::Handback::Claimed) = dir.withdraw(&op.id) {
                    running.push((op, None));
                }
            }
        }
    }
    Ok(running)
}

/// Stops every process of the lost ops (SPEC §24), as a kill does
/// ([`crate::runtime::stop::stop_processes`]); then lets the node start
/// commands again (the last stopper under way does). Their real ends are
/// recorded by the late-result watch, `stopped_on_rejoin`.
async fn stop_lost(k: Arc<Kernel>, lost: Vec<(Op, Option<sandbox::PidRecord>)>) {
    let Some(node) = &k.node else {
        return;
    };
    // the gate is lowered whatever happens to this task (a panic too)
    struct Lower<'a>(&'a crate::runtime::kernel::node::NodeState);
    impl Drop for Lower<'_> {
        fn drop(&mut self) {
            self.0.end_stopping();
        }
    }
    let _lower = Lower(node);
    // noted before the signal: the late result may be recorded meanwhile
    for (op, _) in &lost {
        node.note_stopped(&op.id);
    }
    crate::runtime::stop::stop_processes(&k, lost).await;
}

/// Keeps the lease from the join on, apart from everything else (a task
/// of its own on a connection of its own: neither recovery nor load delays
/// a renewal): renewed every TTL/5, joined again with a new epoch when it
/// lapsed. Returns once `stop` is pulled (after the kernel's stop), or at
/// once for a single kernel.
pub async fn keep_lease(k: Arc<Kernel>, mut stop: Stop) {
    let Some(node) = &k.node else {
        return;
    };
    while stop.nap(node.config.renew_every()).await {
        if let Err(e) = renew(&k).await {
            tracing::warn!(%e, "cluster: lease not renewed this round");
        }
    }
}

/// Renews the lease; rejoins with a new epoch when it lapsed.
async fn renew(k: &Arc<Kernel>) -> Result<(), StoreError> {
    let Some(node) = &k.node else {
        return Ok(());
    };
    let c = &node.config;
    let counts = (
        k.registered_containers().len() as i64,
        k.pool.counts().0 as i64,
    );
    let asked = Instant::now();
    let renewal = match node.epoch() {
        0 => Ok(false),
        epoch => {
            k.store
                .renew_lease(&c.name, epoch, c.ttl_ms(), counts)
                .await
        }
    };
    if renewal.inspect_err(|_| node.broken())? {
        node.renewed(asked);
        return Ok(());
    }
    // fenced: no claim matches epoch 0 until the join below lands
    node.set_epoch(0);
    tracing::warn!(node = %c.name, "cluster: this node's lease lapsed or its epoch changed; it claims nothing until it has joined again");
    join(k).await
}

/// The node's loop (in the housekeeping set): the sweep of lapsed nodes,
/// the hand-off and the late results; returns at once for a single kernel.
pub async fn run(k: Arc<Kernel>, mut stop: Stop) {
    let Some(node) = &k.node else {
        return;
    };
    let every = node.config.renew_every();
    let look_every = HAND_OFF_EVERY.min(every);
    let (mut swept, mut looked) = (Instant::now(), Instant::now());
    let mut poked = HashSet::new();
    let mut late = LateWatch::default();
    let mut late_loaded = None;
    loop {
        let hinted = tokio::select! {
            hinted = k.store.hints().wait(look_every.saturating_sub(looked.elapsed())) => hinted,
            () = stop.stopped() => return,
        };
        take_hints(&k, hinted);
        if looked.elapsed() < look_every {
            continue;
        }
        if swept.elapsed() >= every {
            swept = Instant::now();
            if let Err(e) = sweep(&k).await {
                tracing::warn!(%e, "cluster: sweep not done this round");
            }
        }
        if let Err(e) = hand_off(&k, &mut poked).await {
            tracing::warn!(%e, "cluster: hand-off not done this round");
        }
        // after each join (a new epoch), the ops lost meanwhile are loaded
        let joins = node.joins();
        if late_loaded != Some(joins) && late.load(&k).await.is_ok() {
            late_loaded = Some(joins);
        }
        late.look(&k).await;
        // from the round's end: a slow round (a slow store) is followed by
        // a whole nap, not by the next round at once
        looked = Instant::now();
    }
}

/// Sweeps the lapsed nodes: only a node that held its own lease a whole
/// TTL since its last join, and the time another needs to reconnect,
/// judges the others.
async fn sweep(k: &Kernel) -> Result<(), StoreError> {
    let Some(node) = k.node.as_ref().filter(|n| n.may_sweep()) else {
        return Ok(());
    };
    let judge = crate::store::Judge {
        node: node.config.name.clone(),
        epoch: node.epoch(),
        held_ms: node.config.judge_hold().as_millis() as i64,
    };
    for swept in k.store.sweep_nodes(judge).await? {
        tracing::warn!(node = %swept.name, ops = swept.settled.len(), "cluster: a node's lease lapsed: declared dead, its ops settled");
        for (_, run) in &swept.settled {
            k.bump_run(run);
        }
    }
    Ok(())
}

/// How far back a node looks for the ops it lost (a day: no op outlives
/// its timeout that long).
const LATE_SINCE_MS: i64 = 86_400_000;

/// How far back a node looks for the ops it lost: a day, or longer when
/// a background op may run longer than that (its ceiling, and a margin).
fn look_back_ms(k: &Kernel) -> i64 {
    let longest = (k.config.ops.bg_max_sec.saturating_add(3600)).saturating_mul(1000);
    LATE_SINCE_MS.max(i64::try_from(longest).unwrap_or(i64::MAX / 2))
}

/// The ops this node lost while it was away, watched for their real end
/// until it comes or can no longer come (past the op's timeout).
#[derive(Default)]
struct LateWatch {
    /// Op id → the op, and when its `.code` can no longer appear (unix ms).
    ops: HashMap<String, (Op, i64)>,
}

impl LateWatch {
    /// Loads the ops this node lost (at start, and after a rejoin). A
    /// command run as root can forge its own `.code`: no late result is
    /// believed from one.
    async fn load(&mut self, k: &Kernel) -> Result<(), StoreError> {
        let Some(node) = &k.node else {
            return Ok(());
        };
        if k.config.profile.runs_as_root() {
            return Ok(());
        }
        let since = crate::store::now_ms() - look_back_ms(k);
        for op in k.store.lost_with_node(&node.config.name, since).await? {
            let began = op
                .started_at
                .or(op.exec_claimed_at)
                .unwrap_or(op.created_at);
            let slack = (k.config.ops.kill_grace * 3).as_millis() as i64 + 60_000;
            let until = began + op.timeout_sec as i64 * 1000 + slack;
            self.ops.insert(op.id.clone(), (op, until));
        }
        Ok(())
    }

    /// Looks for each watched op's `.code` (a small local read); a real
    /// one is recorded once as `tool.late_result`.
    async fn look(&mut self, k: &Kernel) {
        let Some(node) = &k.node else {
            return;
        };
        let now = crate::store::now_ms();
        let mut done = Vec::new();
        for (id, (op, until)) in &self.ops {
            let found = k.backend.ops_dir(&op.scratch_key).read_code_written(id);
            let Ok((sandbox::OpResult::Exited(rec), written)) = found else {
                if now > *until {
                    done.push(id.clone());
                }
                continue;
            };
            let late = ToolLateResult {
                exit_code: rec.code,
                ended_at: written.unwrap_or(now),
                node: node.config.name.clone(),
                stopped_on_rejoin: node.stopped(id),
            };
            match k.store.record_late_result(id, late).await {
                Ok(_) => {
                    tracing::info!(op = %id, code = rec.code, "cluster: a lost op's real end found: tool.late_result");
                    k.bump_run(&op.run_id);
                    done.push(id.clone());
                }
                Err(e) => {
                    tracing::warn!(op = %id, %e, "cluster: late result not recorded; tried again")
                }
            }
        }
        for id in done {
            node.forget_stopped(&id);
            self.ops.remove(&id);
        }
    }
}

/// What other nodes hinted at once (SPEC §20): an observer for an op
/// placed here (it re-reads the row: one not placed here, or fenced, is
/// left alone), a wake-up for a kill taken elsewhere.
fn take_hints(k: &Arc<Kernel>, hinted: Vec<(HintKind, String)>) {
    for (kind, id) in hinted {
        match kind {
            HintKind::Start => crate::runtime::control::take_placed(k, &id),
            HintKind::Kill if k.observes(&id) => k.poke_kill(&id),
            // no observer: an op settled `lost` whose command may run here
            HintKind::Kill => {
                let k = k.clone();
                tokio::spawn(async move {
                    if let Ok(Some(op)) = k.store.get_op(&id).await {
                        crate::runtime::stop::stop_settled(&k, &op);
                    }
                });
            }
        }
    }
}

/// Observers for this node's ops placed by other nodes, and wake-ups for
/// the kills other nodes took.
async fn hand_off(k: &Arc<Kernel>, poked: &mut HashSet<String>) -> Result<(), StoreError> {
    // a single kernel's ops left unplaced (SPEC §24): taken over where
    // their files are, or anywhere when nothing of their run ever ran
    if let Err(e) = crate::runtime::observer::take_over_unplaced(k).await {
        tracing::warn!(%e, "cluster: unplaced ops not looked at this round");
    }
    // a fenced node starts no observer for an unclaimed op
    if k.may_start() {
        for (id, _) in k.store.observed_op_ids().await? {
            crate::runtime::control::take_placed(k, &id);
        }
    }
    // stops asked for this node's lost ops (their hint may have been lost)
    let since = crate::store::now_ms() - look_back_ms(k);
    let asked: HashSet<String> = match k.store.lost_stops_asked(since).await {
        Ok(ops) => ops
            .into_iter()
            .filter_map(|op| {
                let key = format!("lost:{}", op.id);
                // kept once a stop began; else looked at again next round
                // (its .pid may not be written yet)
                let begun = poked.contains(&key) || crate::runtime::stop::stop_settled(k, &op);
                begun.then_some(key)
            })
            .collect(),
        Err(e) => {
            tracing::warn!(%e, "cluster: stops asked for lost ops not read this round");
            poked
                .iter()
                .filter(|p| p.starts_with("lost:"))
                .cloned()
                .collect()
        }
    };
    let killing = k.store.node_kill_requests().await?;
    poked.retain(|id| asked.contains(id) || killing.contains(id));
    poked.extend(asked);
    for id in killing {
        if poked.insert(id.clone()) {
            k.poke_kill(&id);
        }
    }
    Ok(())
}
