//! The warm pool's bindings (SPEC §22): which run adopted which pool
//! container. Written once per run, in one transaction; the row is the
//! authority on whose the container is (the binding file on the host
//! mirrors it and is re-written from it at recovery). A binding names the
//! node whose engine and disk hold its container (SPEC §24): a node reads,
//! takes over and forgets only its own.

use super::{now_ms, Store, StoreResult};
use crate::vals;

/// A run bound to the pool container it adopted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The run.
    pub run_id: String,
    /// Docker's id of the container it adopted.
    pub container_id: String,
    /// The container's own scratch key (`pool-<hex>`).
    pub scratch_key: String,
    /// The cluster node whose engine holds the container (`None`: a
    /// single kernel's).
    pub node: Option<String>,
}

/// What a bind came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// The run is now bound to that container.
    Bound,
    /// Nothing written: the run is already bound (to this binding's
    /// container), or the container already serves another run (`None`).
    Taken(Option<Binding>),
}

impl Store {
    /// Binds `run_id` to a pool container, once: a run already bound, or a
    /// container already serving a run, writes nothing and says so.
    pub async fn bind_container(&self, b: Binding) -> StoreResult<Bound> {
        self.write(move |tx| {
            let wrote = tx.execute(
                "INSERT INTO container_bindings (run_id, container_id, scratch_key, bound_at, node) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                vals![&b.run_id, &b.container_id, &b.scratch_key, now_ms(), &b.node],
            )?;
            if wrote == 1 {
                return Ok(Bound::Bound);
            }
            let row = tx.query_opt(
                &format!("SELECT {COLUMNS} FROM container_bindings WHERE run_id = ?1"),
                vals![&b.run_id],
            )?;
            Ok(Bound::Taken(row.map(|r| binding_of(&r)).transpose()?))
        })
        .await
    }

    /// This node's bindings (loaded at start: the kernel keeps them in
    /// memory), and on a cluster node also the node-less ones a single
    /// kernel left (taken over with [`Store::take_over_binding`] only where
    /// their files are); never another node's.
    pub async fn bindings(&self) -> StoreResult<Vec<Binding>> {
        let node = self.node().map(str::to_owned);
        self.read(move |tx| {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM container_bindings \
                     WHERE node IS NOT DISTINCT FROM CAST(?1 AS TEXT) OR node IS NULL ORDER BY run_id"
                ),
                vals![node],
            )?
            .iter()
            .map(binding_of)
            .collect()
        })
        .await
    }

    /// A cluster node takes over a node-less binding (a single kernel's,
    /// whose files it found on its own disk): false when it is no longer
    /// node-less (another node took it first).
    pub async fn take_over_binding(&self, run_id: &str) -> StoreResult<bool> {
        let (Some(node), run_id) = (self.node().map(str::to_owned), run_id.to_owned()) else {
            return Ok(false);
        };
        self.write(move |tx| {
            let n = tx.execute(
                "UPDATE container_bindings SET node = ?2 WHERE run_id = ?1 AND node IS NULL",
                vals![&run_id, &node],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// The binding of one run, if it adopted a pool container.
    pub async fn binding_of_run(&self, run_id: &str) -> StoreResult<Option<Binding>> {
        self.binding_where("run_id", run_id).await
    }

    /// The binding that names a container of this node's, if any.
    pub async fn binding_of_container(&self, container_id: &str) -> StoreResult<Option<Binding>> {
        self.binding_where("container_id", container_id).await
    }

    /// The binding whose `column` (a unique one) is `value`.
    async fn binding_where(
        &self,
        column: &'static str,
        value: &str,
    ) -> StoreResult<Option<Binding>> {
        let value = value.to_owned();
        self.read(move |tx| {
            let sql = format!("SELECT {COLUMNS} FROM container_bindings WHERE {column} = ?1");
            tx.query_opt(&sql, vals![value])?
                .map(|r| binding_of(&r))
                .transpose()
        })
        .await
    }

    /// Forgets a run's binding of this node once its container and
    /// scratch dir are gone (nothing of the run is left to confirm);
    /// another node's binding is never touched.
    pub async fn unbind(&self, run_id: &str) -> StoreResult<bool> {
        let (run_id, node) = (run_id.to_owned(), self.node().map(str::to_owned));
        self.write(move |tx| {
            let n = tx.execute(
                "DELETE FROM container_bindings WHERE run_id = ?1 \
                 AND node IS NOT DISTINCT FROM CAST(?2 AS TEXT)",
                vals![&run_id, &node],
            )?;
            Ok(n > 0)
        })
        .await
    }
}

/// The columns a [`Binding`] is read from.
const COLUMNS: &str = "run_id, container_id, scratch_key, node";

fn binding_of(r: &super::db::Row) -> StoreResult<Binding> {
    Ok(Binding {
        run_id: r.get("run_id")?,
        container_id: r.get("container_id")?,
        scratch_key: r.get("scratch_key")?,
        node: r.get("node")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(run: &str, container: &str) -> Binding {
        on(run, container, None)
    }

    fn on(run: &str, container: &str, node: Option<&str>) -> Binding {
        Binding {
            run_id: run.into(),
            container_id: container.into(),
            scratch_key: format!("pool-{container}"),
            node: node.map(str::to_owned),
        }
    }

    #[tokio::test]
    async fn a_run_binds_once_and_a_container_serves_one_run() {
        let store = crate::store::test_store().await;
        {
            assert_eq!(
                store.bind_container(b("r1", "c1")).await.unwrap(),
                Bound::Bound
            );
            assert_eq!(
                store.bind_container(b("r1", "c2")).await.unwrap(),
                Bound::Taken(Some(b("r1", "c1")))
            );
            assert_eq!(
                store.bind_container(b("r2", "c1")).await.unwrap(),
                Bound::Taken(None)
            );
            assert_eq!(
                store.binding_of_run("r1").await.unwrap(),
                Some(b("r1", "c1"))
            );
            assert_eq!(store.binding_of_run("r2").await.unwrap(), None);
            assert_eq!(
                store.binding_of_container("c1").await.unwrap(),
                Some(b("r1", "c1"))
            );
            assert_eq!(store.binding_of_container("c2").await.unwrap(), None);
            assert_eq!(store.bindings().await.unwrap(), vec![b("r1", "c1")]);
            assert!(store.unbind("r1").await.unwrap());
            assert!(!store.unbind("r1").await.unwrap());
            assert!(store.bindings().await.unwrap().is_empty());
        }
    }

    /// SPEC §24: a binding names its node; a node lists, takes over and
    /// forgets only its own (before, a rolling restart of n1 deleted n2's
    /// rows: `bindings` listed every node's and `unbind` deleted any).
    #[tokio::test]
    async fn a_node_sees_and_forgets_only_its_own_bindings() {
        let (n1, n2) = crate::store::test_store_pair().await;
        let n1 = n1
            .with_options(crate::store::StoreOptions {
                node: Some("n1".into()),
                ..Default::default()
            })
            .await;
        let n2 = n2
            .with_options(crate::store::StoreOptions {
                node: Some("n2".into()),
                ..Default::default()
            })
            .await;
        assert_eq!(
            n1.bind_container(on("r1", "c1", Some("n1"))).await.unwrap(),
            Bound::Bound
        );
        assert_eq!(
            n2.bind_container(on("r2", "c2", Some("n2"))).await.unwrap(),
            Bound::Bound
        );
        assert_eq!(
            n1.bindings().await.unwrap(),
            vec![on("r1", "c1", Some("n1"))]
        );
        assert_eq!(
            n2.bindings().await.unwrap(),
            vec![on("r2", "c2", Some("n2"))]
        );
        // n1 never forgets n2's binding, whatever it finds on its own disk
        assert!(!n1.unbind("r2").await.unwrap());
        assert_eq!(
            n2.binding_of_run("r2").await.unwrap().map(|b| b.node),
            Some(Some("n2".into()))
        );
        // a single kernel's binding is listed to every node, and taken
        // over once, by the node that holds its files
        n1.bind_container(on("r3", "c3", None)).await.unwrap();
        assert!(n2
            .bindings()
            .await
            .unwrap()
            .iter()
            .any(|b| b.run_id == "r3"));
        assert!(n2.take_over_binding("r3").await.unwrap());
        assert!(!n1.take_over_binding("r3").await.unwrap());
        assert!(!n1
            .bindings()
            .await
            .unwrap()
            .iter()
            .any(|b| b.run_id == "r3"));
        assert!(n2.unbind("r2").await.unwrap());
        assert!(n2.unbind("r3").await.unwrap());
        assert_eq!(n1.bindings().await.unwrap().len(), 1);
    }
}
