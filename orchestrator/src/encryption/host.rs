//! What a pass does with a tenant's encryption keys: makes the ones the tenant needs in the
//! inventory, renders the apiserver's configuration for the rotation's phase into the host
//! Secret, and, in an encryption-key rotation's `serve` phase, rewrites every object of the
//! plan's resources in the tenant apiserver so that it is stored under the new key.

use crate::encryption::store::KeyRow;
use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::pki::rotation::{self, Phase, SecretChange, Target};
use crate::pki::seal::associated_data;
use crate::render::encryption::{self as enc, DataKey};
use crate::render::{self, Object, Plan};
use crate::rotations::store::{RotationRow, StartRefused};
use crate::{Error, Result};
use base64::Engine as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use time::OffsetDateTime;

/// The rotation of the encryption key under way, with its phase, if that is what `rotation` is.
fn asked(rotation: Option<&RotationRow>) -> Option<(&RotationRow, Phase)> {
    let r = rotation?;
    match r.parsed()? {
        (Target::EncryptionKey, p) => Some((r, p)),
        _ => None,
    }
}

/// The key in use and the key a rotation introduces, among a tenant's live keys: the one whose
/// `rotation_id` is the running rotation's is the next, the newest other one the current.
fn split(live: &[KeyRow], rotation: Option<i64>) -> (Option<&KeyRow>, Option<&KeyRow>) {
    let is_next = |k: &&KeyRow| rotation.is_some() && k.rotation_id == rotation;
    let next = live.iter().find(is_next);
    let current = live.iter().rev().find(|k| !is_next(k));
    (current, next)
}

/// What [`Provisioner::rewrite_encrypted`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// Objects written again.
    pub objects: u64,
    /// Objects that changed or went away meanwhile (written by someone else with the new key,
    /// or gone): nothing left to rewrite.
    pub raced: u64,
}

impl Provisioner {
    /// Whether the tenant's etcd exists on the host: a tenant without one has never stored
    /// anything, and its first key can be used at once.
    async fn etcd_exists(&self, ns: &str) -> Result<bool> {
        Ok(Api::<StatefulSet>::namespaced(self.host.clone(), ns)
            .get_opt("etcd")
            .await
            .map_err(|e| Error::kube("read statefulset etcd", e))?
            .is_some())
    }

    /// For a tenant with no encryption key whose etcd exists (it was made before encryption
    /// at rest) and no rotation under way: starts the encryption-key rotation that brings in
    /// its first key, as `actor`. The rotation to walk this pass, if one was started (or found
    /// started by another replica).
    pub(crate) async fn start_first_key(
        &self,
        t: &Tenant,
        actor: &str,
    ) -> Result<Option<RotationRow>> {
        if !self.inventory.live_encryption_keys(t.id).await?.is_empty()
            || !self
                .etcd_exists(&vcp_core::naming::control_plane_namespace(&t.key))
                .await?
        {
            return Ok(None);
        }
        tracing::info!(tenant = %t.name, "the tenant has no encryption key: starting a rotation to its first");
        self.start_key_rotation(t, actor).await
    }

    /// An encryption-key rotation of the tenant that vcp starts itself (no overlap): the one
    /// started now, or the one already under way; `None` if the tenant is gone.
    pub(crate) async fn start_key_rotation(
        &self,
        t: &Tenant,
        actor: &str,
    ) -> Result<Option<RotationRow>> {
        Ok(
            match self
                .inventory
                .start_rotation(t, Target::EncryptionKey, time::Duration::ZERO, actor)
                .await?
            {
                Ok(r) => Some(r),
                Err(StartRefused::InProgress(r)) => Some(r),
                Err(StartRefused::NotPresent) => None,
            },
        )
    }

    /// The tenant's keys for this pass, after making what the rotation (if it is the
    /// encryption key's) asks for: the next key in `trust`, the old one retired in `retire`; or
    /// the tenant's first key, if it has none and its etcd does not exist yet. Opened with the
    /// inventory key: (current, next, the phase of next).
    async fn keys(
        &self,
        t: &Tenant,
        ns: &str,
        rotation: Option<&RotationRow>,
        actor: &str,
    ) -> Result<(Option<DataKey>, Option<DataKey>, Option<Phase>)> {
        let kek = &self.config.inventory_key;
        let asked = asked(rotation);
        let mut live = self.inventory.live_encryption_keys(t.id).await?;
        let changed = match asked {
            Some((r, phase)) => {
                let has_next = live.iter().any(|k| k.rotation_id == Some(r.id));
                match rotation::secret_change(phase, has_next) {
                    SecretChange::Next(_) if !has_next => {
                        let made = self
                            .inventory
                            .add_encryption_key(
                                t.id,
                                Some(r.id),
                                &vcp_pki::random_bytes::<32>(),
                                kek,
                                actor,
                            )
                            .await?;
                        if made {
                            tracing::info!(tenant = %t.name, "new encryption key made for a rotation");
                        }
                        true
                    }
                    SecretChange::Swap => {
                        let now = OffsetDateTime::now_utc();
                        let n = self
                            .inventory
                            .retire_encryption_keys(t.id, r.id, actor, now)
                            .await?;
                        if n > 0 {
                            tracing::info!(tenant = %t.name, retired = n, "old encryption key retired");
                        }
                        n > 0
                    }
                    _ => false,
                }
            }
            None if live.is_empty() && !self.etcd_exists(ns).await? => {
                self.inventory
                    .add_encryption_key(t.id, None, &vcp_pki::random_bytes::<32>(), kek, actor)
                    .await?;
                true
            }
            None => false,
        };
        if changed {
            live = self.inventory.live_encryption_keys(t.id).await?;
        }
        // From `retire` on, the rotation's key is the one in use (the old one is retired).
        let introducing = asked.filter(|(_, p)| p.has_next()).map(|(r, _)| r.id);
        let (current, next) = split(&live, introducing);
        let open = |k: &KeyRow| -> Result<DataKey> {
            let what = format!("tenant {}'s encryption key {}", t.name, k.name);
            let bytes = kek.open(&what, &k.sealed(), &associated_data(t.id, &k.name))?;
            let secret: [u8; 32] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| Error::Config(format!("{what} is {} bytes, not 32", bytes.len())))?;
            Ok(DataKey {
                name: k.name.clone(),
                secret,
            })
        };
        let phase = next.and(asked.map(|(_, p)| p));
        Ok((
            current.map(open).transpose()?,
            next.map(open).transpose()?,
            phase,
        ))
    }

    /// Writes the apiserver's encryption configuration for this pass into the host Secret and
    /// returns its digest, which rolls the apiserver when it changes.
    pub(crate) async fn ensure_encryption(
        &self,
        t: &Tenant,
        ns: &str,
        plan: &Plan,
        rotation: Option<&RotationRow>,
        actor: &str,
    ) -> Result<String> {
        let (current, next, phase) = self.keys(t, ns, rotation, actor).await?;
        let config = enc::configuration(
            &plan.encryption.resources,
            &enc::providers(current.as_ref(), next.as_ref(), phase),
        );
        let secret = Object(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": enc::SECRET,
                "namespace": ns,
                "labels": {
                    render::LABEL_CONTROL_PLANE_OF: t.key,
                    render::LABEL_MANAGED_BY: "vcp",
                },
            },
            "type": "Opaque",
            // `data`, not `stringData`: applied again unchanged, it changes nothing.
            "data": {enc::FILE: base64::engine::general_purpose::STANDARD.encode(&config)},
        }));
        crate::host::ssa::apply(&self.host, &secret, false).await?;
        Ok(enc::digest(&config))
    }

    /// Writes every object of `resources` again, unchanged, through the tenant apiserver: the
    /// apiserver stores each with the provider that encrypts now (a storage migration; an
    /// unchanged write of an object read with another key is not skipped, since the apiserver
    /// marks such a read stale). An object changed or deleted meanwhile was written with the
    /// current key by whoever changed it, so a conflict or a 404 is success. In simulate mode
    /// nothing talks to the tenant.
    pub(crate) async fn rewrite_encrypted(
        &self,
        t: &Tenant,
        endpoint: Option<&str>,
        resources: &[String],
    ) -> Result<Rewritten> {
        let mut done = Rewritten::default();
        // Simulated control planes have no apiserver to ask (benchmarks of vcp itself).
        if self.config.simulate {
            return Ok(done);
        }
        let ns = vcp_core::naming::control_plane_namespace(&t.key);
        let client = self.tenant_client(&ns, endpoint).await?;
        for entry in resources {
            let (resource, group) = enc::group_resource(entry);
            let found = match kube::discovery::group(&client, group).await {
                Ok(g) => g
                    .recommended_resources()
                    .into_iter()
                    .find(|(ar, _)| ar.plural == resource),
                // A group the tenant does not serve (a CRD not installed) has nothing stored.
                Err(kube::Error::Discovery(_)) => None,
                Err(e) => return Err(Error::kube(format!("discover {entry} in the tenant"), e)),
            };
            let Some((ar, caps)) = found else {
                continue;
            };
            let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
            let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let mut lp = ListParams::default().limit(250);
            loop {
                let page = all
                    .list(&lp)
                    .await
                    .map_err(|e| Error::kube(format!("list {entry} in the tenant"), e))?;
                for mut o in page.items {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    let api: Api<DynamicObject> = match (&o.metadata.namespace, namespaced) {
                        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &ar),
                        _ => Api::all_with(client.clone(), &ar),
                    };
                    // A list's items carry no kind; a replace must.
                    o.types = Some(kube::api::TypeMeta {
                        api_version: ar.api_version.clone(),
                        kind: ar.kind.clone(),
                    });
                    match api.replace(&name, &PostParams::default(), &o).await {
                        Ok(_) => done.objects += 1,
                        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                            done.raced += 1
                        }
                        Err(e) => {
                            return Err(Error::kube(
                                format!("rewrite {entry} {name} in the tenant"),
                                e,
                            ));
                        }
                    }
                }
                match page.metadata.continue_ {
                    Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                    _ => break,
                }
            }
        }
        tracing::info!(tenant = %t.name, objects = done.objects, raced = done.raced, "encrypted objects rewritten with the new key");
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, rotation: Option<i64>) -> KeyRow {
        KeyRow {
            id,
            tenant_id: 1,
            name: format!("key{id}"),
            kek_id: String::new(),
            nonce: vec![],
            ciphertext: vec![],
            rotation_id: rotation,
            created_at: OffsetDateTime::UNIX_EPOCH,
            retired_at: None,
        }
    }

    #[test]
    fn the_rotations_own_key_is_the_next_and_the_other_the_current() {
        let names = |live: &[KeyRow], rotation| {
            let (c, n) = split(live, rotation);
            (c.map(|k| k.name.clone()), n.map(|k| k.name.clone()))
        };
        assert_eq!(names(&[row(1, None)], None), (Some("key1".into()), None));
        assert_eq!(
            names(&[row(1, None), row(2, Some(7))], Some(7)),
            (Some("key1".into()), Some("key2".into()))
        );
        // No rotation (or another one): the newest live key is in use.
        assert_eq!(names(&[row(2, Some(7))], None), (Some("key2".into()), None));
        // A tenant from before encryption at rest, in its first rotation: no current key.
        assert_eq!(
            names(&[row(1, Some(3))], Some(3)),
            (None, Some("key1".into()))
        );
        let (c, n) = split(&[], Some(3));
        assert_eq!((c, n), (None, None));
    }
}
