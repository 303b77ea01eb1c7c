//! Passes driven by the host's events instead of a poll.
//!
//! A bring-up pass reads readiness from the host: pods' probes, the rollouts of Deployments and
//! StatefulSets, the endpoints that route to the tenant apiserver. Rather than look again
//! every [`steps::REQUEUE_WAITING`](super::steps::REQUEUE_WAITING) until one changes, every
//! replica watches those objects of every control plane (label `vcp.dev/control-plane-of`)
//! and, on a change, makes that tenant due at once ([`Inventory::wake`], which sends `NOTIFY
//! vcp_tenants`, so an idle worker of any replica claims it). Changes that arrive together
//! (a pod turning ready moves its workload and its endpoints too) go in one statement.
//!
//! A change that arrives while one of this replica's workers holds the tenant would be lost:
//! the pass ends by scheduling the tenant after its own requeue. The worker marks the tenant
//! ([`Woken::begin`]) and asks at the end whether a change came ([`Woken::end`]); every
//! replica sees every event, so the one holding the lease always knows. Nothing here is state:
//! a replica that restarts misses some wakes, and the requeue of a waiting pass still comes.

use crate::inventory::Inventory;
use crate::render::LABEL_CONTROL_PLANE_OF;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long changes are gathered before the tenants they concern are woken.
const GATHER: Duration = Duration::from_millis(50);

/// The tenants this replica's workers hold, and whether the host changed under each since.
#[derive(Debug, Default)]
pub struct Woken(Mutex<HashMap<String, bool>>);

impl Woken {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        // A worker that panicked holding the lock left a map that is still consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A worker starts a pass over the tenant with this key.
    pub fn begin(&self, key: &str) {
        self.lock().insert(key.to_owned(), false);
    }

    /// The host changed objects of this tenant.
    pub fn poke(&self, key: &str) {
        if let Some(w) = self.lock().get_mut(key) {
            *w = true;
        }
    }

    /// The pass is over; whether the host changed during it.
    pub fn end(&self, key: &str) -> bool {
        self.lock().remove(key).unwrap_or(false)
    }
}

/// The tenant keys of changed objects of kind `K` labelled as a control plane's. The initial
/// list (and every re-list) is skipped: waking every tenant at a replica's start would only
/// repeat what their schedule does.
fn changes<K>(host: &Client) -> BoxStream<'static, String>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let cfg = watcher::Config::default().labels(LABEL_CONTROL_PLANE_OF);
    watcher(Api::<K>::all(host.clone()), cfg)
        .default_backoff()
        .try_filter_map(|e| {
            std::future::ready(Ok(match e {
                watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                    o.labels().get(LABEL_CONTROL_PLANE_OF).cloned()
                }
                _ => None,
            }))
        })
        .filter_map(|r| std::future::ready(r.ok()))
        .boxed()
}

/// Watches the host until the future is dropped; wakes the tenants whose objects change.
pub async fn run(host: Client, inventory: Inventory, woken: Arc<Woken>) {
    let mut keys = futures::stream::select_all([
        changes::<Pod>(&host),
        changes::<Deployment>(&host),
        changes::<StatefulSet>(&host),
        changes::<EndpointSlice>(&host),
    ]);
    while let Some(first) = keys.next().await {
        let mut batch = BTreeSet::from([first]);
        let gather = tokio::time::sleep(GATHER);
        tokio::pin!(gather);
        loop {
            tokio::select! {
                () = &mut gather => break,
                k = keys.next() => match k {
                    Some(k) => { batch.insert(k); }
                    None => break,
                },
            }
        }
        for k in &batch {
            woken.poke(k);
        }
        let batch: Vec<String> = batch.into_iter().collect();
        if let Err(e) = inventory.wake(&batch).await {
            tracing::warn!(error = %e.public(), tenants = batch.len(), "waking tenants failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_during_a_pass_is_remembered_until_the_pass_ends() {
        let w = Woken::default();
        w.poke("a");
        w.begin("a");
        assert!(
            !w.end("a"),
            "a change before the pass began is the pass's to see"
        );
        w.begin("a");
        w.poke("b");
        w.poke("a");
        assert!(w.end("a"));
        assert!(!w.end("a"), "ended once");
        assert!(!w.end("b"), "no worker held b");
    }
}
