//! The generic sync loop: kube-runtime controllers on both sides of every kind.
//!
//! For a kind `K` there are two controllers:
//! - **down**: reconciles each tenant object (re-triggered when its host object changes, mapped
//!   back through the markers). It computes the desired host object with the kind's
//!   translator, [`decide`]s, and creates (POST, never apply: an existing host object then
//!   answers 409 and is inspected before anything is written), updates (server-side apply,
//!   field manager `vcp-syncer`), or replaces (tenant object recreated: UID changed). A host
//!   object without this tenant's markers is reported as a tenant Event and left alone.
//! - **gc**: reconciles each host object carrying this tenant's label and deletes it when its
//!   tenant object is gone (or has another UID). It waits until the tenant cache is complete,
//!   so a restart never mistakes "not listed yet" for "deleted".
//!
//! Both requeue periodically: that is the full resync that repairs drift, and since all state
//! lives in the two apiservers, a restarted syncer converges from scratch. Pods add status up,
//! binding to virtual nodes and two-way graceful deletion (`pods.rs`).

pub mod decide;
pub mod endpoints;
pub mod events;
pub mod namespaces;
pub mod pods;
pub mod pvcs;
pub mod services;
pub mod tokens;
pub mod volumes;

use crate::metrics::Direction;
use crate::naming::{self, TenantKey};
use crate::resources::{self, Ctx, FIELD_MANAGER};
use crate::{Error, Result};
use decide::{Decision, HostSide, decide};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// Default period of the full resync (`--resync-seconds`).
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// Everything reconcilers share.
pub struct Engine {
    pub tenant: Client,
    pub host: Client,
    pub ctx: Ctx,
    pub pod_env: resources::pods::PodEnv,
    pub recorder: Recorder,
    /// Sync latencies, reconciles in flight and errors, served on `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Period of the full resync: every reconcile requeues after it.
    pub resync: Duration,
    /// Sync every ConfigMap and Secret, not only those tenant pods reference.
    pub sync_all_configmaps_secrets: bool,
    /// The tenant pod cache, once the pod controller runs (for reference checks).
    pub tenant_pods: std::sync::OnceLock<Store<k8s_openapi::api::core::v1::Pod>>,
    /// The tenant Service cache, once the Service controller runs (service links, endpoints).
    pub tenant_services: std::sync::OnceLock<Store<k8s_openapi::api::core::v1::Service>>,
    /// Virtual nodes known to exist in the tenant (saves a GET per binding).
    pub known_nodes: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Engine {
    pub fn new(
        tenant: Client,
        host: Client,
        key: TenantKey,
        pod_env: resources::pods::PodEnv,
    ) -> Engine {
        let recorder = Recorder::new(
            tenant.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("HOSTNAME").ok(),
            },
        );
        Engine {
            tenant,
            host,
            ctx: Ctx { key },
            pod_env,
            recorder,
            metrics: crate::metrics::Metrics::new(),
            resync: DEFAULT_RESYNC,
            sync_all_configmaps_secrets: false,
            tenant_pods: std::sync::OnceLock::new(),
            tenant_services: std::sync::OnceLock::new(),
            known_nodes: Default::default(),
        }
    }

    /// Whether a tenant pod in `ns` references ConfigMap (`secret == false`) or Secret `name`.
    pub fn referenced(&self, ns: &str, name: &str, secret: bool) -> bool {
        if self.sync_all_configmaps_secrets {
            return true;
        }
        let Some(pods) = self.tenant_pods.get() else {
            return false;
        };
        pods.state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(ns))
            .any(|p| {
                let (cms, secrets) = resources::pods::references(p);
                if secret {
                    secrets.contains(name)
                } else {
                    cms.contains(name)
                }
            })
    }

    pub fn key(&self) -> &TenantKey {
        &self.ctx.key
    }

    /// Reports on a tenant object (what the tenant's `kubectl describe` shows).
    pub async fn report<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Sync".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "failed to record a tenant event");
        }
    }
}

/// A kind the engine syncs.
pub trait Synced:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The desired host object, or `None` if this tenant object is not synced.
    fn to_host(tenant: &Self, engine: &Engine) -> Option<Self>;

    /// Which host objects of this kind the engine watches: this tenant's, by label.
    fn host_watch(key: &TenantKey) -> watcher::Config {
        host_selector(key)
    }
}

impl Synced for k8s_openapi::api::core::v1::ConfigMap {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        e.referenced(&t.namespace()?, &t.name_any(), false)
            .then(|| resources::configmaps::to_host(t, &e.ctx))
    }
}

impl Synced for k8s_openapi::api::core::v1::Secret {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        e.referenced(&t.namespace()?, &t.name_any(), true)
            .then(|| resources::secrets::to_host(t, &e.ctx))
            .flatten()
    }
}

/// The two caches of one kind.
pub struct Side<K: Resource<DynamicType = ()> + 'static> {
    pub engine: Arc<Engine>,
    pub tenant: Store<K>,
    pub host: Store<K>,
}

fn host_api<K: Synced>(e: &Engine, host_ns: &str) -> Api<K> {
    Api::namespaced(e.host.clone(), host_ns)
}

pub(crate) fn kube_err(context: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { context, source }
}

/// Creates `desired` on the host; if the name is taken, applies only when the holder is ours.
pub async fn create_or_adopt<K: Synced>(e: &Engine, tenant: &K, desired: &K) -> Result<()> {
    let ns = desired.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api: Api<K> = host_api(e, &ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, desired).await {
        Ok(_) => {
            tracing::debug!(kind = K::kind(&()).as_ref(), ns = %ns, name = %name, "created on host");
            Ok(())
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => {
            let current = api
                .get(&name)
                .await
                .map_err(kube_err(format!("get host {ns}/{name}")))?;
            match HostSide::of(e.key(), current.labels(), current.annotations()) {
                HostSide::Ours { .. } => apply(e, desired).await,
                _ => {
                    tracing::warn!(ns = %ns, name = %name, "host object exists and is not ours; leaving it alone");
                    e.report(
                        tenant,
                        "HostConflict",
                        format!("the host already has {ns}/{name}, not managed by this tenant; it was left untouched"),
                    )
                    .await;
                    Ok(())
                }
            }
        }
        Err(err) => Err(kube_err(format!("create host {ns}/{name}"))(err)),
    }
}

/// Server-side apply of `desired` (only on host objects known to be ours).
pub async fn apply<K: Synced>(e: &Engine, desired: &K) -> Result<()> {
    let ns = desired.namespace().unwrap_or_default();
    let name = desired.name_any();
    host_api::<K>(e, &ns)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(kube_err(format!("apply host {ns}/{name}")))?;
    Ok(())
}

/// Deletes a host object if it still has `uid`; gone already is fine.
pub async fn delete_host<K: Synced>(e: &Engine, obj: &K, grace: Option<i64>) -> Result<()> {
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let dp = DeleteParams {
        grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
        preconditions: Some(Preconditions {
            uid: obj.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match host_api::<K>(e, &ns).delete(&name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 409 => Ok(()),
        Err(err) => Err(kube_err(format!("delete host {ns}/{name}"))(err)),
    }
}

/// The host object for a desired one, from the host cache.
pub fn cached_host<K: Synced>(side: &Side<K>, desired: &K) -> Option<Arc<K>> {
    side.host
        .get(&ObjectRef::new(&desired.name_any()).within(&desired.namespace().unwrap_or_default()))
}

/// Down-reconcile of a plain kind (ConfigMap, Secret, Endpoints).
pub(crate) async fn down<K: Synced>(t: Arc<K>, side: Arc<Side<K>>) -> Result<Action> {
    let e = &side.engine;
    let Some(desired) = K::to_host(&t, e) else {
        return Ok(Action::await_change());
    };
    let host = cached_host(&side, &desired);
    let host_side = host.as_ref().map_or(HostSide::Absent, |h| {
        HostSide::of(e.key(), h.labels(), h.annotations())
    });
    match decide(
        t.uid().as_deref(),
        t.meta().deletion_timestamp.is_none(),
        &host_side,
    ) {
        Decision::Create => create_or_adopt(e, t.as_ref(), &desired).await?,
        Decision::Update => apply(e, &desired).await?,
        Decision::Replace => {
            if let Some(h) = &host {
                delete_host(e, h.as_ref(), None).await?;
            }
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Delete | Decision::Conflict | Decision::Nothing => {}
    }
    Ok(Action::requeue(e.resync))
}

/// GC of a host object whose tenant object is gone. Generic over every synced kind.
pub async fn gc<K: Synced>(h: Arc<K>, side: Arc<Side<K>>) -> Result<Action> {
    let e = &side.engine;
    let Some(r) = naming::tenant_ref(e.key(), h.labels(), h.annotations()) else {
        return Ok(Action::await_change());
    };
    let Some(ns) = r.namespace.as_deref() else {
        return Ok(Action::await_change());
    };
    // Markers say which tenant namespace an object came from; it must sit in that
    // namespace's host namespace, or the markers were copied or forged onto it elsewhere.
    if h.namespace().as_deref() != Some(naming::host_namespace(e.key(), ns).as_str()) {
        return Ok(Action::await_change());
    }
    let tenant = side.tenant.get(&ObjectRef::new(&r.name).within(ns));
    let wanted = tenant
        .as_ref()
        .is_some_and(|t| r.uid.is_none() || t.uid() == r.uid);
    // A cache may lag the controller that just created this host object: confirm with the
    // tenant apiserver before deleting anything.
    if !wanted && tenant_still_has::<K>(e, ns, &r.name, r.uid.as_deref()).await? {
        return Ok(Action::requeue(e.resync));
    }
    if !wanted {
        // Only in host namespaces this syncer made: a namespace someone else created under a
        // name that happens to start with our key is theirs, whatever its objects say.
        if !host_namespace_is_ours(e, &naming::host_namespace(e.key(), ns)).await? {
            tracing::warn!(kind = K::kind(&()).as_ref(), ns = %ns, name = %r.name, "host object with this tenant's markers in a namespace the syncer does not own; left alone");
            return Ok(Action::await_change());
        }
        tracing::info!(kind = K::kind(&()).as_ref(), ns = %ns, name = %r.name, "tenant object gone; deleting host object");
        delete_host(e, h.as_ref(), None).await?;
    }
    Ok(Action::requeue(e.resync))
}

/// Whether the host namespace carries this tenant's label (the syncer created it). Asked of
/// the apiserver, and only before a deletion, so it costs nothing in steady state.
async fn host_namespace_is_ours(e: &Engine, host_ns: &str) -> Result<bool> {
    let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(e.host.clone())
        .get_opt(host_ns)
        .await
        .map_err(kube_err(format!("get host namespace {host_ns}")))?;
    Ok(ns.is_some_and(|n| naming::owned_by(e.key(), n.labels())))
}

/// Whether the tenant apiserver (not a cache) still has the object, with `uid` if given.
pub async fn tenant_still_has<K: Synced>(
    e: &Engine,
    ns: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<bool> {
    let found = Api::<K>::namespaced(e.tenant.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get tenant {ns}/{name}")))?;
    Ok(found.is_some_and(|t| uid.is_none() || t.uid().as_deref() == uid))
}

fn backoff<K>(_: Arc<K>, err: &Error, side: Arc<Side<K>>) -> Action
where
    K: Resource<DynamicType = ()> + 'static,
{
    let kind = K::kind(&());
    tracing::warn!(kind = kind.as_ref(), error = %err, "sync failed; retrying");
    side.engine.metrics.error(&kind, err);
    Action::requeue(Duration::from_secs(2))
}

/// Whether a cache holds its first complete list. Never waits: a reconcile waiting for a
/// cache holds a worker slot, and once every slot is held the controller stops polling its
/// trigger streams, among them the one that fills that cache. A restart with more host objects
/// than workers deadlocked that way (the crash test found it); requeueing frees the slot.
pub fn cache_ready<K: Resource + Clone + 'static>(store: &Store<K>) -> bool
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    use futures::FutureExt;
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// Maps a host object to the tenant object it came from (for re-triggering down-reconciles).
pub fn to_tenant_ref<K: Resource<DynamicType = ()>>(
    key: &TenantKey,
    h: &K,
) -> Option<ObjectRef<K>> {
    let r = naming::tenant_ref(key, h.labels(), h.annotations())?;
    Some(ObjectRef::new(&r.name).within(r.namespace.as_deref()?))
}

/// The label selector of this tenant's host objects.
pub fn host_selector(key: &TenantKey) -> watcher::Config {
    watcher::Config::default().labels(&format!("{}={key}", naming::LABEL_TENANT))
}

impl Synced for k8s_openapi::api::core::v1::Service {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        // The tenant apiserver's own Service: it points at the tenant apiserver, not at pods.
        if resources::services::is_apiserver_service(t) {
            return None;
        }
        Some(resources::services::to_host(t, &e.ctx, true))
    }
}

impl Synced for k8s_openapi::api::core::v1::PersistentVolumeClaim {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        // The claim's volume does not matter here (only its name and namespace are read).
        Some(resources::pvcs::to_host(t, &e.ctx, None))
    }
}

impl Synced for k8s_openapi::api::core::v1::Pod {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        Some(resources::pods::to_host(t, &e.ctx, &e.pod_env))
    }
}

/// A down-reconciler.
pub type DownFn<K> =
    fn(Arc<K>, Arc<Side<K>>) -> futures::future::BoxFuture<'static, Result<Action>>;

/// Runs the plain down-reconciler for `K` (ConfigMaps, Secrets).
pub async fn run_plain<K: Synced>(engine: Arc<Engine>, workers: u16) {
    run_kind::<K>(engine, workers, |t, s| Box::pin(down(t, s)), |_| {}).await
}

/// Runs down and gc controllers for a kind until the future is dropped. `with_tenant_store`
/// receives the tenant cache (pods hand it to the virtual-node upkeep).
pub async fn run_kind<K: Synced>(
    engine: Arc<Engine>,
    workers: u16,
    down: DownFn<K>,
    with_tenant_store: impl FnOnce(Store<K>),
) {
    let tenant_api: Api<K> = Api::all(engine.tenant.clone());
    let host_api: Api<K> = Api::all(engine.host.clone());
    let key = engine.key().clone();
    // Each controller is triggered by the stream that fills the cache it reads: the reflector
    // stores an object before passing it on, so no reconcile sees a cache older than its trigger.
    let (host_reader, host_writer) = kube::runtime::reflector::store();
    // Managed fields are never read here and are a large part of every cached object.
    let host_stream = watcher(host_api.clone(), K::host_watch(&key))
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(host_writer)
        .touched_objects();
    let down_ctl = Controller::new(tenant_api.clone(), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(workers));
    let tenant_reader = down_ctl.store();
    with_tenant_store(tenant_reader.clone());
    let k2 = key.clone();
    let side = Arc::new(Side {
        engine: engine.clone(),
        tenant: tenant_reader,
        host: host_reader,
    });
    let kind = K::kind(&()).to_string();
    let down_fut = down_ctl
        .watches_stream(host_stream, move |h: K| to_tenant_ref(&k2, &h))
        .run(
            move |t, s: Arc<Side<K>>| {
                let kind = kind.clone();
                async move {
                    let e = s.engine.clone();
                    e.metrics
                        .timed(&kind, Direction::Down, true, down(t, s))
                        .await
                }
            },
            backoff,
            side,
        )
        .for_each(|_| async {});

    // GC has its own view of the tenant, fed the same way; deletions trigger it at once.
    let (gc_tenant_reader, gc_tenant_writer) = kube::runtime::reflector::store();
    let k3 = key.clone();
    let tenant_stream = watcher(tenant_api, watcher::Config::default())
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(gc_tenant_writer)
        .touched_objects();
    let gc_ctl = Controller::new(host_api, K::host_watch(&key))
        .with_config(kube::runtime::controller::Config::default().concurrency(workers));
    let gc_side = Arc::new(Side {
        engine: engine.clone(),
        tenant: gc_tenant_reader.clone(),
        host: gc_ctl.store(),
    });
    let gc_fut = async move {
        let mapped = gc_ctl.watches_stream(tenant_stream, move |t: K| {
            Some(
                ObjectRef::new(&t.name_any()).within(&naming::host_namespace(&k3, &t.namespace()?)),
            )
        });
        // Deleting needs a complete picture of the tenant.
        let ready = gc_tenant_reader.clone();
        let run = mapped.run(
            move |h, s: Arc<Side<K>>| {
                let ready = ready.clone();
                async move {
                    if !cache_ready(&ready) {
                        return Ok(Action::requeue(Duration::from_secs(1)));
                    }
                    let e = s.engine.clone();
                    let kind = K::kind(&());
                    e.metrics
                        .timed(&kind, Direction::Down, true, gc(h, s))
                        .await
                }
            },
            backoff,
            gc_side,
        );
        run.for_each(|_| async {}).await;
    };
    futures::join!(down_fut, gc_fut);
}
