//! Endpoints and EndpointSlices of selector-less Services (see `resources::endpoints`).
//!
//! Whether an object goes down depends on its Service, read from the tenant Service cache. An
//! Endpoints object whose Service is not cached (yet) is retried soon rather than left
//! waiting for a change: owners often write the Service and its Endpoints back to back.

use super::{Engine, Side, Synced};
use crate::Result;
use crate::resources::endpoints::{
    self, controller_managed, endpoints_to_host, hand_managed, service_of_slice, slice_to_host,
};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;

/// How soon an object whose Service is not cached is looked at again.
const SERVICE_PENDING: Duration = Duration::from_secs(5);

fn tenant_service(e: &Engine, ns: &str, name: &str) -> Option<Arc<Service>> {
    e.tenant_services
        .get()?
        .get(&ObjectRef::new(name).within(ns))
}

impl Synced for Endpoints {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        let svc = tenant_service(e, &t.namespace()?, &t.name_any())?;
        hand_managed(&svc).then(|| endpoints_to_host(t, &e.ctx))
    }
}

impl Synced for EndpointSlice {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        if controller_managed(t) {
            return None;
        }
        let svc = tenant_service(e, &t.namespace()?, service_of_slice(t)?)?;
        hand_managed(&svc).then(|| slice_to_host(t, &e.ctx))
    }

    fn host_watch(key: &crate::naming::TenantKey) -> kube::runtime::watcher::Config {
        // The host's own controllers copy a Service's or Endpoints' labels (our markers among
        // them) onto the slices they manage; those are theirs, never ours to collect.
        let managers = endpoints::CONTROLLER_MANAGERS.join(",");
        kube::runtime::watcher::Config::default().labels(&format!(
            "{}={key},{} notin ({managers})",
            crate::naming::LABEL_TENANT,
            endpoints::MANAGED_BY
        ))
    }
}

/// Down-reconcile of tenant Endpoints.
pub async fn down_endpoints(t: Arc<Endpoints>, side: Arc<Side<Endpoints>>) -> Result<Action> {
    let ns = t.namespace().unwrap_or_default();
    if tenant_service(&side.engine, &ns, &t.name_any()).is_none() {
        return Ok(Action::requeue(SERVICE_PENDING));
    }
    super::down(t, side).await
}

/// Down-reconcile of a tenant EndpointSlice.
pub async fn down_slice(t: Arc<EndpointSlice>, side: Arc<Side<EndpointSlice>>) -> Result<Action> {
    let ns = t.namespace().unwrap_or_default();
    let pending = !controller_managed(&t)
        && service_of_slice(&t).is_some_and(|s| tenant_service(&side.engine, &ns, s).is_none());
    if pending {
        return Ok(Action::requeue(SERVICE_PENDING));
    }
    super::down(t, side).await
}
