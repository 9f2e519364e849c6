//! The warm pool's bindings (SPEC §22): which run adopted which pool
//! container. Written once per run, in one transaction; the row is the
//! authority on whose the container is (the binding file on the host
//! mirrors it and is re-written from it at recovery).

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
                "INSERT INTO container_bindings (run_id, container_id, scratch_key, bound_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                vals![b.run_id.clone(), b.container_id, b.scratch_key, now_ms()],
            )?;
            if wrote == 1 {
                return Ok(Bound::Bound);
            }
            let row = tx.query_opt(
                "SELECT run_id, container_id, scratch_key FROM container_bindings WHERE run_id = ?1",
                vals![b.run_id],
            )?;
            Ok(Bound::Taken(row.map(|r| binding_of(&r)).transpose()?))
        })
        .await
    }

    /// Every binding (loaded at start: the kernel keeps them in memory).
    pub async fn bindings(&self) -> StoreResult<Vec<Binding>> {
        self.read(|tx| {
            tx.query(
                "SELECT run_id, container_id, scratch_key FROM container_bindings ORDER BY run_id",
                vals![],
            )?
            .iter()
            .map(binding_of)
            .collect()
        })
        .await
    }

    /// The binding of one run, if it adopted a pool container.
    pub async fn binding_of_run(&self, run_id: &str) -> StoreResult<Option<Binding>> {
        self.binding_where("run_id", run_id).await
    }

    /// The binding that names a container, if any.
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
            let sql = format!(
                "SELECT run_id, container_id, scratch_key FROM container_bindings WHERE {column} = ?1"
            );
            tx.query_opt(&sql, vals![value])?
                .map(|r| binding_of(&r))
                .transpose()
        })
        .await
    }

    /// Forgets a run's binding once its container and scratch dir are
    /// gone (nothing of the run is left to confirm).
    pub async fn unbind(&self, run_id: &str) -> StoreResult<bool> {
        let run_id = run_id.to_owned();
        self.write(move |tx| {
            let n = tx.execute(
                "DELETE FROM container_bindings WHERE run_id = ?1",
                vals![run_id],
            )?;
            Ok(n > 0)
        })
        .await
    }
}

fn binding_of(r: &super::db::Row) -> StoreResult<Binding> {
    Ok(Binding {
        run_id: r.get("run_id")?,
        container_id: r.get("container_id")?,
        scratch_key: r.get("scratch_key")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(run: &str, container: &str) -> Binding {
        Binding {
            run_id: run.into(),
            container_id: container.into(),
            scratch_key: format!("pool-{container}"),
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
}
