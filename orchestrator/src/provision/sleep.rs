//! The sleep pass: while a tenant is asked to sleep ([`crate::sleep`]) and nothing else needs
//! its control plane, its pass renders every component at no replicas instead of the bring-up,
//! keeping CoreDNS while any of its pods runs on the host, and reports phase `Sleeping`.

use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::lifecycle::steps;
use crate::provision::{Pass, outcome};
use crate::render::{Component, Run};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{ConditionReason, ConditionStatus, ConditionType, Phase};
use vcp_core::naming::control_plane_namespace;

/// How often a sleeping tenant is looked at once its control plane is gone: for drift, as a
/// Ready one is. A wake makes it due at once.
const REQUEUE_ASLEEP: Duration = steps::REQUEUE_READY;

impl Provisioner {
    /// A pass over a tenant asked to sleep: its control plane stopped, and what is left of it.
    pub(crate) async fn sleep_pass(&self, t: &Tenant, now: OffsetDateTime) -> Pass {
        let prev = &t.conditions.0;
        let mut v = steps::Verdict {
            phase: Phase::Sleeping,
            conditions: prev.clone(),
            requeue_after: steps::REQUEUE_WAITING,
        };
        let (status, reason, message, error) = match self.stop_for_sleep(t).await {
            Ok(0) => {
                v.requeue_after = REQUEUE_ASLEEP;
                (
                    ConditionStatus::False,
                    ConditionReason::Asleep,
                    "asleep: the control plane is scaled to zero; a wake or a request through \
                     the gateway starts it"
                        .to_owned(),
                    None,
                )
            }
            Ok(left) => (
                ConditionStatus::False,
                ConditionReason::Asleep,
                format!("going to sleep: {left} control-plane pods left"),
                None,
            ),
            Err(e) => {
                v.requeue_after = steps::REQUEUE_ERROR;
                (
                    ConditionStatus::False,
                    ConditionReason::Error,
                    e.public(),
                    Some(e.variant()),
                )
            }
        };
        steps::set_condition(
            &mut v,
            ConditionType::Ready,
            status,
            reason,
            &message,
            prev,
            now,
        );
        Pass {
            outcome: outcome(v, t, t.endpoint.clone()),
            error,
            work: Vec::new(),
        }
    }

    /// Renders every component asleep and applies it; returns the control-plane pods still
    /// there (CoreDNS kept for running workloads not counted).
    async fn stop_for_sleep(&self, t: &Tenant) -> Result<usize> {
        let version = self
            .version_of(t)
            .ok_or_else(|| Error::Config(format!("version {} is not configured", t.version)))?;
        let input = self
            .job_input(t, Some(&version))
            .ok_or_else(|| Error::Config(format!("plan {} is not configured", t.plan)))?;
        let dns = crate::sleep::sweep::has_live_pods(&self.host, t).await?;
        let asleep = crate::render::Input {
            run: Run::Asleep { dns },
            ..input
        };
        for c in [
            Component::Syncer,
            Component::ControllerManager,
            Component::Coredns,
            Component::Apiserver,
            Component::Etcd,
        ] {
            let objects = self.config.renderer.render(c, &asleep)?;
            crate::host::ssa::apply_all(&self.host, &objects).await?;
        }
        let ns = control_plane_namespace(&t.key);
        let mut left = self.control_plane_pods(t, &ns, true).await?;
        if !dns {
            left += self.dns_pods(t, &ns).await?;
        }
        Ok(left)
    }

    async fn dns_pods(&self, t: &Tenant, ns: &str) -> Result<usize> {
        let sel = format!(
            "{}={},{}=coredns",
            crate::render::LABEL_CONTROL_PLANE_OF,
            t.key,
            crate::render::LABEL_COMPONENT
        );
        Ok(Api::<Pod>::namespaced(self.host.clone(), ns)
            .list_metadata(&ListParams::default().labels(&sel))
            .await
            .map_err(|e| Error::kube("list the tenant's CoreDNS pods", e))?
            .items
            .len())
    }
}
