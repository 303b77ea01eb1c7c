//! The generic sync loop: kube-runtime controllers on both sides of every kind. What is
//! particular to a kind (its translation, its own down-reconcile) is in [`crate::kinds`]; what
//! is here serves them all: the [`Engine`] they share, the [`Synced`] trait a kind implements,
//! the decision table ([`mod@decide`]), the shared caches ([`shared`], [`fanin`]), the writes every
//! kind makes ([`create_or_adopt`], [`apply`], [`delete_exact`]), the error policy
//! (`backoff`), and the tenant-wide quota across kinds ([`quota`]).
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
//! Both read the same two caches: one watch per kind and side ([`shared`]), with managed
//! fields stripped, feeds every controller that needs it.
//!
//! Both requeue periodically: that is the full resync that repairs drift, and since all state
//! lives in the two apiservers, a restarted syncer converges from scratch. Pods add status up,
//! binding to virtual nodes and two-way graceful deletion ([`crate::kinds::pods`]).

pub mod backstop;
pub mod by_namespace;
pub mod decide;
pub mod echo;
pub mod fanin;
pub mod ownership;
pub mod quota;
pub mod shared;
#[cfg(test)]
pub(crate) mod testing;

use crate::metrics::Direction;
use crate::tenant::{Ctx, PodEnv};
use crate::{Error, Result, kube_err};
use decide::{Decision, HostSide, decide};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use shared::{Cache, Shared};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::naming::{self, TenantKey};

/// Field manager of every write the syncer makes.
pub const FIELD_MANAGER: &str = "vcp-syncer";

/// Default period of the full resync (`--resync-seconds`).
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// Everything reconcilers share.
pub struct Engine {
    pub tenant: Client,
    pub host: Client,
    pub ctx: Ctx,
    pub pod_env: PodEnv,
    pub recorder: Recorder,
    /// Sync latencies, reconciles in flight and errors, served on `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Period of the full resync: every reconcile requeues after it.
    pub resync: Duration,
    /// Sync every ConfigMap and Secret, not only those tenant pods reference.
    pub sync_all_configmaps_secrets: bool,
    /// The tenant pod cache, once the pod controller runs (for reference checks).
    pub tenant_pods: std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::Pod>>,
    /// The tenant pods' names by namespace (fed by the tenant pod watch).
    pub tenant_pods_by_ns: by_namespace::ByNamespace,
    /// The tenant Service cache, once the Service controller runs (service links, endpoints).
    pub tenant_services: std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::Service>>,
    /// The tenant Services' names by namespace (fed by their tenant watch): a pod's service
    /// links read its namespace's, not every Service of the tenant.
    pub tenant_services_by_ns: by_namespace::ByNamespace,
    /// The tenant claim cache, once the claim controller runs (the quota counts claims).
    pub tenant_claims:
        std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::PersistentVolumeClaim>>,
    /// The tenant namespace cache, once the namespace controllers run (the quota counts
    /// namespaces, and objects in a refused one wait).
    pub tenant_namespaces: std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::Namespace>>,
    /// The tenant-wide quota's running ledger, fed by the watches (see [`quota`]).
    pub ledger: std::sync::Mutex<vcp_policy::quota::Ledger>,
    /// Warnings already told, by object UID and reason: the note last told (see
    /// [`Engine::report_once`]).
    pub told: std::sync::Mutex<std::collections::HashMap<(String, String), String>>,
    /// This tenant's host pods, once the pod controllers run (Events up find their pod here).
    pub host_pods: std::sync::OnceLock<Cache<vcp_core::host_pod::HostPod>>,
    /// The tenant's pods by address, kept by the host pod watch one event at a time (what
    /// hand-written endpoints may name, see [`crate::kinds::endpoints`]).
    pub pod_index: std::sync::RwLock<vcp_policy::endpoints::TenantPodIndex>,
    /// This tenant's host Secrets (copies and the pods' generated token Secrets, all carrying
    /// the tenant label), once the Secret controllers run: a pod's pass reads its token Secret
    /// here instead of asking the host.
    pub host_secrets: std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::Secret>>,
    /// This tenant's host ConfigMaps (copies and the pods' generated trust-bundle ConfigMaps,
    /// all carrying the tenant label), once the ConfigMap controllers run: a pod's pass reads
    /// its trust-bundle ConfigMap here instead of asking the host.
    pub host_configmaps: std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::ConfigMap>>,
    /// This tenant's host namespaces, once the namespace controllers run.
    pub host_namespaces: std::sync::OnceLock<Cache<k8s_openapi::api::core::v1::Namespace>>,
    /// The tenant's NetworkPolicies, once their controller runs (isolation labels of pods).
    pub tenant_netpols: std::sync::OnceLock<Cache<k8s_openapi::api::networking::v1::NetworkPolicy>>,
    /// The tenant NetworkPolicies' names by namespace (fed by their tenant watch).
    pub tenant_netpols_by_ns: by_namespace::ByNamespace,
    /// The tenant's control-plane namespace on the host (`--host-namespace`), whose CoreDNS and
    /// apiserver the tenant's pods may reach.
    pub control_plane_namespace: Option<String>,
    /// This tenant's host namespaces, published by the namespace controllers once their host
    /// cache is listed: every host watch of a namespaced kind runs per namespace of this set
    /// (the syncer's credentials reach no other, see [`fanin`]).
    pub host_namespace_set: tokio::sync::watch::Sender<fanin::NamespaceSet>,
    /// The versions the syncer's own writes made, whose events trigger no down pass.
    pub echoes: echo::Echoes,
}

impl Engine {
    pub fn new(
        tenant: Client,
        host: Client,
        key: TenantKey,
        policy: vcp_policy::TenantPolicy,
        pod_env: PodEnv,
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
            ledger: std::sync::Mutex::new(vcp_policy::quota::Ledger::new(&policy.quota)),
            ctx: Ctx {
                key,
                policy: Arc::new(policy),
            },
            pod_env,
            recorder,
            metrics: crate::metrics::Metrics::new(),
            resync: DEFAULT_RESYNC,
            sync_all_configmaps_secrets: false,
            tenant_pods: std::sync::OnceLock::new(),
            tenant_pods_by_ns: Default::default(),
            tenant_services: std::sync::OnceLock::new(),
            tenant_services_by_ns: Default::default(),
            tenant_claims: std::sync::OnceLock::new(),
            tenant_namespaces: std::sync::OnceLock::new(),
            told: Default::default(),
            host_pods: std::sync::OnceLock::new(),
            pod_index: Default::default(),
            host_secrets: std::sync::OnceLock::new(),
            host_configmaps: std::sync::OnceLock::new(),
            host_namespaces: std::sync::OnceLock::new(),
            tenant_netpols: std::sync::OnceLock::new(),
            tenant_netpols_by_ns: Default::default(),
            control_plane_namespace: None,
            host_namespace_set: tokio::sync::watch::channel(None).0,
            echoes: Default::default(),
        }
    }

    pub fn key(&self) -> &TenantKey {
        &self.ctx.key
    }

    /// Reports on a tenant object (what the tenant's `kubectl describe` shows).
    /// [`Engine::report`], unless this very note was the last one told of `obj` under
    /// `reason`: a condition that holds on every pass (a pod waiting for quota, a readiness
    /// gate the syncer leaves alone) is told once, and again only when what it says changes.
    /// Remembered in memory only: a restarted syncer tells again, which costs one event.
    pub async fn report_once<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        note: String,
    ) {
        if self.first_telling(obj.meta().uid.as_deref().unwrap_or_default(), reason, &note) {
            self.report(obj, reason, note).await;
        }
    }

    /// Whether `note` under `reason` is new for object `uid` (and remembers it if so).
    pub fn first_telling(&self, uid: &str, reason: &str, note: &str) -> bool {
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        let key = (uid.to_owned(), reason.to_owned());
        if told.get(&key).is_some_and(|n| n == note) {
            return false;
        }
        // Bounded: it only saves repeated events.
        if told.len() >= 10_000 {
            told.clear();
        }
        told.insert(key, note.to_owned());
        true
    }

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

/// A host object as a watch decodes and a cache holds it: any namespaced resource.
pub trait HostObject:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<H> HostObject for H where
    H: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
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
    /// What this kind keeps of its own beside the engine (pods: tokens, virtual nodes, their
    /// writes up; ConfigMaps and Secrets read the pods' references), handed to its reconciles
    /// in [`Side::own`]. The engine never looks inside.
    type Own: Send + Sync + 'static;

    /// The host object as the host cache keeps it: the kind itself, or a narrower type read
    /// from the same API path (pods: [`vcp_core::host_pod::HostPod`], what the syncer reads of
    /// a host pod). Writes are always of the full kind.
    type Host: HostObject;

    /// The desired host object, or `None` if this tenant object is not synced.
    fn to_host(tenant: &Self, engine: &Engine, own: &Self::Own) -> Option<Self>;

    /// Lets state kept beside the caches follow this kind's watches (the quota's ledger, for
    /// the kinds it counts); nothing by default.
    fn observe(
        _engine: &Arc<Engine>,
        _own: &Arc<Self::Own>,
        _tenant: &mut Shared<Self>,
        _host: &mut Shared<Self::Host>,
    ) {
    }

    /// Which host objects of this kind the engine watches: this tenant's, by label.
    fn host_watch(key: &TenantKey) -> watcher::Config {
        host_selector(key)
    }

    /// Whether host object `host` already is `desired`, so an update would write nothing new.
    /// By default never known: every pass applies (cheap for kinds reconciled only on change
    /// and on resync).
    fn unchanged(_desired: &Self, _host: &Self::Host) -> bool {
        false
    }

    /// Whether the down pass skips the events of the syncer's own writes to this kind
    /// ([`echo`]): its host creates, and what the kind records itself (a pod's status). True
    /// only for a kind whose pass has nothing to learn from the host's answer to its own
    /// create. Off by default: a kind that copies what the host filled in (a Service's
    /// address) learns it from that event; and its events then cost no look at the echoes.
    const SKIPS_OWN_ECHOES: bool = false;
}

/// The two caches of one kind.
pub struct Side<K: Synced> {
    pub engine: Arc<Engine>,
    /// The kind's own state (see [`Synced::Own`]).
    pub own: Arc<K::Own>,
    pub tenant: Cache<K>,
    pub host: Cache<K::Host>,
}

fn host_api<K: HostObject>(e: &Engine, host_ns: &str) -> Api<K> {
    Api::namespaced(e.host.clone(), host_ns)
}

/// What [`create_or_adopt`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// The host object is ours and as desired (created, or adopted and applied).
    Ours,
    /// Someone else holds the name on the host: nothing was written, the tenant was told.
    Conflict,
}

/// Creates `desired` on the host; if the name is taken, applies only when the holder is ours.
pub async fn create_or_adopt<K: Synced>(e: &Engine, tenant: &K, desired: &K) -> Result<Placed> {
    let ns = desired.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api: Api<K> = host_api(e, &ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let write = K::SKIPS_OWN_ECHOES.then(|| e.echoes.begin(echo::Side::Host, &ns, &name));
    match api.create(&pp, desired).await {
        Ok(created) => {
            if let Some(w) = &write {
                w.made_obj(&created);
            }
            tracing::debug!(kind = K::kind(&()).as_ref(), ns = %ns, name = %name, "created on host");
            Ok(Placed::Ours)
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => {
            let current = api
                .get(&name)
                .await
                .map_err(kube_err(format!("get host {ns}/{name}")))?;
            match HostSide::of(e.key(), Some(&current)) {
                HostSide::Ours { .. } => apply(e, desired).await.map(|()| Placed::Ours),
                _ => {
                    tracing::warn!(ns = %ns, name = %name, "host object exists and is not ours; leaving it alone");
                    e.report(
                        tenant,
                        "HostConflict",
                        format!("the host already has {ns}/{name}, not managed by this tenant; it was left untouched"),
                    )
                    .await;
                    Ok(Placed::Conflict)
                }
            }
        }
        Err(err) => Err(kube_err(format!("create host {ns}/{name}"))(err)),
    }
}

/// Server-side apply of `desired` (only on host objects known to be ours). An object still
/// carrying its create's `Update` entry has it handed over to the apply entry first, once,
/// and is applied again, so what `desired` leaves out is removed ([`ownership`]).
pub async fn apply<K: Synced>(e: &Engine, desired: &K) -> Result<()> {
    let ns = desired.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api = host_api::<K>(e, &ns);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api
        .patch(&name, &pp, &Patch::Apply(desired))
        .await
        .map_err(kube_err(format!("apply host {ns}/{name}")))?;
    let Some(handover) = ownership::handover(applied.managed_fields(), FIELD_MANAGER) else {
        return Ok(());
    };
    let handover: json_patch::Patch = serde_json::from_value(handover).map_err(|err| {
        kube_err(format!("hand over fields of host {ns}/{name}"))(kube::Error::SerdeError(err))
    })?;
    let patched = api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(handover))
        .await;
    match patched {
        Ok(_) => {}
        // Someone wrote in between (a failed test): the next apply tries again.
        Err(kube::Error::Api(ae)) if ae.code == 422 || ae.code == 409 => return Ok(()),
        Err(err) => {
            return Err(kube_err(format!("hand over fields of host {ns}/{name}"))(
                err,
            ));
        }
    }
    api.patch(&name, &pp, &Patch::Apply(desired))
        .await
        .map_err(kube_err(format!("apply host {ns}/{name}")))?;
    Ok(())
}

/// Deletes host object `obj` of a synced kind (see [`delete_exact`]).
pub async fn delete_host<H: HostObject>(e: &Engine, obj: &H, grace: Option<i64>) -> Result<()> {
    let ns = obj.namespace().unwrap_or_default();
    delete_exact(&host_api::<H>(e, &ns), obj, grace, "host").await
}

/// Deletes `obj` through `api` (either side, any scope) only if the object of its name still
/// has its UID, with `grace` seconds to stop if given: gone already (404) or replaced by a new
/// object of that name (409, the precondition failed) leaves nothing of `obj` to delete. `what`
/// names the object in errors (`host`, `tenant pod`).
pub async fn delete_exact<K>(api: &Api<K>, obj: &K, grace: Option<i64>, what: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = obj.name_any();
    let dp = DeleteParams {
        grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
        preconditions: Some(Preconditions {
            uid: obj.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 409 => Ok(()),
        Err(err) => {
            let path = obj
                .namespace()
                .map_or(name.clone(), |ns| format!("{ns}/{name}"));
            Err(kube_err(format!("delete {what} {path}"))(err))
        }
    }
}

/// The host object for a desired one, from the host cache.
pub fn cached_host<K: Synced>(side: &Side<K>, desired: &K) -> Option<Arc<K::Host>> {
    side.host
        .get(&ObjectRef::new(&desired.name_any()).within(&desired.namespace().unwrap_or_default()))
}

/// Down-reconcile of a plain kind (ConfigMap, Secret).
#[tracing::instrument(skip_all, fields(kind = K::kind(&()).as_ref(), namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub(crate) async fn down<K: Synced>(t: Arc<K>, side: Arc<Side<K>>) -> Result<Action> {
    let Some(desired) = K::to_host(&t, &side.engine, &side.own) else {
        return Ok(Action::await_change());
    };
    down_to(t, side, desired).await
}

/// Down-reconcile of tenant object `t` towards host object `desired` (computed by the caller:
/// Endpoints and EndpointSlices need the host pods and report what they drop).
pub(crate) async fn down_to<K: Synced>(
    t: Arc<K>,
    side: Arc<Side<K>>,
    desired: K,
) -> Result<Action> {
    let e = &side.engine;
    let host_side = HostSide::of(e.key(), cached_host(&side, &desired));
    match decide(
        t.uid().as_deref(),
        t.meta().deletion_timestamp.is_none(),
        host_side,
    ) {
        Decision::Create => {
            // A namespace the quota keeps off the host has no host namespace to create in.
            match quota::namespace_waits(e, &t.namespace().unwrap_or_default()) {
                None => return Ok(Action::requeue(quota::not_ready())),
                Some(true) => return Ok(Action::requeue(quota::retry(e))),
                Some(false) => {}
            }
            create_or_adopt(e, t.as_ref(), &desired).await?;
        }
        Decision::Update(h) => {
            if !K::unchanged(&desired, &h) {
                apply(e, &desired).await?;
            }
        }
        Decision::Replace(h) => {
            delete_host(e, h.as_ref(), None).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Delete(_) | Decision::Conflict(_) | Decision::Nothing => {}
    }
    Ok(Action::requeue(e.resync))
}

/// GC of a host object whose tenant object is gone. Generic over every synced kind.
#[tracing::instrument(skip_all, fields(kind = K::kind(&()).as_ref(), namespace = h.namespace().as_deref(), name = %h.name_any()))]
pub async fn gc<K: Synced>(h: Arc<K::Host>, side: Arc<Side<K>>) -> Result<Action> {
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
    // The syncer itself is recreating the tenant object (a Service taking the host's
    // ClusterIP): the new one adopts this host object.
    if !wanted && naming::recreating(h.annotations(), k8s_openapi::jiff::Timestamp::now()) {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    if !wanted {
        // Only in host namespaces this syncer made: a namespace someone else created under a
        // name that happens to start with our key is theirs, whatever its objects say.
        if !host_namespace_is_ours(e, &naming::host_namespace(e.key(), ns)).await? {
            tracing::warn!(kind = K::kind(&()).as_ref(), ns = %ns, name = %r.name, "host object with this tenant's markers in a namespace the syncer does not own; left alone");
            return Ok(Action::await_change());
        }
        // The cache's copy may be behind the host: a mark set just now, or the object adopted
        // by the tenant object that replaced its own. Deleted only as it was decided on.
        let host_ns = h.namespace().unwrap_or_default();
        let fresh = host_api::<K::Host>(e, &host_ns)
            .get_opt(&h.name_any())
            .await
            .map_err(kube_err(format!("get host {host_ns}/{}", h.name_any())))?;
        let Some(fresh) = fresh else {
            return Ok(Action::await_change());
        };
        if fresh.resource_version() != h.resource_version() {
            return Ok(Action::requeue(Duration::from_secs(1)));
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

/// The error policy of every controller: log the error with its causes, count it by kind and
/// variant, and try again in 2 s.
pub(crate) fn backoff<K, C>(_: Arc<K>, err: &Error, cx: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    C: AsRef<Engine>,
{
    let kind = K::kind(&());
    tracing::warn!(kind = kind.as_ref(), error = %crate::chain(err), "sync failed; retrying");
    (*cx).as_ref().metrics.error(&kind, err);
    Action::requeue(Duration::from_secs(2))
}

impl AsRef<Engine> for Engine {
    fn as_ref(&self) -> &Engine {
        self
    }
}

impl<K: Synced> AsRef<Engine> for Side<K> {
    fn as_ref(&self) -> &Engine {
        &self.engine
    }
}

/// Whether a cache holds its first complete list. Never waits: a reconcile waiting for a
/// cache holds a worker slot, and once every slot is held the controller stops polling its
/// trigger streams, among them the one that fills that cache. A restart with more host objects
/// than workers deadlocked that way (the crash test found it); requeueing frees the slot.
pub fn cache_ready<K: Resource<DynamicType = ()> + Clone + 'static>(cache: &Cache<K>) -> bool {
    cache.is_ready()
}

/// Host object `ns/name` from `cache` (a host cache a controller published), once it has
/// listed; asked of the host on a miss. Such caches hold only objects with this tenant's label,
/// so a miss (not written yet, written a moment ago, or someone else's) is worth a GET: a
/// pass reads the host only until the object exists.
pub async fn cached_or_get<K>(
    e: &Engine,
    cache: &std::sync::OnceLock<Cache<K>>,
    ns: &str,
    name: &str,
) -> Result<Option<Arc<K>>>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + 'static,
{
    let hit = cache
        .get()
        .filter(|c| cache_ready(c))
        .and_then(|c| c.get(&ObjectRef::new(name).within(ns)));
    if hit.is_some() {
        return Ok(hit);
    }
    let kind = K::kind(&()).to_lowercase();
    Ok(Api::<K>::namespaced(e.host.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get host {kind} {ns}/{name}")))?
        .map(Arc::new))
}

/// Waits until a cache that a controller publishes once it starts holds its first list.
pub async fn wait_for_cache<K>(cache: &std::sync::OnceLock<Cache<K>>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    loop {
        if let Some(cache) = cache.get() {
            cache.ready().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Maps a host object to the tenant object it came from (for re-triggering down-reconciles).
pub fn to_tenant_ref<K: Resource<DynamicType = ()>, H: Resource>(
    key: &TenantKey,
    h: &H,
) -> Option<ObjectRef<K>> {
    let r = naming::tenant_ref(key, h.labels(), h.annotations())?;
    Some(ObjectRef::new(&r.name).within(r.namespace.as_deref()?))
}

/// The label selector of this tenant's host objects.
pub fn host_selector(key: &TenantKey) -> watcher::Config {
    watcher::Config::default().labels(&format!("{}={key}", naming::LABEL_TENANT))
}

/// A down-reconciler.
pub type DownFn<K> =
    fn(Arc<K>, Arc<Side<K>>) -> futures::future::BoxFuture<'static, Result<Action>>;

/// Runs the plain down-reconciler for `K` (ConfigMaps, Secrets).
pub async fn run_plain<K: Synced>(engine: Arc<Engine>, own: Arc<K::Own>, workers: u16) {
    run_kind::<K>(engine, own, workers, |t, s| Box::pin(down(t, s)), |_, _| {}).await
}

/// Runs down and gc controllers for a kind until the future is dropped. `with_stores`
/// receives the tenant and the host cache (pods hand them to the virtual-node upkeep and to
/// Events up).
pub async fn run_kind<K: Synced>(
    engine: Arc<Engine>,
    own: Arc<K::Own>,
    workers: u16,
    down: DownFn<K>,
    with_stores: impl FnOnce(Cache<K>, Cache<K::Host>),
) {
    run_kind_on(
        engine,
        own,
        workers,
        down,
        with_stores,
        futures::stream::pending(),
    )
    .await
}

/// [`run_kind`], and every tenant object of the kind is reconciled again whenever `again`
/// yields (Endpoints and EndpointSlices when the tenant's pod addresses change).
pub async fn run_kind_on<K: Synced>(
    engine: Arc<Engine>,
    own: Arc<K::Own>,
    workers: u16,
    down: DownFn<K>,
    with_stores: impl FnOnce(Cache<K>, Cache<K::Host>),
    again: impl futures::Stream<Item = ()> + Send + 'static,
) {
    let key = engine.key().clone();
    // One watch and one cache per side, read by both controllers; each controller is
    // triggered by the streams that fill the caches it reads (see `shared`), so no reconcile
    // sees a cache older than its trigger.
    let mut tenant = Shared::<K>::new();
    let mut host = Shared::<K::Host>::new();
    K::observe(&engine, &own, &mut tenant, &mut host);
    if K::SKIPS_OWN_ECHOES {
        let e = engine.clone();
        tenant.observe(Box::new(move |o: &K, present| {
            if !present {
                e.echoes.forget(echo::Side::Tenant, o);
            }
        }));
        let e = engine.clone();
        host.observe(Box::new(move |o: &K::Host, present| {
            if !present {
                e.echoes.forget(echo::Side::Host, o);
            }
        }));
    }
    with_stores(tenant.cache(), host.cache());
    let side = Arc::new(Side {
        engine: engine.clone(),
        own,
        tenant: tenant.cache(),
        host: host.cache(),
    });
    let config = kube::runtime::controller::Config::default().concurrency(workers);

    let k2 = key.clone();
    let kind = K::kind(&()).to_string();
    // The syncer's own writes come back as events; each was decided by the pass that wrote
    // it, so it triggers nothing (see `echo`). The caches take every event all the same.
    let down_fut = Controller::for_shared_stream(
        tenant
            .subscribe()
            .filter(not_echo::<K, K>(engine.clone(), echo::Side::Tenant)),
        tenant.store(),
    )
    .with_config(config.clone())
    .watches_shared_stream(
        host.subscribe()
            .filter(not_echo::<K, K::Host>(engine.clone(), echo::Side::Host)),
        move |h: Arc<K::Host>| to_tenant_ref::<K, _>(&k2, h.as_ref()),
    )
    .reconcile_all_on(again)
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
        side.clone(),
    )
    .for_each(|_| async {});

    // GC: triggered by host objects and, so deletions act at once, by tenant ones.
    let k3 = key.clone();
    let ready = tenant.cache();
    let tenant_cache = tenant.store();
    let mut seen = GcSeen::default();
    let host_cache = host.store();
    let gc_triggers = host
        .subscribe()
        .filter(move |h| futures::future::ready(seen.changed(&host_cache, h.as_ref())));
    let gc_fut = Controller::for_shared_stream(gc_triggers, host.store())
        .with_config(config)
        .watches_shared_stream(tenant.subscribe(), move |t: Arc<K>| {
            gc_trigger(&k3, &tenant_cache, t.as_ref())
        })
        .run(
            move |h, s: Arc<Side<K>>| {
                let ready = ready.clone();
                async move {
                    // Deleting needs a complete picture of the tenant.
                    if !ready.is_ready() {
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
            side,
        )
        .for_each(|_| async {});

    let tenant_api: Api<K> = Api::all(engine.tenant.clone());
    futures::join!(
        spawned(tenant.run(tenant_api, watcher::Config::default())),
        spawned(host.run_in_namespaces(
            engine.host.clone(),
            K::host_watch(&key),
            engine.host_namespace_set.subscribe()
        )),
        spawned(down_fut),
        spawned(gc_fut)
    );
}

/// Whether an event of object `o` (of kind `K`'s `side`) is not an echo of the syncer's own
/// write: kinds that record no echoes pass every event without a look.
fn not_echo<K: Synced, O: Resource + Send + Sync + 'static>(
    e: Arc<Engine>,
    side: echo::Side,
) -> impl FnMut(&Arc<O>) -> futures::future::BoxFuture<'static, bool> {
    move |o: &Arc<O>| {
        let (e, o) = (e.clone(), o.clone());
        Box::pin(async move { !K::SKIPS_OWN_ECHOES || !e.echoes.is_echo(side, o.as_ref()).await })
    }
}

/// The host object a touched tenant object asks gc to look at, if any. A tenant object the
/// cache still holds with the same UID leaves its host object wanted, so only deletions (and
/// recreations under the same name) give gc work, not every status change of every pod.
pub fn gc_trigger<K: Synced>(
    key: &TenantKey,
    tenant: &Store<K>,
    t: &K,
) -> Option<ObjectRef<K::Host>> {
    if tenant
        .get(&ObjectRef::from_obj(t))
        .is_some_and(|c| c.uid() == t.uid())
    {
        return None;
    }
    Some(ObjectRef::new(&t.name_any()).within(&naming::host_namespace(key, &t.namespace()?)))
}

/// What gc last saw of each host object, so it looks again only when its verdict can move.
///
/// gc decides from a host object's identity and markers (and its tenant object, whose changes
/// trigger gc through [`gc_trigger`]). A host pod changes status several times on its way to
/// Running, and each change used to cost a gc reconcile that found it wanted, as before. One
/// hash per host object; an object gone from the cache always passes and is forgotten.
#[derive(Default)]
pub struct GcSeen(std::collections::HashMap<String, u64>);

impl GcSeen {
    /// Whether `h`, just reflected in `cache`, is new to gc or changed in what gc reads.
    pub fn changed<K: Resource<DynamicType = ()> + Clone>(
        &mut self,
        cache: &Store<K>,
        h: &K,
    ) -> bool {
        use std::hash::{Hash, Hasher};
        let key = format!("{}/{}", h.namespace().unwrap_or_default(), h.name_any());
        if cache.get(&ObjectRef::from_obj(h)).is_none() {
            self.0.remove(&key);
            return true;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let m = h.meta();
        (
            &m.uid,
            &m.labels,
            &m.annotations,
            m.deletion_timestamp.is_some(),
        )
            .hash(&mut hasher);
        let hash = hasher.finish();
        self.0.insert(key, hash) != Some(hash)
    }
}

/// Runs `fut` on a task of its own, so watches and controllers spread over every core and one's
/// work (decoding a large list, say) does not hold up another's reconciles; a panic there
/// still ends the syncer, as it did when everything ran in one task.
pub async fn spawned<F>(fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Err(err) = tokio::spawn(fut).await
        && err.is_panic()
    {
        std::panic::resume_unwind(err.into_panic());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::listed_store as cache;

    #[tokio::test]
    async fn a_warning_is_told_once_per_object_reason_and_note() {
        let e = testing::offline_engine();
        let quota = "TenantQuotaExceeded";
        for (uid, reason, note, first, why) in [
            ("u1", quota, "pods: 3 of 3", true, "new"),
            ("u1", quota, "pods: 3 of 3", false, "told"),
            (
                "u1",
                "ReadinessGateNotMirrored",
                "gates",
                true,
                "another reason",
            ),
            ("u1", quota, "pods: 3 of 3", false, "kept apart"),
            ("u1", quota, "pods: 4 of 3", true, "what it says moved"),
            ("u2", quota, "pods: 4 of 3", true, "another object"),
        ] {
            assert_eq!(e.first_telling(uid, reason, note), first, "{why}");
        }
    }

    #[test]
    fn gc_hears_of_a_host_object_only_when_its_verdict_can_move() {
        use k8s_openapi::api::core::v1::Pod;
        let pod = |labels: serde_json::Value, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "vcp-t-a", "uid": "u1", "labels": labels},
                "status": {"phase": phase},
            }))
            .unwrap()
        };
        let marked = serde_json::json!({"vcp.dev/tenant": "t"});
        let listed: Store<Pod> =
            cache(&[serde_json::to_value(pod(marked.clone(), "Pending")).unwrap()]);
        let mut seen = GcSeen::default();
        assert!(
            seen.changed(&listed, &pod(marked.clone(), "Pending")),
            "new to gc"
        );
        assert!(
            !seen.changed(&listed, &pod(marked.clone(), "Running")),
            "status only"
        );
        assert!(
            seen.changed(&listed, &pod(serde_json::json!({}), "Running")),
            "markers moved"
        );
        let gone: Store<Pod> = cache(&[]);
        assert!(
            seen.changed(&gone, &pod(serde_json::json!({}), "Running")),
            "deleted"
        );
        assert!(
            seen.changed(&listed, &pod(serde_json::json!({}), "Running")),
            "and forgotten"
        );
    }

    #[test]
    fn gc_looks_at_host_objects_of_deleted_or_recreated_tenant_objects_only() {
        let key = TenantKey::new("demo").unwrap();
        let cm = |uid: &str| -> k8s_openapi::api::core::v1::ConfigMap {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "cfg", "namespace": "apps", "uid": uid}
            }))
            .unwrap()
        };
        let tenant = cache::<k8s_openapi::api::core::v1::ConfigMap>(&[serde_json::json!({
            "metadata": {"name": "cfg", "namespace": "apps", "uid": "u1"}
        })]);
        assert_eq!(
            gc_trigger(&key, &tenant, &cm("u1")),
            None,
            "alive: nothing to collect"
        );
        let host = Some(ObjectRef::new("cfg").within("demo-apps"));
        assert_eq!(gc_trigger(&key, &tenant, &cm("u0")), host, "replaced by u1");
        let empty = cache::<k8s_openapi::api::core::v1::ConfigMap>(&[]);
        assert_eq!(gc_trigger(&key, &empty, &cm("u1")), host, "deleted");
    }

    #[tokio::test]
    async fn down_and_gc_run_in_spans_naming_the_kind_and_object() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use testing::{fields, obj, offline_engine, side, span, spans_of};
        let e = offline_engine();
        let t = obj::<ConfigMap>(serde_json::json!({
            "metadata": {"name": "cfg", "namespace": "apps", "uid": "u1"}
        }));
        let spans = spans_of(down(t, side(&e))).await;
        assert_eq!(
            span(&spans, "down"),
            Some(&fields(&[
                ("kind", "ConfigMap"),
                ("namespace", "apps"),
                ("name", "cfg")
            ])),
            "{spans:?}"
        );
        let h = obj::<ConfigMap>(serde_json::json!({
            "metadata": {"name": "cfg", "namespace": "demo-apps"}
        }));
        let spans = spans_of(gc(h, side::<ConfigMap>(&e))).await;
        assert_eq!(
            span(&spans, "gc"),
            Some(&fields(&[
                ("kind", "ConfigMap"),
                ("namespace", "demo-apps"),
                ("name", "cfg")
            ])),
            "{spans:?}"
        );
    }
}
