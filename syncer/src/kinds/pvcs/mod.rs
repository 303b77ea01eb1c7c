//! PersistentVolumeClaims: down, and bound host volumes mirrored up (translation: [`translate`]).

pub mod translate;

use crate::engine::FIELD_MANAGER;
use crate::engine::decide::{Decision, HostSide, decide};
use crate::engine::quota;
use crate::engine::{Engine, Side, Synced, cached_host, create_or_adopt, delete_host};
use crate::kinds::volumes;
use crate::{Result, kube_err};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;
use std::time::Duration;
use translate::{MIRROR_LABEL, bound_volume, mirror_volume, to_host};
use vcp_core::naming::host_cluster_name;

/// Down-reconcile of a tenant claim.
#[tracing::instrument(skip_all, fields(kind = "PersistentVolumeClaim", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down(
    t: Arc<PersistentVolumeClaim>,
    side: Arc<Side<PersistentVolumeClaim>>,
) -> Result<Action> {
    let e = &side.engine;
    let mut desired = to_host(&t, &e.ctx, None);
    let host_side = HostSide::of(e.key(), cached_host(&side, &desired));
    match decide(
        t.uid().as_deref(),
        t.metadata.deletion_timestamp.is_none(),
        host_side,
    ) {
        Decision::Create => {
            let spec = t.spec.clone().unwrap_or_default();
            let refusals = vcp_policy::volumes::check_claim(&spec, &e.ctx.policy, "spec");
            if !refusals.is_empty() {
                e.report(t.as_ref(), "PolicyRefused", vcp_policy::summary(&refusals))
                    .await;
                return Ok(Action::requeue(e.resync));
            }
            let verdict = quota::admit_claim(e, &side, &t);
            if let Some(wait) = quota::hold(e, t.as_ref(), verdict).await {
                return Ok(wait);
            }
            let wanted = t.spec.as_ref().and_then(|s| s.volume_name.clone());
            if let Some(v) = wanted {
                match tenant_volume(e, &v).await? {
                    // Not there yet: the host claim must not bind to something else meanwhile.
                    None => return Ok(Action::requeue(Duration::from_secs(5))),
                    Some(pv) if volumes::translate::synced(&pv) => {
                        desired = to_host(&t, &e.ctx, Some(host_cluster_name(e.key(), &v)));
                    }
                    Some(_) => {} // a mirror of a host volume: the host claim binds on its own
                }
            }
            let created = create_or_adopt(e, t.as_ref(), &desired).await;
            if let Some(wait) = quota::hold(e, t.as_ref(), quota::host_verdict(&created)).await {
                return Ok(wait);
            }
            created?;
        }
        // Claim specs are immutable but for growing storage; nothing to apply.
        Decision::Update(h) => mirror(e, &t, &h).await?,
        Decision::Replace(h) => {
            delete_host(e, h.as_ref(), None).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Delete(_) | Decision::Conflict(_) | Decision::Nothing => {}
    }
    Ok(Action::requeue(e.resync))
}

async fn tenant_volume(e: &Engine, name: &str) -> Result<Option<PersistentVolume>> {
    Api::<PersistentVolume>::all(e.tenant.clone())
        .get_opt(name)
        .await
        .map_err(kube_err(format!("get tenant volume {name}")))
}

async fn mirror(e: &Engine, t: &PersistentVolumeClaim, h: &PersistentVolumeClaim) -> Result<()> {
    if t.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_ref())
        .is_some()
    {
        return Ok(());
    }
    let Some(pv) = bound_volume(h) else {
        return Ok(());
    };
    let host_pv = Api::<PersistentVolume>::all(e.host.clone())
        .get(pv)
        .await
        .map_err(kube_err(format!("get host volume {pv}")))?;
    let m = mirror_volume(&host_pv, t);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match Api::<PersistentVolume>::all(e.tenant.clone())
        .create(&pp, &m)
        .await
    {
        Ok(_) => {
            tracing::info!(volume = %pv, ns = ?t.namespace(), claim = %t.name_any(), "mirrored bound volume")
        }
        Err(kube::Error::Api(ae)) if ae.code == 409 => {}
        Err(err) => return Err(kube_err(format!("create tenant volume {pv}"))(err)),
    }
    Ok(())
}

/// Removes mirrored tenant volumes whose claim is gone, every `period`.
pub async fn mirrors(e: Arc<Engine>, claims: Store<PersistentVolumeClaim>, period: Duration) {
    let _ = claims.wait_until_ready().await;
    loop {
        if let Err(err) = mirrors_once(&e, &claims).await {
            tracing::warn!(error = %err, "volume mirror upkeep failed");
        }
        tokio::time::sleep(period).await;
    }
}

async fn mirrors_once(e: &Engine, claims: &Store<PersistentVolumeClaim>) -> Result<()> {
    let api: Api<PersistentVolume> = Api::all(e.tenant.clone());
    let list = api
        .list(&ListParams::default().labels(&format!("{MIRROR_LABEL}=true")))
        .await
        .map_err(kube_err("list mirrored volumes".into()))?;
    for pv in list.items {
        let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.clone());
        let alive = claim.as_ref().is_some_and(|c| {
            let r = ObjectRef::new(c.name.as_deref().unwrap_or_default())
                .within(c.namespace.as_deref().unwrap_or_default());
            claims.get(&r).is_some_and(|pvc| pvc.uid() == c.uid)
        });
        if !alive {
            tracing::info!(volume = %pv.name_any(), "claim gone; removing mirrored volume");
            match api.delete(&pv.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(ae)) if ae.code == 404 => {}
                Err(err) => {
                    return Err(kube_err(format!("delete tenant volume {}", pv.name_any()))(
                        err,
                    ));
                }
            }
        }
    }
    Ok(())
}

impl Synced for PersistentVolumeClaim {
    type Own = ();
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, _: &()) -> Option<Self> {
        // The claim's volume does not matter here (only its name and namespace are read).
        Some(to_host(t, &e.ctx, None))
    }

    fn observe(
        e: &std::sync::Arc<Engine>,
        _: &std::sync::Arc<()>,
        tenant: &mut crate::engine::shared::Shared<Self>,
        host: &mut crate::engine::shared::Shared<Self>,
    ) {
        crate::engine::quota::observe(e, tenant, host);
    }
}

/// Starts the claim controllers and the upkeep of the claims' volume mirrors (see
/// [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let (e, w, period) = (s.engine.clone(), s.workers, s.period);
    Box::pin(async move {
        let (claims_tx, claims_rx) =
            tokio::sync::oneshot::channel::<crate::engine::shared::Cache<PersistentVolumeClaim>>();
        let mirrors = {
            let e = e.clone();
            async move {
                if let Ok(cache) = claims_rx.await {
                    // Ready before the mirror loop waits on the store itself (see engine::shared).
                    cache.ready().await;
                    mirrors(e, cache.store(), period).await;
                }
            }
        };
        let stores = {
            let e = e.clone();
            move |s: crate::engine::shared::Cache<PersistentVolumeClaim>, _| {
                // The quota counts claims.
                let _ = e.tenant_claims.set(s.clone());
                let _ = claims_tx.send(s);
            }
        };
        futures::join!(
            crate::engine::run_kind::<PersistentVolumeClaim>(
                e,
                Arc::new(()),
                w,
                |t, s| Box::pin(down(t, s)),
                stores
            ),
            crate::engine::spawned(mirrors),
        );
    })
}
