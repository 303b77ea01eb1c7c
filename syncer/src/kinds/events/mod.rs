//! Events up (translation: [`translate`]): host Events are watched only in this tenant's host
//! namespaces, one watch per namespace, started and stopped as the set the namespace
//! controllers publish changes (the syncer's credentials reach no other namespace). The host
//! apiserver thus sends no other tenant's Events (nor the host's own). Each Event about a host
//! object carrying the tenant's markers, in the Event's own namespace, is created, or updated,
//! in the tenant, except the host scheduler's binding record ([`translate::worth_copying`]).
//!
//! Host objects are looked up once per UID (an Event names its object's UID; many Events
//! name the same pod). Host Event resource versions already copied are remembered, so a
//! relist after a watch reconnect writes nothing. Both memories are bounded; forgetting only
//! costs a repeated, idempotent write.

pub mod translate;

use crate::engine::Engine;
use crate::engine::shared::Cache;
use crate::kinds::events::translate::{
    about_the_token_wait, plural, repeat_patch, to_tenant, worth_copying,
};
use crate::kube_err;
use crate::metrics::Direction;
use crate::{Error, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

use vcp_core::host_pod::HostPod;
use vcp_core::naming::{self, TenantKey, TenantRef};

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
    // The namespace watches feed one queue, so copies stay bounded by `concurrency` however
    // many namespaces the tenant has.
    let (tx, rx) = mpsc::channel::<Event>(concurrency.max(1) * 64);
    let copies = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (ev, rx))
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
    });
    // The scheduler's binding records never reach the syncer: one Event per pod that would
    // only be decoded and dropped ([`worth_copying`] still guards).
    let cfg = watcher::Config::default().fields(translate::NOT_WORTH_WATCHING);
    futures::join!(
        crate::engine::fanin::each_namespace(e.clone(), cfg, tx),
        copies
    );
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
    if let Some(known) = cached_tenant_ref(e, o.kind.as_deref(), host_ns, name, &uid) {
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
    // The markers must name a tenant namespace that maps to this very host namespace: an
    // object can only stand for a tenant object of the namespace it lives in.
    let r = naming::tenant_ref(e.key(), obj.labels(), obj.annotations())
        .filter(|_| !obj.annotations().contains_key(naming::ANN_GENERATED))
        .filter(|r| {
            r.namespace
                .as_deref()
                .is_some_and(|ns| naming::host_namespace(e.key(), ns) == host_ns)
        });
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
    if !worth_copying(ev) {
        return Ok(());
    }
    let rv = ev.resource_version().unwrap_or_default();
    if lock(memory).copied.get(&uid) == Some(&rv) {
        return Ok(());
    }
    let Some(r) = tenant_object(e, memory, ev, &host_ns).await? else {
        return Ok(());
    };
    if about_the_token_wait(ev, &r) {
        return Ok(());
    }
    let Some(tenant_ev) = to_tenant(ev, &r, &host_ns) else {
        return Ok(());
    };
    let ns = tenant_ev.namespace().unwrap_or_default();
    let name = tenant_ev.name_any();
    let api: Api<Event> = Api::namespaced(e.tenant.clone(), &ns);
    let pp = PostParams {
        field_manager: Some(crate::engine::FIELD_MANAGER.into()),
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

/// Which tenant object a host object was made from, as far as the caches tell (see
/// [`tenant_ref_from_caches`]).
fn cached_tenant_ref(
    e: &Engine,
    kind: Option<&str>,
    host_ns: &str,
    name: &str,
    uid: &str,
) -> Option<Option<naming::TenantRef>> {
    tenant_ref_from_caches(
        e.key(),
        e.host_namespaces.get(),
        e.host_pods.get().map(|c| &**c),
        kind,
        (host_ns, name, uid),
    )
}

/// Which tenant object the host object `kind` `(host_ns, name, uid)` was made from, from the
/// syncer's caches alone: `Some(None)` if the namespace is not one of this tenant's (a host
/// namespace that merely starts with `<key>-`), `Some(Some(_))` for a cached host pod of that
/// UID, `None` if only the host apiserver can tell. Saves Events up a GET for nearly every
/// Event they copy.
pub fn tenant_ref_from_caches(
    key: &TenantKey,
    namespaces: Option<&Cache<Namespace>>,
    pods: Option<&Store<HostPod>>,
    kind: Option<&str>,
    (host_ns, name, uid): (&str, &str, &str),
) -> Option<Option<naming::TenantRef>> {
    // Namespaces exist long before anything in them has events, so a complete cache without
    // this one means it is not ours.
    if let Some(namespaces) = namespaces.filter(|s| s.is_ready())
        && namespaces.get(&ObjectRef::new(host_ns)).is_none()
    {
        return Some(None);
    }
    if kind != Some("Pod") {
        return None;
    }
    let pod = pods?.get(&ObjectRef::new(name).within(host_ns))?;
    if uid.is_empty() || pod.uid().as_deref() != Some(uid) {
        return None;
    }
    Some(naming::tenant_ref(key, pod.labels(), pod.annotations()))
}

/// Starts copying the host's Events up (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let (e, w) = (s.engine.clone(), s.workers);
    Box::pin(async move {
        // Events are matched to their objects through the host caches; started before those
        // hold their first list, the events already on the host would each cost a GET. Not
        // forever: events matter more than the GETs.
        let caches = async {
            crate::engine::wait_for_cache(&e.host_namespaces).await;
            crate::engine::wait_for_cache(&e.host_pods).await;
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(30), caches).await;
        run(e, usize::from(w)).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::shared::{self, listed_store as cache};
    use k8s_openapi::api::core::v1::Namespace;
    use vcp_core::naming::TenantKey;

    #[test]
    fn events_find_their_tenant_object_in_the_caches_without_a_get() {
        let key = TenantKey::new("demo").unwrap();
        let namespaces = shared::Cache::listed(cache::<Namespace>(&[
            serde_json::json!({"metadata": {"name": "demo-apps"}}),
        ]));
        let pods = cache::<HostPod>(&[serde_json::json!({"metadata": {
            "name": "web", "namespace": "demo-apps", "uid": "h1",
            "labels": {(naming::LABEL_TENANT): "demo"},
            "annotations": {(naming::ANN_NAME): "web", (naming::ANN_NAMESPACE): "apps", (naming::ANN_UID): "t1"},
        }})]);
        let find = |kind, ns, name, uid| {
            tenant_ref_from_caches(
                &key,
                Some(&namespaces),
                Some(&pods),
                Some(kind),
                (ns, name, uid),
            )
        };
        let r = find("Pod", "demo-apps", "web", "h1").unwrap().unwrap();
        assert_eq!(
            (r.name.as_str(), r.namespace.as_deref(), r.uid.as_deref()),
            ("web", Some("apps"), Some("t1"))
        );
        assert_eq!(
            find("Pod", "demo-direct", "web", "h1"),
            Some(None),
            "a host namespace with the tenant's prefix that is not the tenant's"
        );
        assert_eq!(
            find("Pod", "demo-apps", "web", "h2"),
            None,
            "another pod of that name: ask"
        );
        assert_eq!(
            find("Pod", "demo-apps", "db", "h3"),
            None,
            "not cached (yet): ask"
        );
        assert_eq!(find("Service", "demo-apps", "web", "s1"), None);
        assert_eq!(
            tenant_ref_from_caches(&key, None, None, Some("Pod"), ("demo-direct", "web", "h1")),
            None,
            "without caches only the apiserver can tell"
        );
    }
}
