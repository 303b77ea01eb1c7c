//! Namespaces (cluster-scoped): a host namespace per tenant namespace while the plan's
//! namespace count lasts, removed with the tenant namespace, with the plan's Pod Security
//! level, vcp's own NetworkPolicies ([`crate::kinds::netpols`]) and the quota backstop
//! (`quota::apply_backstop`) kept in it.

pub mod access;
pub mod translate;

use crate::engine::quota::{self, Verdict};
use crate::engine::shared::Shared;
use crate::engine::{Engine, FIELD_MANAGER, backoff, delete_exact, host_selector};
use crate::metrics::Direction;
use crate::{Result, kube_err};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::naming::{self, TenantKey};

struct Ns {
    engine: Arc<Engine>,
    tenant: Store<Namespace>,
    /// How the syncer grants itself access to each host namespace it creates (`--host-role`);
    /// `None` when its host credentials already reach them.
    access: Option<access::HostAccess>,
}

#[tracing::instrument(skip_all, fields(kind = "Namespace", name = %t.name_any()))]
async fn down(t: Arc<Namespace>, cx: Arc<Ns>) -> Result<Action> {
    if t.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let e = &cx.engine;
    let desired = translate::to_host(&t, &e.ctx);
    let name = desired.name_any();
    let api: Api<Namespace> = Api::all(e.host.clone());
    match quota::admit_namespace(e, &t) {
        Verdict::Admitted => {}
        Verdict::NotReady => return Ok(Action::requeue(quota::not_ready())),
        // Over the plan's count: no host namespace (one made before the plan shrank stays).
        Verdict::Refused(refusals) => {
            let exists = e
                .host_namespaces
                .get()
                .is_some_and(|c| c.get(&ObjectRef::new(&name)).is_some());
            if !exists {
                quota::tell(e, t.as_ref(), &refusals).await;
                return Ok(Action::requeue(quota::retry(e)));
            }
        }
    }
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let created = api.create(&pp, &desired).await;
    match created {
        Ok(_) => {
            tracing::info!(namespace = %name, "created host namespace");
            // The syncer's only access to what it puts there.
            access::ensure(e, cx.access.as_ref(), &name).await?;
            // Deny by default before the first pod can land there.
            crate::kinds::netpols::ensure_host_policies(e, &name).await?;
            quota::apply_backstop(e, &name).await?;
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => {
            let current = api
                .get(&name)
                .await
                .map_err(kube_err(format!("get host namespace {name}")))?;
            if !naming::owned_by(e.key(), current.labels()) {
                e.report(
                    t.as_ref(),
                    "HostConflict",
                    format!("host namespace {name} exists and is not managed by this tenant"),
                )
                .await;
                return Ok(Action::requeue(cx.engine.resync));
            }
            // Ours: the network policies and the backstop are put back on every pass (a no-op
            // unless they drifted).
            if current.metadata.deletion_timestamp.is_none() {
                access::ensure(e, cx.access.as_ref(), &name).await?;
                crate::kinds::netpols::ensure_host_policies(e, &name).await?;
                quota::apply_backstop(e, &name).await?;
            }
            if drifted(&desired, &current) {
                // Labels changed in the tenant, or the plan's level changed, or someone edited
                // the host namespace: the host must carry exactly what vcp decides.
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
                .map_err(kube_err(format!("apply host namespace {name}")))?;
            }
        }
        Err(err) => return Err(kube_err(format!("create host namespace {name}"))(err)),
    }
    Ok(Action::requeue(cx.engine.resync))
}

/// Whether the host namespace lacks a label or annotation vcp wants on it.
fn drifted(desired: &Namespace, current: &Namespace) -> bool {
    let missing = |want: &std::collections::BTreeMap<String, String>,
                   have: &std::collections::BTreeMap<String, String>| {
        want.iter().any(|(k, v)| have.get(k) != Some(v))
    };
    missing(desired.labels(), current.labels())
        || missing(desired.annotations(), current.annotations())
}

#[tracing::instrument(skip_all, fields(kind = "Namespace", name = %h.name_any()))]
async fn gc(h: Arc<Namespace>, cx: Arc<Ns>) -> Result<Action> {
    let e = &cx.engine;
    let Some(r) = naming::tenant_ref(e.key(), h.labels(), h.annotations()) else {
        return Ok(Action::await_change());
    };
    let tenant = cx.tenant.get(&ObjectRef::new(&r.name));
    let wanted = tenant
        .as_ref()
        .is_some_and(|t| r.uid.is_none() || t.uid() == r.uid);
    if wanted || h.metadata.deletion_timestamp.is_some() {
        return Ok(Action::requeue(cx.engine.resync));
    }
    // Confirm with the tenant apiserver: the cache may lag (see engine::gc).
    let still = Api::<Namespace>::all(e.tenant.clone())
        .get_opt(&r.name)
        .await
        .map_err(kube_err(format!("get tenant namespace {}", r.name)))?
        .is_some_and(|t| r.uid.is_none() || t.uid() == r.uid);
    if !still {
        tracing::info!(namespace = %h.name_any(), "tenant namespace gone; deleting host namespace");
        delete_exact(
            &Api::all(e.host.clone()),
            h.as_ref(),
            None,
            "host namespace",
        )
        .await?;
    }
    Ok(Action::requeue(cx.engine.resync))
}

impl AsRef<Engine> for Ns {
    fn as_ref(&self) -> &Engine {
        &self.engine
    }
}

/// Runs the namespace controllers until dropped.
pub async fn run(engine: Arc<Engine>, key: TenantKey, access: Option<access::HostAccess>) {
    // One watch and cache per side, shared by both controllers (see `crate::engine::shared`).
    let mut tenant = Shared::<Namespace>::new();
    let mut host = Shared::<Namespace>::new();
    // The quota counts namespaces, and objects in a namespace it keeps off the host wait.
    quota::observe(&engine, &mut tenant, &mut host);
    let _ = engine.host_namespaces.set(host.cache());
    let _ = engine.tenant_namespaces.set(tenant.cache());
    let cx = Arc::new(Ns {
        engine: engine.clone(),
        tenant: tenant.store(),
        access,
    });
    let down_fut = Controller::for_shared_stream(tenant.subscribe(), tenant.store())
        .run(
            |t, cx: Arc<Ns>| async move {
                let e = cx.engine.clone();
                e.metrics
                    .timed("Namespace", Direction::Down, true, down(t, cx))
                    .await
            },
            backoff,
            cx.clone(),
        )
        .for_each(|_| async {});
    // GC is triggered by host namespaces and, so a deletion acts at once, by tenant ones.
    let k2 = key.clone();
    let ready = tenant.cache();
    let gc_fut = Controller::for_shared_stream(host.subscribe(), host.store())
        .watches_shared_stream(tenant.subscribe(), move |t: Arc<Namespace>| {
            Some(ObjectRef::new(&naming::host_namespace(&k2, &t.name_any())))
        })
        .run(
            move |h, cx: Arc<Ns>| {
                let ready = ready.clone();
                async move {
                    if !crate::engine::cache_ready(&ready) {
                        return Ok(Action::requeue(Duration::from_secs(1)));
                    }
                    let e = cx.engine.clone();
                    e.metrics
                        .timed("Namespace", Direction::Down, true, gc(h, cx))
                        .await
                }
            },
            backoff,
            cx,
        )
        .for_each(|_| async {});
    let publish = publish_set(engine.clone(), host.cache(), host.subscribe());
    futures::join!(
        publish,
        tenant.run(
            Api::<Namespace>::all(engine.tenant.clone()),
            watcher::Config::default()
        ),
        host.run(
            Api::<Namespace>::all(engine.host.clone()),
            host_selector(&key)
        ),
        down_fut,
        gc_fut
    );
}

/// Publishes the set of this tenant's host namespaces ([`Engine::host_namespace_set`]) once
/// the host cache has listed them, and again whenever one comes or goes.
async fn publish_set(
    e: Arc<Engine>,
    cache: crate::engine::shared::Cache<Namespace>,
    mut touched: futures::channel::mpsc::UnboundedReceiver<Arc<Namespace>>,
) {
    cache.ready().await;
    loop {
        let set: std::collections::BTreeSet<String> =
            cache.state().iter().map(|n| n.name_any()).collect();
        e.host_namespace_set.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&set);
            if changed {
                tracing::debug!(namespaces = set.len(), "host namespaces changed");
                *current = Some(set);
            }
            changed
        });
        if touched.next().await.is_none() {
            return;
        }
    }
}

/// Starts the namespace controllers (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let key = s.engine.key().clone();
    Box::pin(run(s.engine.clone(), key, s.host_access.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::{fields, obj, offline_engine, span, spans_of};

    #[tokio::test]
    async fn down_and_gc_run_in_spans_naming_the_namespace() {
        let cx = Arc::new(Ns {
            engine: offline_engine(),
            tenant: Shared::<Namespace>::new().store(),
            access: None,
        });
        let ns = |name: &str| obj::<Namespace>(serde_json::json!({"metadata": {"name": name}}));
        let spans = spans_of(down(ns("apps"), cx.clone())).await;
        assert_eq!(
            span(&spans, "down"),
            Some(&fields(&[("kind", "Namespace"), ("name", "apps")])),
            "{spans:?}"
        );
        let spans = spans_of(gc(ns("demo-apps"), cx)).await;
        assert_eq!(
            span(&spans, "gc"),
            Some(&fields(&[("kind", "Namespace"), ("name", "demo-apps")])),
            "{spans:?}"
        );
    }
}
