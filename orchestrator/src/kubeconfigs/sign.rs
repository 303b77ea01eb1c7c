//! Kubeconfigs for tenant users, signed with the tenant's CA, which lives only on the host
//! (the `ca` Secret of `vcp-<key>`): the API asks here instead of reading the host itself.
//!
//! Each certificate names its own serial in a group (`vcp_core::revocation`), and the tenant's
//! revoked serials go to the host ConfigMap its syncer enforces them from
//! ([`Provisioner::write_revocations`]): right after a revocation, and again on every pass.

use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::pki::CertInfo;
use crate::pki::rotation::{Phase, Target};
use crate::{Error, Result, pki, render};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use time::OffsetDateTime;
use vcp_core::naming::control_plane_namespace;

/// The user of a break-glass kubeconfig is this and the token's name, so the tenant's own
/// audit log says whose it was.
pub const BREAK_GLASS_USER_PREFIX: &str = "vcp:break-glass:";

/// A kubeconfig signed for a tenant user: its client certificate and key are embedded in
/// `kubeconfig` and nowhere else.
pub struct SignedKubeconfig {
    /// kubeconfig YAML.
    pub kubeconfig: String,
    /// What the inventory records about the certificate (never its key).
    pub certificate: CertInfo,
}

impl std::fmt::Debug for SignedKubeconfig {
    // The kubeconfig embeds a private key: never printed, not even by a stray `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedKubeconfig")
            .field("kubeconfig", &"<redacted>")
            .field("certificate", &self.certificate)
            .finish()
    }
}

impl Provisioner {
    /// A kubeconfig of tenant `t` at `endpoint` for `user` in `groups` (certificate CN and O),
    /// valid from `now` for `ttl`, revocable: the certificate also carries its serial's
    /// group. The caller checks the request and records the result.
    #[tracing::instrument(skip_all, fields(tenant = %t.name, key = %t.key, user = %user))]
    pub async fn sign_kubeconfig(
        &self,
        t: &Tenant,
        endpoint: &str,
        user: &str,
        groups: &[String],
        now: OffsetDateTime,
        ttl: time::Duration,
    ) -> Result<SignedKubeconfig> {
        self.sign(t, endpoint, user, groups, now, ttl, true).await
    }

    /// A break-glass kubeconfig of tenant `t` for `actor`: user `vcp:break-glass:<actor>` in
    /// `system:masters`, which the apiserver admits before any authorizer. It works while the
    /// tenant's syncer is down and whatever the tenant did to its RBAC; it carries no
    /// revocation group, so only its short `ttl` bounds it.
    #[tracing::instrument(skip_all, fields(tenant = %t.name, key = %t.key, actor = %actor))]
    pub async fn sign_break_glass(
        &self,
        t: &Tenant,
        endpoint: &str,
        actor: &str,
        now: OffsetDateTime,
        ttl: time::Duration,
    ) -> Result<SignedKubeconfig> {
        let user = format!("{BREAK_GLASS_USER_PREFIX}{actor}");
        let groups = ["system:masters".to_owned()];
        self.sign(t, endpoint, &user, &groups, now, ttl, false)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn sign(
        &self,
        t: &Tenant,
        endpoint: &str,
        user: &str,
        groups: &[String],
        now: OffsetDateTime,
        ttl: time::Duration,
        revocable: bool,
    ) -> Result<SignedKubeconfig> {
        let secrets: Api<Secret> =
            Api::namespaced(self.host.clone(), &control_plane_namespace(&t.key));
        let ca_secret = secrets
            .get_opt("ca")
            .await
            .map_err(|e| Error::kube("read the tenant CA", e))?
            .ok_or_else(|| Error::NoCa(t.name.clone()))?;
        // Mid-rotation, kubeconfigs are signed by the CA the apiserver's clients move to and
        // carry both CAs, so they keep working when the old one is retired.
        // The inventory's phase, not the Secret's annotation: once a rotation is in `sign`
        // there, every apiserver trusts the new CA, though the pass that annotates the Secret
        // may not have run yet (and `signing_since` promises such kubeconfigs survive).
        let m = crate::pki::rotation::ca_of(&ca_secret)?;
        let signing = self
            .inventory
            .active_rotation(t.id)
            .await?
            .and_then(|r| r.parsed())
            .is_some_and(|(target, phase)| {
                target == Target::Ca && matches!(phase, Phase::Sign | Phase::Serve | Phase::Retire)
            });
        let ca = match (&m.next, signing) {
            (Some(next), true) => next,
            _ => m.signer(false),
        };
        let ca_bundle = m.bundle();
        // The serial is chosen first, so the certificate can carry it in its revocation group.
        let serial = pki::new_serial()?;
        let group = vcp_core::revocation::group_of(&pki::hex(&serial));
        let groups: Vec<&str> = groups
            .iter()
            .map(String::as_str)
            .chain(revocable.then_some(group.as_str()))
            .collect();
        let spec = pki::LeafSpec {
            serial: Some(serial),
            ..pki::LeafSpec::client(user, &groups)
        };
        let pair = ca.issue(&spec, now, ttl)?;
        let certificate = pki::inspect("kubeconfig", &pair.cert_pem)?;
        let (server, server_name) = self.config.settings.expose.dial(endpoint);
        let kubeconfig = render::kubeconfig::embedded(
            &t.name,
            (&server, server_name.as_deref()),
            &ca_bundle,
            user,
            &pair.cert_pem,
            &pair.key_pem,
        );
        Ok(SignedKubeconfig {
            kubeconfig,
            certificate,
        })
    }

    /// Writes tenant `t`'s revoked, unexpired kubeconfig serials (from the inventory) to the
    /// host ConfigMap its syncer enforces. Idempotent; an unchanged list changes nothing.
    #[tracing::instrument(skip_all, fields(tenant = %t.name, key = %t.key))]
    pub async fn write_revocations(&self, t: &Tenant) -> Result<usize> {
        use vcp_core::revocation as r;
        let serials = self.inventory.revoked_serials(t.id).await?;
        let ns = control_plane_namespace(&t.key);
        let cm = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": r::CONFIGMAP,
                "namespace": ns,
                "labels": {
                    crate::render::LABEL_MANAGED_BY: "vcp",
                    crate::render::LABEL_CONTROL_PLANE_OF: t.key,
                },
            },
            "data": {r::KEY: r::render_list(serials.iter().map(String::as_str))},
        });
        Api::<ConfigMap>::namespaced(self.host.clone(), &ns)
            .patch(
                r::CONFIGMAP,
                &PatchParams::apply(crate::host::ssa::FIELD_MANAGER).force(),
                &Patch::Apply(&cm),
            )
            .await
            .map_err(|e| Error::kube("write the revoked kubeconfigs", e))?;
        Ok(serials.len())
    }

    /// Makes the kubeconfig of `serial`, issued to `user`, a sudoer in tenant `t`
    /// ([`crate::kubeconfigs::access`]): the ClusterRole that lets its holder impersonate `user` into the
    /// sudo group, bound to that kubeconfig's own revocation group. Idempotent.
    #[tracing::instrument(skip_all, fields(tenant = %t.name, key = %t.key, user = %user, serial = %serial))]
    pub async fn grant_sudo(
        &self,
        t: &Tenant,
        endpoint: &str,
        user: &str,
        serial: &str,
    ) -> Result<()> {
        let client = self
            .tenant_client(&control_plane_namespace(&t.key), Some(endpoint))
            .await?;
        write_sudo(&client, user, serial).await
    }

    /// Makes the sudo roles in tenant `t` match its live sudo kubeconfigs in the inventory:
    /// writes missing ones, deletes those of kubeconfigs revoked or expired, unknown, or bound
    /// to a user name. Idempotent, and safe beside an issuing that writes a new kubeconfig's
    /// role: the tenant's roles are listed before the inventory is read, and an issuing
    /// records its kubeconfig before writing the role, so a role seen here is either of a
    /// kubeconfig the inventory then holds or one no longer live. Returns how many objects it
    /// deleted.
    #[tracing::instrument(skip_all, fields(tenant = %t.name, key = %t.key))]
    pub async fn reconcile_sudo(&self, t: &Tenant, endpoint: Option<&str>) -> Result<usize> {
        let client = self
            .tenant_client(&control_plane_namespace(&t.key), endpoint)
            .await?;
        let lp = kube::api::ListParams::default()
            .labels(&format!("{}=vcp", crate::render::LABEL_MANAGED_BY));
        let roles_api = Api::<ClusterRole>::all(client.clone());
        let bindings_api = Api::<ClusterRoleBinding>::all(client.clone());
        let roles = names(
            roles_api
                .list_metadata(&lp)
                .await
                .map_err(|e| Error::kube("list the sudo roles in the tenant", e))?,
        );
        let bindings = names(
            bindings_api
                .list_metadata(&lp)
                .await
                .map_err(|e| Error::kube("list the sudo bindings in the tenant", e))?,
        );
        let live = self.inventory.live_sudoers(t.id).await?;
        let plan = crate::kubeconfigs::access::sudo_plan(&live, &roles, &bindings);
        for s in &plan.write {
            write_sudo(&client, &s.user, &s.serial).await?;
        }
        // The binding first: without it the role grants nothing.
        let dp = kube::api::DeleteParams::default();
        for name in &plan.delete_bindings {
            crate::host::ignore_404(bindings_api.delete(name, &dp).await)
                .map_err(|e| Error::kube("delete a sudo binding in the tenant", e))?;
        }
        for name in &plan.delete_roles {
            crate::host::ignore_404(roles_api.delete(name, &dp).await)
                .map_err(|e| Error::kube("delete a sudo role in the tenant", e))?;
        }
        let deleted = plan.delete_bindings.len() + plan.delete_roles.len();
        if deleted > 0 {
            tracing::info!(
                deleted,
                "removed sudo objects of kubeconfigs no longer live"
            );
        }
        Ok(deleted)
    }
}

/// The names in a metadata list.
fn names<K: Clone>(list: kube::core::ObjectList<kube::core::PartialObjectMeta<K>>) -> Vec<String> {
    list.items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect()
}

/// Writes the sudo role and binding of the kubeconfig of `serial`, issued to `user`.
async fn write_sudo(client: &kube::Client, user: &str, serial: &str) -> Result<()> {
    let (role, binding) = crate::kubeconfigs::access::sudo_objects(user, serial);
    let name = crate::kubeconfigs::access::sudo_name(serial);
    let pp = PatchParams::apply(crate::host::ssa::FIELD_MANAGER).force();
    Api::<ClusterRole>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&role))
        .await
        .map_err(|e| Error::kube("write the sudo role in the tenant", e))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&binding))
        .await
        .map_err(|e| Error::kube("bind the sudo role in the tenant", e))?;
    Ok(())
}
