//! Events up (see `resources::events`): one watch of host Events, filtered to this tenant's
//! host namespaces (`<key>-*`); each Event about a host object carrying the tenant's markers
//! is created, or updated, in the tenant.
//!
//! Host objects are looked up once per UID (an Event names its object's UID; many Events
//! name the same pod). Host Event resource versions already copied are remembered, so a
//! relist after a watch reconnect writes nothing. Both memories are bounded; forgetting only
//! costs a repeated, idempotent write.

use super::{Engine, kube_err};
use crate::metrics::Direction;
use crate::naming::{self, TenantRef};
use crate::resources::events::{plural, repeat_patch, to_tenant};
use crate::{Error, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Entries each memory holds before it starts over.
const MEMORY: usize = 10_000;

#[derive(Default)]
struct Memory {
    /// Host object UID -> its tenant object (`None`: not one of ours).
    objects: HashMap<String, Option<TenantRef>>,
    /// Host Event UID -> resource version last copied.
    copied: HashMap<String, String>,
}

fn remember<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>, k: K, v: V) {
    if m.len() >= MEMORY {
        m.clear();
    }
    m.insert(k, v);
}

/// Copies host Events of this tenant's objects up until the future is dropped.
pub async fn run(e: Arc<Engine>, concurrency: usize) {
    let memory = Arc::new(Mutex::new(Memory::default()));
    let prefix = format!("{}-", e.key());
    watcher(Api::<Event>::all(e.host.clone()), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .filter_map(|r| async move {
            r.map_err(|err| tracing::warn!(error = %err, "host event watch failed; retrying"))
                .ok()
        })
        .filter(|ev| {
            let ours = ev.namespace().is_some_and(|ns| ns.starts_with(&prefix));
            async move { ours }
        })
        .for_each_concurrent(concurrency, |ev| {
            let (e, memory) = (e.clone(), memory.clone());
            async move {
                let copy = copy_up(&e, &memory, &ev);
                if let Err(err) = e.metrics.timed("Event", Direction::Up, false, copy).await {
                    e.metrics.error("Event", &err);
                    tracing::warn!(ns = ?ev.namespace(), event = %ev.name_any(), error = %err, "failed to copy a host event to the tenant");
                }
            }
        })
        .await;
}

async fn tenant_object(
    e: &Engine,
    memory: &Mutex<Memory>,
    ev: &Event,
    host_ns: &str,
) -> Result<Option<TenantRef>> {
    let o = &ev.involved_object;
    let (Some(plural), Some(name)) = (plural(o), o.name.as_deref()) else {
        return Ok(None);
    };
    if o.namespace.as_deref() != Some(host_ns) {
        return Ok(None);
    }
    let uid = o.uid.clone().unwrap_or_default();
    if let Some(known) = lock(memory).objects.get(&uid) {
        return Ok(known.clone());
    }
    if let Some(known) = e.cached_tenant_ref(o.kind.as_deref(), host_ns, name, &uid) {
        return Ok(known);
    }
    let kind = o.kind.clone().unwrap_or_default();
    let ar = ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.clone(),
        plural: plural.into(),
    };
    let obj = Api::<DynamicObject>::namespaced_with(e.host.clone(), host_ns, &ar)
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get host {kind} {host_ns}/{name}")))?;
    let Some(obj) = obj.filter(|obj| uid.is_empty() || obj.uid().as_deref() == Some(&uid)) else {
        // Gone, or another object of that name now: nothing to attach the event to.
        return Ok(None);
    };
    // Token Secrets are the syncer's own, not a tenant object's.
    let r = naming::tenant_ref(e.key(), obj.labels(), obj.annotations())
        .filter(|_| !obj.annotations().contains_key(naming::ANN_GENERATED));
    if !uid.is_empty() {
        remember(&mut lock(memory).objects, uid, r.clone());
    }
    Ok(r)
}

fn lock(m: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn copy_up(e: &Engine, memory: &Mutex<Memory>, ev: &Event) -> Result<()> {
    let (Some(host_ns), Some(uid)) = (ev.namespace(), ev.uid()) else {
        return Ok(());
    };
    let rv = ev.resource_version().unwrap_or_default();
    if lock(memory).copied.get(&uid) == Some(&rv) {
        return Ok(());
    }
    let Some(r) = tenant_object(e, memory, ev, &host_ns).await? else {
        return Ok(());
    };
    let Some(tenant_ev) = to_tenant(ev, &r, &host_ns) else {
        return Ok(());
    };
    let ns = tenant_ev.namespace().unwrap_or_default();
    let name = tenant_ev.name_any();
    let api: Api<Event> = Api::namespaced(e.tenant.clone(), &ns);
    let pp = PostParams {
        field_manager: Some(crate::resources::FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, &tenant_ev).await {
        Ok(_) => {
            tracing::debug!(ns = %ns, event = %name, reason = ?tenant_ev.reason, "copied host event up")
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(repeat_patch(&tenant_ev)),
            )
            .await
            .map_err(kube_err(format!("update tenant event {ns}/{name}")))?;
        }
        // The tenant namespace is gone or terminating: its events with it.
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 403 => {
            tracing::debug!(ns = %ns, "tenant namespace gone; host event not copied")
        }
        Err(err) => {
            return Err(Error::Kube {
                context: format!("create tenant event {ns}/{name}"),
                source: err,
            });
        }
    }
    remember(&mut lock(memory).copied, uid, rv);
    Ok(())
}
