//! Settings every node of a cluster must share (SPEC §24): the webhook's
//! URL and a digest of its secret. The first node to start records them;
//! a node started with other values is refused while another live node
//! holds the recorded ones (with no other node live, the newcomer's values
//! replace them: the cluster was stopped to change them).

use super::lease::db_now;
use super::{now_ms, Store, StoreResult};
use crate::vals;

impl Store {
    /// Agrees `name = value` with the cluster as node `me`: `Ok(Ok(()))`
    /// when recorded (or already so); `Ok(Err(why))` when another live
    /// node started with a different value.
    pub async fn agree_shared_setting(
        &self,
        me: &str,
        name: &str,
        value: &str,
    ) -> StoreResult<Result<(), String>> {
        let (me, name, value) = (me.to_owned(), name.to_owned(), value.to_owned());
        self.write(move |tx| {
            // one agreement at a time (a row that does not exist yet cannot
            // be locked)
            tx.lock_tree("#shared-settings")?;
            let row = tx.query_opt(
                "SELECT value, node FROM cluster_settings WHERE name = ?1",
                vals![&name],
            )?;
            if let Some(row) = row {
                let (held, holder): (String, String) = (row.get("value")?, row.get("node")?);
                let now = db_now(tx);
                let sql = format!(
                    "SELECT name FROM nodes WHERE name <> ?1 AND state <> 'dead' \
                     AND lease_until > {now} ORDER BY name"
                );
                let live: Vec<String> = tx
                    .query(&sql, vals![&me])?
                    .iter()
                    .map(|r| r.get("name"))
                    .collect::<StoreResult<_>>()?;
                if held != value && !live.is_empty() {
                    return Ok(Err(format!(
                        "{name} differs from the cluster's (recorded by node {holder}; live nodes: {}): \
                         start every node with the same setting, or stop them all to change it",
                        live.join(", ")
                    )));
                }
            }
            tx.execute(
                "INSERT INTO cluster_settings (name, value, node, updated_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value, node = excluded.node, \
                 updated_at = excluded.updated_at",
                vals![&name, &value, &me, now_ms()],
            )?;
            Ok(Ok(()))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::store::test_store_pair;

    /// SPEC §24: nodes configured with different webhook settings refuse
    /// to start (before, each node posted with its own, and one without
    /// the setting wrote no outbox rows at all).
    #[tokio::test]
    async fn a_node_with_other_shared_settings_is_refused_while_others_live() {
        let (n1, n2) = test_store_pair().await;
        n1.join_node("n1", "http://n1:1", 60_000).await.unwrap();
        let hook = "OPKERNEL_WEBHOOK_URL";
        assert_eq!(
            n1.agree_shared_setting("n1", hook, "a").await.unwrap(),
            Ok(())
        );
        n2.join_node("n2", "http://n2:1", 60_000).await.unwrap();
        assert_eq!(
            n2.agree_shared_setting("n2", hook, "a").await.unwrap(),
            Ok(())
        );
        let refused = n2.agree_shared_setting("n2", hook, "b").await.unwrap();
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains(hook) && e.contains("n1")),
            "{refused:?}"
        );
        // n1 gone (lapsed): the cluster was stopped, the new value stands
        n1.renew_lease("n1", 1, -1, (0, 0)).await.unwrap();
        assert_eq!(
            n2.agree_shared_setting("n2", hook, "b").await.unwrap(),
            Ok(())
        );
        let back = n1.agree_shared_setting("n1", hook, "a").await.unwrap();
        assert!(back.is_err(), "n1 back with the old value: refused");
    }
}
