//! The idle sweep: each replica, every `--sleep-sweep-seconds`, asks the inventory for the
//! tenants that could sleep ([`Inventory::sleep_candidates`]), keeps those whose plan sleeps and
//! who have been idle long enough ([`super::due`]), and puts each to sleep unless one of its
//! pods still runs on the host (one label-selected list, at most one pod read, per idle
//! tenant). Writing the sleep re-checks the tenant under its row lock, so sweeps of several
//! replicas, a wake arriving meanwhile and an owner's own request never fight: the first
//! write wins, and the others find it done.

use super::store::Asked;
use crate::host::Config;
use crate::inventory::{Inventory, Tenant};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::Sleep;
use vcp_core::naming::LABEL_TENANT;

/// Whether any of the tenant's pods on the host is not finished (running, or waiting to): one
/// list of at most one pod. The idle sweep and the sleep pass (which keeps CoreDNS for them)
/// both ask it.
pub(crate) async fn has_live_pods(host: &kube::Client, t: &Tenant) -> crate::Result<bool> {
    let lp = ListParams::default()
        .labels(&format!("{LABEL_TENANT}={}", t.key))
        .fields("status.phase!=Succeeded,status.phase!=Failed")
        .limit(1);
    let pods = Api::<Pod>::all(host.clone())
        .list_metadata(&lp)
        .await
        .map_err(|e| crate::Error::kube("list the tenant's pods", e))?;
    Ok(!pods.items.is_empty())
}

/// One sweep; returns the tenants it put to sleep.
#[tracing::instrument(skip_all)]
pub async fn once(
    inventory: &Inventory,
    host: &kube::Client,
    config: &Config,
    now: OffsetDateTime,
) -> crate::Result<Vec<String>> {
    let mut slept = Vec::new();
    for t in inventory.sleep_candidates().await? {
        let plan = config.plans.get(&t.plan).and_then(|p| p.sleep.as_ref());
        let idle = super::idle(now, t.created_at, t.active_at);
        // The pod list only for tenants idle long enough by the clock.
        if !super::due(plan, idle, 0) {
            continue;
        }
        if has_live_pods(host, &t).await? {
            continue;
        }
        let why = format!("idle for {} min", idle.as_secs() / 60);
        if let Asked::Changed(_) = inventory
            .ask_sleep(&t, Sleep::Asleep, "vcp:idle-sweep", &why)
            .await?
        {
            tracing::info!(tenant = %t.name, key = %t.key, idle_s = idle.as_secs(), "put to sleep");
            slept.push(t.name.clone());
        }
    }
    Ok(slept)
}

/// Sweeps every `every` until the process ends; a failed sweep is logged and the next one
/// runs on time.
pub async fn run(inventory: Inventory, host: kube::Client, config: Arc<Config>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = once(&inventory, &host, &config, OffsetDateTime::now_utc()).await {
            tracing::warn!(error = %e.public(), "the idle sweep failed");
        }
    }
}
