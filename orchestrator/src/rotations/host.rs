//! The host side of rotations: a pass turns the phase the inventory holds for a tenant's
//! rotation ([`crate::pki::rotation`]) into its CA and key Secrets, reads back what to trust and
//! what signs, and, once the control plane is Ready with it, no pod a roll replaced still runs
//! and every pod's token is of the phase's generation, moves the rotation on.
//!
//! inventory phase -> CA / `sa` Secret (`next.*`, phase annotation) -> [`CaMaterial`] and
//! [`SaMaterial`] -> leaf Secrets, the derived `signing.key` / `trusted.pub`, rollout digests and
//! the token generation the syncer gets -> Ready + tokens current + no replaced pod running ->
//! next phase.

use crate::host::{Provisioner, cp_selector, secret_str};
use crate::inventory::Tenant;
use crate::pki::rotation::{
    CaMaterial, NEXT_CERT, NEXT_KEY, Phase, SecretChange, Signer, Target, ca_of, phase_of,
};
use crate::pki::{Ca, rotation};
use crate::rotations::store::RotationRow;
use crate::{Error, Result, pki};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use time::OffsetDateTime;
use vcp_core::naming::{
    ANN_GENERATED, ANN_TOKEN_GENERATION, LABEL_TENANT, control_plane_namespace,
};

/// The service-account keys as their Secret holds them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaMaterial {
    /// Every public key tokens may be signed with (`trusted.pub`).
    pub trusted: String,
    /// The key that signs (`signing.key`) and its public half.
    pub signing_key: String,
    pub signing_public: String,
}

const SA_NEXT_KEY: &str = "next.key";
const SA_NEXT_PUB: &str = "next.pub";

fn bytes(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

/// How long past its deletion deadline a pod that is still listed counts as running. The
/// kubelet kills its containers at the deadline (the end of its grace period) and removes it
/// right after; one still listed well past it sits on a node that answers no one, and waiting
/// for it would hold the rotation until someone deletes it by force.
const KILLED_WITHIN: time::Duration = time::Duration::seconds(15);

/// The names of the pods among `pods` that are terminating but may still run, as of `now`:
/// deleted (a roll replaced them), and not past their deadline by more than
/// [`KILLED_WITHIN`]. A Deployment's status no longer counts such a pod, but it still holds the
/// material it started with and may still answer: the apiserver serves through its
/// `--shutdown-delay-duration` and finishes the requests it accepted.
pub(crate) fn still_running(pods: &[ObjectMeta], now: OffsetDateTime) -> Vec<String> {
    pods.iter()
        .filter(|m| {
            m.deletion_timestamp.as_ref().is_some_and(|t| {
                OffsetDateTime::from_unix_timestamp(t.0.as_second())
                    .is_ok_and(|deadline| now < deadline + KILLED_WITHIN)
            })
        })
        .map(|m| m.name.clone().unwrap_or_default())
        .collect()
}

/// The phase a rotation of `target` asks of its Secret, if one is under way for it.
fn asked(rotation: Option<&RotationRow>, target: Target) -> Option<Phase> {
    let (t, p) = rotation?.parsed()?;
    (t == target).then_some(p)
}

impl Provisioner {
    /// Writes `s` back over the version it was read at: a concurrent writer makes this a
    /// 409, and the next pass starts from what it wrote.
    async fn replace_secret(&self, secrets: &Api<Secret>, s: &Secret) -> Result<Secret> {
        let name = s.metadata.name.clone().unwrap_or_default();
        secrets
            .replace(&name, &PostParams::default(), s)
            .await
            .map_err(|e| Error::kube(format!("update secret {name}"), e))
    }

    /// The CA of Secret `name`, after applying what the rotation (if it targets `target`) asks
    /// of it: a next CA generated in `trust`, the phase annotated, the swap in `retire`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn ca_material(
        &self,
        t: &Tenant,
        secrets: &Api<Secret>,
        stored: Secret,
        target: Target,
        purpose: &str,
        rotation: Option<&RotationRow>,
        now: OffsetDateTime,
    ) -> Result<CaMaterial> {
        let mut s = stored;
        let has_next = secret_str(&s, NEXT_CERT).is_some();
        if let Some(phase) = asked(rotation, target) {
            let change = rotation::secret_change(phase, has_next);
            let mut changed = s.clone();
            let data = changed.data.get_or_insert_with(BTreeMap::new);
            let ann = changed
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new);
            match change {
                SecretChange::Next(p) => {
                    if !has_next {
                        let ca = Ca::generate(
                            &format!("{}-{purpose}-{}", t.key, now.unix_timestamp()),
                            now,
                            pki::CA_VALIDITY,
                        )?;
                        data.insert(NEXT_CERT.into(), bytes(&ca.cert_key().cert_pem));
                        data.insert(NEXT_KEY.into(), bytes(&ca.cert_key().key_pem));
                        tracing::info!(tenant = %t.name, ca = purpose, "new CA generated for a rotation");
                    }
                    ann.insert(rotation::ANN_PHASE.into(), p.as_str().into());
                }
                SecretChange::Swap => {
                    let cert = data.remove(NEXT_CERT);
                    let key = data.remove(NEXT_KEY);
                    if let (Some(cert), Some(key)) = (cert, key) {
                        data.insert("tls.crt".into(), cert);
                        data.insert("tls.key".into(), key);
                    }
                    ann.remove(rotation::ANN_PHASE);
                    tracing::info!(tenant = %t.name, ca = purpose, "old CA retired");
                }
                SecretChange::Keep => {}
            }
            if changed != s {
                s = self.replace_secret(secrets, &changed).await?;
            }
        }
        ca_of(&s)
    }

    /// The service-account keys, after applying what the rotation asks of Secret `sa` and
    /// writing the two files components read from it: `trusted.pub` and `signing.key`.
    pub(crate) async fn sa_material(
        &self,
        t: &Tenant,
        secrets: &Api<Secret>,
        stored: Secret,
        rotation: Option<&RotationRow>,
    ) -> Result<SaMaterial> {
        let s = stored;
        let mut changed = s.clone();
        let data = changed.data.get_or_insert_with(BTreeMap::new);
        let ann = changed
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        let text = |d: &BTreeMap<String, ByteString>, k: &str| {
            d.get(k).and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        let has_next = data.contains_key(SA_NEXT_KEY);
        if let Some(phase) = asked(rotation, Target::ServiceAccountKey) {
            match rotation::secret_change(phase, has_next) {
                SecretChange::Next(p) => {
                    if !has_next {
                        let (key, public) = pki::service_account_key()?;
                        data.insert(SA_NEXT_KEY.into(), bytes(&key));
                        data.insert(SA_NEXT_PUB.into(), bytes(&public));
                        tracing::info!(tenant = %t.name, "new service-account key generated for a rotation");
                    }
                    ann.insert(rotation::ANN_PHASE.into(), p.as_str().into());
                }
                SecretChange::Swap => {
                    if let (Some(k), Some(p)) = (data.remove(SA_NEXT_KEY), data.remove(SA_NEXT_PUB))
                    {
                        data.insert("sa.key".into(), k);
                        data.insert("sa.pub".into(), p);
                    }
                    ann.remove(rotation::ANN_PHASE);
                    tracing::info!(tenant = %t.name, "old service-account key retired");
                }
                SecretChange::Keep => {}
            }
        }
        let current_key = text(data, "sa.key").unwrap_or_default();
        let current_pub = text(data, "sa.pub").unwrap_or_default();
        let next = text(data, SA_NEXT_KEY).zip(text(data, SA_NEXT_PUB));
        let phase = next.as_ref().and_then(|_| phase_of(&changed));
        let (signing_key, signing_public) = match (rotation::signer(phase, false), &next) {
            (Signer::Next, Some((k, p))) => (k.clone(), p.clone()),
            _ => (current_key, current_pub.clone()),
        };
        let m = SaMaterial {
            trusted: rotation::trusted(&current_pub, next.as_ref().map(|(_, p)| p.as_str())),
            signing_key,
            signing_public,
        };
        let data = changed.data.get_or_insert_with(BTreeMap::new);
        data.insert("trusted.pub".into(), bytes(&m.trusted));
        data.insert("signing.key".into(), bytes(&m.signing_key));
        if changed != s {
            self.replace_secret(secrets, &changed).await?;
        }
        Ok(m)
    }

    /// Whether every token the tenant's syncer keeps on the host for a pod was issued under
    /// `generation` (host token Secrets carry it; see the syncer's `pods::tokens`).
    pub(crate) async fn tokens_current(&self, t: &Tenant, generation: &str) -> Result<bool> {
        // Namespace by namespace: vcp reads Secrets only where it bound itself
        // (render::host_rbac), never cluster-wide.
        let tenant = ListParams::default().labels(&format!("{LABEL_TENANT}={}", t.key));
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.host.clone())
            .list_metadata(&tenant)
            .await
            .map_err(|e| Error::kube("list the tenant's host namespaces", e))?;
        let mut items = Vec::new();
        for ns in namespaces
            .items
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
        {
            crate::host::ssa::apply(
                &self.host,
                &crate::render::host_rbac::own_binding(
                    ns,
                    &self.config.host_user,
                    &self.config.settings.host_roles_prefix,
                ),
                false,
            )
            .await?;
            let list = Api::<Secret>::namespaced(self.host.clone(), ns)
                .list_metadata(&tenant)
                .await
                .map_err(|e| Error::kube("list the tenant's host secrets", e))?;
            items.extend(list.items);
        }
        let stale = items
            .iter()
            .filter_map(|s| s.metadata.annotations.as_ref())
            .filter(|a| a.get(ANN_GENERATED).is_some_and(|g| g.starts_with("pod/")))
            .filter(|a| a.get(ANN_TOKEN_GENERATION).map(String::as_str) != Some(generation))
            .count();
        if stale > 0 {
            tracing::info!(tenant = %t.name, stale, "pods still hold tokens of an earlier generation");
        }
        Ok(stale == 0)
    }

    /// The tenant's control-plane pods that a roll replaced and that may still run (see
    /// [`still_running`]).
    async fn replaced_running(&self, t: &Tenant, now: OffsetDateTime) -> Result<Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.host.clone(), &control_plane_namespace(&t.key));
        let list = pods
            .list_metadata(&ListParams::default().labels(&cp_selector(&t.key)))
            .await
            .map_err(|e| Error::kube("list the control plane's pods", e))?;
        let metas: Vec<ObjectMeta> = list.items.into_iter().map(|p| p.metadata).collect();
        Ok(still_running(&metas, now))
    }

    /// Moves the tenant's rotation on if its phase is done: the control plane is Ready with
    /// this pass's material (`ready`), no pod it replaced still runs, every pod's token is
    /// of `generation`, and (`rewritten`) nothing is left stored under an old encryption key.
    /// Whether it moved.
    // What the pass found out, each from another part of it; a struct for one caller would
    // only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn advance_rotation(
        &self,
        t: &Tenant,
        r: &RotationRow,
        ready: bool,
        rewritten: bool,
        generation: &str,
        actor: &str,
        now: OffsetDateTime,
    ) -> Result<bool> {
        let Some((_, phase)) = r.parsed() else {
            return Ok(false);
        };
        let tokens_current = ready && self.tokens_current(t, generation).await?;
        // Asked at the moment of deciding, not with the pass's start time: a pod that went
        // away during the pass no longer holds the rotation.
        let replaced = if tokens_current {
            self.replaced_running(t, OffsetDateTime::now_utc()).await?
        } else {
            Vec::new()
        };
        if !replaced.is_empty() {
            tracing::info!(tenant = %t.name, pods = ?replaced, "waiting for replaced control-plane pods to stop");
        }
        let progress = rotation::Progress {
            ready,
            tokens_current,
            replaced_running: !replaced.is_empty(),
            in_phase: now - r.phase_since,
            overlap: r.overlap(),
            rewritten,
        };
        let Some(to) = rotation::advance(phase, &progress) else {
            return Ok(false);
        };
        let moved = self.inventory.advance_rotation(r, to, actor, now).await?;
        if moved {
            tracing::info!(tenant = %t.name, target = %r.target, from = %phase, to = %to, "rotation moved on");
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::format_description::well_known::Rfc3339;

    /// A pod's metadata as the API gives it, deleted with this deadline (seconds from the Unix
    /// epoch) if any.
    fn pod(name: &str, deadline: Option<i64>) -> ObjectMeta {
        let deadline = deadline.map(|s| {
            OffsetDateTime::from_unix_timestamp(s)
                .unwrap()
                .format(&Rfc3339)
                .unwrap()
        });
        serde_json::from_value(serde_json::json!({"name": name, "deletionTimestamp": deadline}))
            .unwrap()
    }

    #[test]
    fn a_terminating_pod_runs_until_it_is_gone_or_long_past_its_deadline() {
        let now = OffsetDateTime::from_unix_timestamp(1_000).unwrap();
        let pods = [
            pod("kube-apiserver-new", None),
            // Replaced a second ago with 30 s of grace: still in its shutdown delay.
            pod("kube-apiserver-old", Some(1_029)),
            // Its grace is over and the kubelet is stopping it.
            pod("etcd-2", Some(995)),
            // Deleted long ago and still listed: its node is gone.
            pod("coredns-lost", Some(900)),
        ];
        assert_eq!(
            still_running(&pods, now),
            ["kube-apiserver-old", "etcd-2"],
            "pods a roll replaced still hold the rotation"
        );
        assert!(still_running(&pods[..1], now).is_empty());
    }
}
