//! The host side of shared datastores: each datastore's namespace, PKI, members and root user
//! ([`Provisioner::reconcile_datastore`], run by `vcp serve`'s datastore loop), and a tenant's
//! user on one ([`Provisioner::tenant_on_datastore`] in the tenant's pass, and the revoke in its
//! teardown).

use super::store::StorePhase;
use crate::host::{Provisioner, conflict, ssa as host};
use crate::lifecycle::steps::StepResult;
use crate::pki::{Ca, CertKey, secret_str};
use crate::render::datastore::{self as names, Admin, Spec};
use crate::render::{self, LABEL_MANAGED_BY, Object};
use crate::snapshots::JobState;
use crate::{Error, Result, pki};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use time::OffsetDateTime;

fn pair(s: &Secret) -> Option<CertKey> {
    Some(CertKey {
        cert_pem: secret_str(s, "tls.crt")?,
        key_pem: secret_str(s, "tls.key")?,
    })
}

fn data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

impl Provisioner {
    /// One pass over datastore `name`: its objects applied, then its root user and
    /// authentication by the `init` Job; records and returns its phase.
    #[tracing::instrument(skip_all, fields(datastore = name))]
    pub async fn reconcile_datastore(&self, name: &str, spec: &Spec) -> Result<StorePhase> {
        let (phase, message) = match self.datastore_pass(name, spec).await {
            Ok(r) => r,
            Err(e) => (StorePhase::Pending, e.public()),
        };
        self.inventory
            .record_datastore(name, spec.members, phase, &message)
            .await?;
        Ok(phase)
    }

    async fn datastore_pass(&self, name: &str, spec: &Spec) -> Result<(StorePhase, String)> {
        let ns = names::namespace(name);
        let labels = json!({names::LABEL_DATASTORE: name, LABEL_MANAGED_BY: "vcp"});
        host::apply(
            &self.host,
            &Object(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels},
            })),
            false,
        )
        .await?;
        host::apply(
            &self.host,
            &render::host_rbac::own_binding(
                &ns,
                &self.config.host_user,
                &self.config.settings.host_roles_prefix,
            ),
            false,
        )
        .await?;
        let certificates = self.datastore_pki(name, spec, &ns).await?;
        let version = self.config.catalog.resolve(None)?;
        let images = (
            version.images["etcd"].as_str(),
            self.config.settings.tools_image.as_str(),
        );
        let objects = self
            .config
            .renderer
            .render_datastore(name, spec, images, &certificates)?;
        for o in &objects {
            host::apply(&self.host, o, false).await?;
        }
        match crate::host::workload_ready(&self.host, &objects).await? {
            Some(StepResult::Ready) => {}
            Some(StepResult::Waiting(w)) => return Ok((StorePhase::Pending, w)),
            _ => return Ok((StorePhase::Pending, "the members are starting".into())),
        }
        match self.admin_job(name, spec, images, &Admin::Init).await? {
            JobState::Succeeded(_) => Ok((StorePhase::Ready, String::new())),
            JobState::Failed(why) => Ok((
                StorePhase::Failed,
                format!("turning authentication on failed: {why}"),
            )),
            JobState::Absent | JobState::Running => {
                Ok((StorePhase::Pending, "turning authentication on".into()))
            }
        }
    }

    /// The datastore's CA, its members' certificate and root's, kept in its namespace; the
    /// digest that rolls the members when theirs is reissued.
    async fn datastore_pki(&self, name: &str, spec: &Spec, ns: &str) -> Result<String> {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let now = OffsetDateTime::now_utc();
        let ca = match self
            .read_secret(&secrets, names::SECRET_CA)
            .await?
            .as_ref()
            .and_then(pair)
        {
            Some(p) => Ca::load(&p)?,
            None => {
                let ca = Ca::generate(&format!("vcp-datastore-{name}"), now, pki::CA_VALIDITY)?;
                let p = ca.cert_key();
                self.create_datastore_secret(
                    &secrets,
                    name,
                    names::SECRET_CA,
                    data(&[("tls.crt", &p.cert_pem), ("tls.key", &p.key_pem)]),
                )
                .await?;
                // Another replica may have won the race: use whatever is stored now.
                let stored = self.read_secret(&secrets, names::SECRET_CA).await?;
                Ca::load(&stored.as_ref().and_then(pair).ok_or_else(|| {
                    Error::Datastore(format!("the CA secret of datastore {name} has no pair"))
                })?)?
            }
        };
        let ca_pem = ca.cert_key().cert_pem.clone();
        let mut member = pki::LeafSpec::server(
            pki::ETCD_PEER_CN,
            names::member_dns(name, spec.members, &self.config.settings.cluster_domain),
            vec![[127, 0, 0, 1].into()],
        );
        // One certificate serves clients and peers, as a tenant's etcd does.
        member.client = true;
        // Root's certificate names no user: etcd's JSON gateway, which the admin Jobs speak,
        // refuses one that does once authentication is on; root is who its password says.
        let root = pki::LeafSpec::client("", &[names::ADMIN_ORGANIZATION]);
        let mut serial = String::new();
        for (secret, spec) in [(names::SECRET_MEMBER, &member), (names::SECRET_ROOT, &root)] {
            let stored = self.read_secret(&secrets, secret).await?;
            let current = stored.as_ref().and_then(|s| {
                let cert = secret_str(s, "tls.crt")?;
                let info = pki::inspect(secret, &cert).ok()?;
                let same = s.metadata.annotations.as_ref()?.get(ANN_SPEC) == Some(&spec.digest());
                (same && !pki::needs_renewal(&info, now)).then_some(info)
            });
            let info = match current {
                Some(info) => info,
                None => {
                    let p = ca.issue(spec, now, pki::LEAF_VALIDITY)?;
                    let mut d = data(&[
                        ("tls.crt", &p.cert_pem),
                        ("tls.key", &p.key_pem),
                        ("ca.crt", &ca_pem),
                    ]);
                    // Root's password stays what it was: etcd holds it since init.
                    let password = stored
                        .as_ref()
                        .and_then(|s| secret_str(s, "password"))
                        .unwrap_or_else(pki::new_token);
                    if secret == names::SECRET_ROOT {
                        d.insert("password".into(), ByteString(password.into_bytes()));
                    }
                    let mut s = datastore_secret(name, secret, d);
                    s.metadata.annotations =
                        Some(BTreeMap::from([(ANN_SPEC.to_owned(), spec.digest())]));
                    match stored {
                        None => match secrets.create(&PostParams::default(), &s).await {
                            Ok(_) => {}
                            Err(e) if conflict(&e) => {}
                            Err(e) => {
                                return Err(Error::kube(format!("create secret {secret}"), e));
                            }
                        },
                        Some(old) => {
                            s.metadata.resource_version = old.metadata.resource_version;
                            secrets
                                .replace(secret, &PostParams::default(), &s)
                                .await
                                .map_err(|e| Error::kube(format!("renew secret {secret}"), e))?;
                        }
                    }
                    pki::inspect(secret, &p.cert_pem)?
                }
            };
            if secret == names::SECRET_MEMBER {
                serial = info.serial;
            }
        }
        Ok(serial)
    }

    async fn read_secret(&self, secrets: &Api<Secret>, name: &str) -> Result<Option<Secret>> {
        secrets
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("read secret {name}"), e))
    }

    async fn create_datastore_secret(
        &self,
        secrets: &Api<Secret>,
        datastore: &str,
        name: &str,
        d: BTreeMap<String, ByteString>,
    ) -> Result<()> {
        match secrets
            .create(
                &PostParams::default(),
                &datastore_secret(datastore, name, d),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(Error::kube(format!("create secret {name}"), e)),
        }
    }

    /// A datastore runs from its first tenant on: its row asks the datastore loops for it.
    async fn ask_datastore(&self, name: &str) -> Result<()> {
        if self.inventory.datastore(name).await?.is_none() {
            let spec = self.datastore_spec(name)?;
            self.inventory
                .record_datastore(
                    name,
                    spec.members,
                    StorePhase::Pending,
                    "asked for by a tenant",
                )
                .await?;
            ASKED.notify_one();
        }
        Ok(())
    }

    /// The datastore's CA, which signs the client certificates of its tenants' apiservers;
    /// `None` (and the datastore asked for) until its loop made it.
    pub(crate) async fn datastore_ca(&self, name: &str) -> Result<Option<Ca>> {
        // Asked first: until the datastore loop has made its namespace and bound vcp's role
        // there, its Secrets are not even readable (403 under the chart's least privilege).
        self.ask_datastore(name).await?;
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), &names::namespace(name));
        let stored = match secrets.get_opt(names::SECRET_CA).await {
            Ok(s) => s,
            Err(kube::Error::Api(e)) if e.code == 403 => None,
            Err(e) => return Err(Error::kube(format!("read secret {}", names::SECRET_CA), e)),
        };
        match stored.as_ref().and_then(pair) {
            Some(p) => Ok(Some(Ca::load(&p)?)),
            None => Ok(None),
        }
    }

    /// Applies an admin Job (unless it exists) and says how it is doing. A failed one is
    /// deleted, so the next pass starts it again.
    async fn admin_job(
        &self,
        name: &str,
        spec: &Spec,
        images: (&str, &str),
        admin: &Admin,
    ) -> Result<JobState> {
        let ns = names::namespace(name);
        let job = admin.job();
        let state = self.job_state(&ns, &job).await?;
        match &state {
            JobState::Absent => {
                for o in self
                    .config
                    .renderer
                    .render_datastore_job(name, spec, images, admin)?
                {
                    host::apply(&self.host, &o, false).await?;
                }
            }
            JobState::Failed(why) => {
                tracing::warn!(
                    datastore = name,
                    job,
                    why,
                    "datastore admin job failed; starting it again"
                );
                self.delete_datastore_job(name, &job).await?;
            }
            JobState::Running | JobState::Succeeded(_) => {}
        }
        Ok(state)
    }

    /// The tenant's side of its plan's datastore, in its pass (its etcd step): the datastore
    /// Ready, its user and password in the tenant's control-plane namespace, then the user
    /// granted by a Job (once; the inventory remembers it).
    pub(crate) async fn tenant_on_datastore(
        &self,
        tenant: &crate::inventory::Tenant,
        placement: &names::Placement,
    ) -> Result<StepResult> {
        let (tenant_id, key) = (tenant.id, tenant.key.as_str());
        let name = &placement.name;
        let granted = self.inventory.tenant_datastore(tenant_id).await?.as_deref() == Some(name);
        let made = self.tenant_user_secret(tenant, name).await?;
        if granted && !made {
            return Ok(StepResult::Ready);
        }
        if granted {
            // Granted before its user had a password: granted again, to set it.
            self.inventory.forget_grant(tenant_id).await?;
            let job = Admin::Grant {
                key: key.to_owned(),
            }
            .job();
            self.delete_datastore_job(name, &job).await?;
        }
        let Some(row) = self.inventory.datastore(name).await? else {
            self.ask_datastore(name).await?;
            return Ok(StepResult::Waiting(format!("datastore {name} is starting")));
        };
        if !row.ready() {
            return Ok(StepResult::Waiting(format!(
                "datastore {name} is {}: {}",
                row.phase, row.message
            )));
        }
        let spec = self.datastore_spec(name)?;
        let version = self.config.catalog.resolve(None)?;
        let images = (
            version.images["etcd"].as_str(),
            self.config.settings.tools_image.as_str(),
        );
        let grant = Admin::Grant {
            key: key.to_owned(),
        };
        match self.admin_job(name, spec, images, &grant).await? {
            JobState::Succeeded(_) => {
                self.inventory.record_grant(tenant_id, name).await?;
                Ok(StepResult::Ready)
            }
            JobState::Failed(why) => Ok(StepResult::Error(format!(
                "granting the tenant's user on datastore {name} failed: {why}"
            ))),
            JobState::Absent | JobState::Running => Ok(StepResult::Waiting(format!(
                "granting the tenant's user on datastore {name}"
            ))),
        }
    }

    /// Deletes an admin Job of datastore `name` (gone already is fine).
    async fn delete_datastore_job(&self, name: &str, job: &str) -> Result<()> {
        let jobs: Api<k8s_openapi::api::batch::v1::Job> =
            Api::namespaced(self.host.clone(), &names::namespace(name));
        let dp = DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match jobs.delete(job, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if crate::host::not_found(&e) => Ok(()),
            Err(e) => Err(Error::kube(format!("delete job {job}"), e)),
        }
    }

    /// The tenant's user and password on datastore `name`, kept in its control-plane namespace
    /// for vcp's snapshot Jobs; whether this pass had to write them.
    async fn tenant_user_secret(
        &self,
        tenant: &crate::inventory::Tenant,
        name: &str,
    ) -> Result<bool> {
        let ns = vcp_core::naming::control_plane_namespace(&tenant.key);
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), &ns);
        let user = names::user(&tenant.key);
        let stored = self
            .read_secret(&secrets, names::SECRET_TENANT_USER)
            .await?;
        if stored
            .as_ref()
            .and_then(|s| secret_str(s, "user"))
            .as_deref()
            == Some(user.as_str())
        {
            return Ok(false);
        }
        let root = self
            .read_secret(
                &Api::namespaced(self.host.clone(), &names::namespace(name)),
                names::SECRET_ROOT,
            )
            .await?
            .and_then(|s| secret_str(&s, "password"))
            .ok_or_else(|| {
                Error::Datastore(format!("datastore {name} has no root password yet"))
            })?;
        let d = data(&[
            ("user", &user),
            ("password", &names::tenant_password(&root, &user)),
        ]);
        if stored.is_some() {
            secrets
                .delete(names::SECRET_TENANT_USER, &DeleteParams::default())
                .await
                .map_err(|e| Error::kube("delete the datastore user secret", e))?;
        }
        self.create_secret(&secrets, names::SECRET_TENANT_USER, tenant, d, None)
            .await?;
        Ok(true)
    }

    /// The tenant's user gone from the datastore (its keys too, unless `keep_data`); `Ready`
    /// once done, or when it never had one.
    pub(crate) async fn revoke_from_datastore(
        &self,
        tenant_id: i64,
        key: &str,
        keep_data: bool,
    ) -> Result<StepResult> {
        let Some(name) = self.inventory.tenant_datastore(tenant_id).await? else {
            return Ok(StepResult::Ready);
        };
        let spec = self.datastore_spec(&name)?;
        let version = self.config.catalog.resolve(None)?;
        let images = (
            version.images["etcd"].as_str(),
            self.config.settings.tools_image.as_str(),
        );
        let revoke = Admin::Revoke {
            key: key.to_owned(),
            keep_data,
        };
        match self.admin_job(&name, spec, images, &revoke).await? {
            JobState::Succeeded(_) => {
                self.inventory.forget_grant(tenant_id).await?;
                Ok(StepResult::Ready)
            }
            JobState::Failed(why) => Ok(StepResult::Error(format!(
                "revoking the tenant's user on datastore {name} failed: {why}"
            ))),
            JobState::Absent | JobState::Running => Ok(StepResult::Waiting(format!(
                "revoking the tenant's user on datastore {name}"
            ))),
        }
    }

    fn datastore_spec(&self, name: &str) -> Result<&Spec> {
        self.config.settings.datastores.get(name).ok_or_else(|| {
            Error::Config(format!("datastore {name:?} is not declared (--datastores)"))
        })
    }
}

/// Annotation with the digest of the spec a datastore certificate was issued for.
const ANN_SPEC: &str = "vcp.dev/certificate-spec";

fn datastore_secret(datastore: &str, name: &str, d: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (names::LABEL_DATASTORE.to_owned(), datastore.to_owned()),
                (LABEL_MANAGED_BY.to_owned(), "vcp".to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(d),
        ..Secret::default()
    }
}

/// Wakes this replica's datastore loop when one of its tenant passes asked for a datastore.
static ASKED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// `vcp serve`'s datastore loop: every datastore a tenant has asked for (a row in the
/// inventory; an unused one does not run) reconciled, every few seconds until all are Ready and
/// every minute after (a member lost, a certificate to renew). Every replica runs it: each
/// step is an idempotent apply or a Job with a fixed name.
pub async fn run(prov: Provisioner) {
    let declared = prov.config.settings.datastores.clone();
    if declared.is_empty() {
        return;
    }
    loop {
        let mut all_ready = true;
        let asked = match prov.inventory.datastore_names().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e.public(), "listing the datastores failed");
                Vec::new()
            }
        };
        for name in asked {
            let Some(spec) = declared.get(&name) else {
                continue;
            };
            match prov.reconcile_datastore(&name, spec).await {
                Ok(StorePhase::Ready) => {}
                Ok(_) => all_ready = false,
                Err(e) => {
                    all_ready = false;
                    tracing::warn!(datastore = name, error = %e.public(), "reconciling the datastore failed");
                }
            }
        }
        let pause = if all_ready { 60 } else { 3 };
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(pause)) => {}
            () = ASKED.notified() => {}
        }
    }
}
