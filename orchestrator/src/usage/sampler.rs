//! Tenant quota usage: sampled from the host into the inventory, for the API and billing.
//!
//! Every `--usage-interval-seconds`, [`Sampler::round`] asks the inventory which Ready tenants
//! have no sample from the last three quarters of an interval, lists each one's host
//! namespaces, pods, Services and claims by its label `vcp.dev/tenant=<key>` (vcp holds host
//! admin credentials; four paginated list requests per tenant, a few tenants at a time), counts
//! them with `vcp_policy::quota::host_usage` (pure: the syncer's own admission rules
//! over the host objects, see there) and records one sample per tenant
//! ([`Inventory::record_usage`]). The host is counted, not the tenant apiserver: tenant pod
//! status is the tenant's to write, so only the host says what really runs.
//!
//! Replicas share the work without talking: a round samples only tenants that are due, and
//! recording re-checks that under a per-tenant lock, so each tenant gets about one sample per
//! interval however many replicas run, and a replica that stops leaves its share to the
//! others at their next round. Samples older than `--usage-retention-days` are pruned after
//! every round. The plan's limits are not stored with the samples: the API reads them from
//! the plan when it answers ([`limits`]).

use crate::inventory::{Inventory, Tenant};
use crate::render::Plan;
use crate::{Error, Result};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Service};
use kube::Client;
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::naming::LABEL_TENANT;
use vcp_policy::quota::{Hard, HostObjects, Limits, Usage, host_usage};

/// Tenants counted at once in a round.
const CONCURRENCY: usize = 4;

/// Objects per list request.
const PAGE: u32 = 500;

/// The limits a tenant's usage is measured against: its plan's quota (`None` fields are
/// unlimited). A plan no longer configured has none (all `None`); such a tenant fails its next
/// reconcile pass anyway.
pub fn limits(plans: &BTreeMap<String, Plan>, plan: &str) -> Hard {
    plans
        .get(plan)
        .map(|p| p.policy.quota.hard())
        .unwrap_or_default()
}

/// How old a tenant's latest sample must be before a round samples it again: three quarters
/// of the interval, so a replica's own rounds (`interval` apart, give or take how long a
/// round takes) never skip one, while another replica's round in between does nothing.
pub fn min_gap(interval: Duration) -> Duration {
    interval * 3 / 4
}

/// What one tenant's sampling recorded: the stored time and the usage, or nothing if
/// another replica had just sampled it.
type Sampled = Option<(OffsetDateTime, Usage)>;

/// What a round recorded.
#[derive(Debug, Default)]
pub struct Round {
    /// Tenants sampled: (name, the stored sample time, what it held).
    pub recorded: Vec<(String, OffsetDateTime, Usage)>,
    /// Tenants another replica sampled in the meantime.
    pub skipped: usize,
    /// Tenants that could not be counted or recorded, with why.
    pub failed: Vec<(String, Error)>,
}

/// Samples tenants' usage from the host into the inventory.
#[derive(Clone)]
pub struct Sampler {
    inventory: Inventory,
    host: Client,
    /// Container defaults of each plan: how a host container without resources counts.
    defaults: BTreeMap<String, Limits>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}

async fn list<K>(host: &Client, key: &str, what: &str) -> Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(host.clone());
    let mut params = ListParams::default()
        .labels(&format!("{LABEL_TENANT}={key}"))
        .limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| Error::kube(format!("list the {what} of tenant {key}"), e))?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(out),
        }
    }
}

impl Sampler {
    pub fn new(inventory: Inventory, host: Client, plans: &BTreeMap<String, Plan>) -> Sampler {
        Sampler {
            inventory,
            host,
            defaults: plans
                .iter()
                .map(|(name, p)| (name.clone(), p.policy.quota.limits.clone()))
                .collect(),
        }
    }

    /// What tenant `t` holds on the host now.
    pub async fn count(&self, t: &Tenant) -> Result<Usage> {
        let (namespaces, pods, services, claims) = tokio::try_join!(
            list::<Namespace>(&self.host, &t.key, "namespaces"),
            list::<Pod>(&self.host, &t.key, "pods"),
            list::<Service>(&self.host, &t.key, "services"),
            list::<PersistentVolumeClaim>(&self.host, &t.key, "persistent volume claims"),
        )?;
        let defaults = self.defaults.get(&t.plan).cloned().unwrap_or_default();
        Ok(host_usage(
            &t.key,
            &HostObjects {
                namespaces: &namespaces,
                pods: &pods,
                services: &services,
                claims: &claims,
            },
            &defaults,
        ))
    }

    /// One round: every Ready tenant without a sample newer than `min_gap` is counted and
    /// recorded. `Duration::ZERO` samples every Ready tenant now (tests, and an operator who
    /// wants a fresh sample).
    #[tracing::instrument(skip_all, fields(min_gap_s = min_gap.as_secs()))]
    pub async fn round(&self, min_gap: Duration) -> Result<Round> {
        let due = self.inventory.tenants_due_for_usage(min_gap).await?;
        let results: Vec<(Tenant, Result<Sampled>)> = futures::stream::iter(due)
            .map(|t| async move {
                let r = self.sample(&t, min_gap).await;
                (t, r)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut round = Round::default();
        for (t, r) in results {
            match r {
                Ok(Some((at, used))) => round.recorded.push((t.name, at, used)),
                Ok(None) => round.skipped += 1,
                Err(e) => round.failed.push((t.name, e)),
            }
        }
        round.recorded.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(round)
    }

    async fn sample(&self, t: &Tenant, min_gap: Duration) -> Result<Sampled> {
        let used = self.count(t).await?;
        let at = OffsetDateTime::now_utc();
        Ok(self
            .inventory
            .record_usage(t.id, at, &used, min_gap)
            .await?
            .map(|at| (at, used)))
    }

    /// Samples every `interval` and prunes samples older than `retention`, forever.
    pub async fn run(
        self,
        interval: Duration,
        retention: Duration,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.round(min_gap(interval)).await {
                Ok(r) => {
                    for (tenant, e) in &r.failed {
                        tracing::warn!(%tenant, error = %e.public(), "cannot sample usage");
                    }
                    metrics.usage_round(r.recorded.len(), r.failed.len());
                    if !r.recorded.is_empty() || !r.failed.is_empty() {
                        tracing::info!(
                            recorded = r.recorded.len(),
                            skipped = r.skipped,
                            failed = r.failed.len(),
                            "usage sampled"
                        );
                    }
                }
                Err(e) => {
                    metrics.usage_round(0, 1);
                    tracing::warn!(error = %e.public(), "usage round failed");
                }
            }
            let before = OffsetDateTime::now_utc() - retention;
            match self.inventory.prune_usage(before).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(pruned = n, %before, "old usage samples pruned"),
                Err(e) => tracing::warn!(error = %e.public(), "cannot prune usage samples"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_come_from_the_plan_and_an_unknown_plan_has_none() {
        let plans = crate::render::parse_plans(
            "default: {}\nsmall: {policy: {quota: {pods: 5, requests_cpu: 1500m}}}\n",
        )
        .unwrap();
        let small = limits(&plans, "small");
        assert_eq!(small.pods, Some(5));
        assert_eq!(small.requests_cpu, Some(1500));
        assert_eq!(small.requests_memory, None, "not listed: unlimited");
        assert_eq!(
            limits(&plans, "default").pods,
            Some(100),
            "a plan without a quota section has the default quota"
        );
        assert_eq!(limits(&plans, "gone"), Hard::default());
    }

    #[test]
    fn a_replicas_own_rounds_are_always_due_and_anothers_in_between_are_not() {
        let interval = Duration::from_secs(60);
        let gap = min_gap(interval);
        // Its own next round comes an interval later, a little early at worst.
        assert!(interval - Duration::from_secs(5) > gap);
        // Another replica's round halfway in between finds the sample too recent.
        assert!(interval / 2 < gap);
    }
}
