//! The tenant's PKI on the host: CAs and leaf certificates kept in Secrets of the
//! control-plane namespace.
//!
//! Data flow: each pass plans the certificates the tenant needs ([`crate::pki::plan`]), reads
//! the Secrets that hold them, and signs again only what is missing, expired, signed by a CA
//! being rotated out, or issued for another spec (a digest of the spec and the signer ride on
//! each Secret as annotations). The service-account keys and bootstrap tokens come out of the
//! same step, as the inputs the render needs.

use crate::host::{Provisioner, conflict, cp_selector, first_service_ip, secret_str};
use crate::inventory::Tenant;
use crate::pki::rotation::{self, Target};
use crate::pki::{ApiNames, Ca, CertKey};
use crate::provision::ROLLOUT_TOKENS;
use crate::render::{Plan, datastore};
use crate::rotations::store::RotationRow;
use crate::{Error, Result, pki, render};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use time::OffsetDateTime;

fn cert_key_of(s: &Secret) -> Option<CertKey> {
    Some(CertKey {
        cert_pem: secret_str(s, "tls.crt")?,
        key_pem: secret_str(s, "tls.key")?,
    })
}

/// Annotation with the digest of the plan a leaf certificate was issued for.
const ANN_SPEC: &str = "vcp.dev/certificate-spec";

/// Annotation with the fingerprint of the CA that signed a leaf (see pki::rotation).
const ANN_SIGNER: &str = "vcp.dev/certificate-signer";

fn pair_data(p: &CertKey, ca: Option<&str>) -> BTreeMap<String, ByteString> {
    let mut d = BTreeMap::from([
        (
            "tls.crt".to_owned(),
            ByteString(p.cert_pem.clone().into_bytes()),
        ),
        (
            "tls.key".to_owned(),
            ByteString(p.key_pem.clone().into_bytes()),
        ),
    ]);
    if let Some(ca) = ca {
        d.insert("ca.crt".to_owned(), ByteString(ca.as_bytes().to_vec()));
    }
    d
}

fn secret(
    name: &str,
    t: &Tenant,
    data: BTreeMap<String, ByteString>,
    annotations: Option<&[(&str, &str)]>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (render::LABEL_CONTROL_PLANE_OF.to_owned(), t.key.to_string()),
                (render::LABEL_MANAGED_BY.to_owned(), "vcp".to_owned()),
            ])),
            annotations: annotations.map(|a| {
                a.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        type_: Some(
            if data.contains_key("tls.crt") {
                "kubernetes.io/tls"
            } else {
                "Opaque"
            }
            .to_owned(),
        ),
        data: Some(data),
        ..Secret::default()
    }
}

impl Provisioner {
    /// Makes sure every CA and leaf Secret exists, is current and is recorded; returns the
    /// per-component certificate digests that roll pods on renewal.
    pub(crate) async fn ensure_pki(
        &self,
        t: &Tenant,
        ns: &str,
        plan: &Plan,
        external: &str,
        rotation: Option<&RotationRow>,
    ) -> Result<BTreeMap<String, String>> {
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let now = OffsetDateTime::now_utc();
        let placement = self.config.settings.placement(plan, &t.key);
        // One list instead of a read per Secret: this runs on every pass.
        let stored: BTreeMap<String, Secret> = secrets
            .list(&ListParams::default().labels(&cp_selector(&t.key)))
            .await
            .map_err(|e| Error::kube("list the tenant's secrets", e))?
            .items
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
            .collect();
        let mut cas = BTreeMap::new();
        for (name, purpose) in pki::CAS {
            let ca_secret = match stored.get(name).filter(|s| cert_key_of(s).is_some()) {
                Some(s) => s.clone(),
                None => {
                    let ca = Ca::generate(&format!("{}-{purpose}", t.key), now, pki::CA_VALIDITY)?;
                    self.create_secret(&secrets, name, t, pair_data(ca.cert_key(), None), None)
                        .await?;
                    // Another replica may have won the race: use whatever is stored now.
                    secrets
                        .get(name)
                        .await
                        .map_err(|e| Error::kube(format!("read secret {name}"), e))?
                }
            };
            let target: Target = name
                .parse()
                .map_err(|e: String| Error::Config(format!("CA secret {name}: {e}")))?;
            let m = self
                .ca_material(t, &secrets, ca_secret, target, purpose, rotation, now)
                .await?;
            for (ca, which) in [
                (Some(&m.current), purpose.to_owned()),
                (m.next.as_ref(), format!("{purpose}-next")),
            ] {
                if let Some(ca) = ca {
                    let info = pki::inspect(&which, &ca.cert_key().cert_pem)?;
                    self.inventory
                        .record_certificate(t.id, &which, &info)
                        .await?;
                }
            }
            cas.insert(name, m);
        }
        let sa_secret = match stored.get("sa") {
            Some(s) => s.clone(),
            None => {
                let (key, public) = pki::service_account_key()?;
                let data = BTreeMap::from([
                    ("sa.key".to_owned(), ByteString(key.into_bytes())),
                    ("sa.pub".to_owned(), ByteString(public.into_bytes())),
                ]);
                self.create_secret(&secrets, "sa", t, data, None).await?;
                secrets
                    .get("sa")
                    .await
                    .map_err(|e| Error::kube("read secret sa", e))?
            }
        };
        let sa = self.sa_material(t, &secrets, sa_secret, rotation).await?;
        let names = ApiNames {
            namespace: ns.to_owned(),
            cluster_domain: self.config.settings.cluster_domain.clone(),
            kubernetes_service_ip: first_service_ip(&self.config.settings.service_cidr)
                .ok_or_else(|| Error::Config("service CIDR has no first address".into()))?,
            external: Some(external.to_owned()),
            etcd_replicas: plan.etcd_replicas,
            datastore_user: placement.as_ref().map(|_| datastore::user(&t.key)),
        };
        // On a shared datastore the apiserver's etcd client certificate comes from the
        // datastore's CA, which is not rotated with the tenant's.
        if let Some(p) = &placement {
            let ca = self
                .datastore_ca(&p.name)
                .await?
                .ok_or_else(|| Error::Datastore(format!("datastore {} has no CA yet", p.name)))?;
            cas.insert(
                pki::DATASTORE_CA,
                rotation::CaMaterial {
                    current: ca,
                    next: None,
                    phase: None,
                },
            );
        }
        let mut serials = BTreeMap::new();
        for leaf in pki::plan(&names) {
            let material = &cas[leaf.ca];
            // Users' kubeconfigs verify the apiserver's serving certificate with the CA they
            // were handed: it moves to a new cluster CA last (see pki::rotation).
            let ca = material.signer(leaf.name == "apiserver");
            let bundle = material.bundle();
            let signer = rotation::fingerprint(&ca.cert_key().cert_pem);
            let legacy_signer = rotation::fingerprint(&material.current.cert_key().cert_pem);
            let digest = leaf.spec.digest();
            let existing = stored.get(leaf.name).cloned();
            let current = existing.as_ref().and_then(|s| {
                let cert = secret_str(s, "tls.crt")?;
                let ann = s.metadata.annotations.as_ref()?;
                // Leaves from before rotations carry no signer: the CA in use signed them.
                let signed_by = ann.get(ANN_SIGNER).unwrap_or(&legacy_signer);
                let ok = ann.get(ANN_SPEC) == Some(&digest)
                    && *signed_by == signer
                    && secret_str(s, "ca.crt").as_deref() == Some(bundle.as_str())
                    && !pki::needs_renewal(&pki::inspect(leaf.name, &cert).ok()?, now);
                ok.then_some(cert)
            });
            let cert = match current {
                Some(c) => c,
                None => {
                    let pair = ca.issue(&leaf.spec, now, pki::LEAF_VALIDITY)?;
                    let data = pair_data(&pair, Some(&bundle));
                    let spec = [(ANN_SPEC, digest.as_str()), (ANN_SIGNER, signer.as_str())];
                    match existing {
                        None => {
                            self.create_secret(&secrets, leaf.name, t, data, Some(&spec))
                                .await?
                        }
                        Some(old) => {
                            // Replace with the version we read: a concurrent writer makes
                            // this a 409, and the next pass starts from what it wrote.
                            let mut s = secret(leaf.name, t, data, Some(&spec));
                            s.metadata.resource_version = old.metadata.resource_version;
                            secrets
                                .replace(leaf.name, &PostParams::default(), &s)
                                .await
                                .map_err(|e| {
                                    Error::kube(format!("renew secret {}", leaf.name), e)
                                })?;
                            tracing::info!(tenant = %t.name, certificate = leaf.name, "certificate reissued");
                        }
                    }
                    secret_str(
                        &secrets
                            .get(leaf.name)
                            .await
                            .map_err(|e| Error::kube(format!("read secret {}", leaf.name), e))?,
                        "tls.crt",
                    )
                    .unwrap_or_default()
                }
            };
            let info = pki::inspect(leaf.name, &cert)?;
            self.inventory
                .record_certificate(t.id, leaf.name, &info)
                .await?;
            serials.insert(leaf.name, info.serial);
        }
        // The service-account keys roll the apiserver and the controller-manager that read
        // them; the token generation reissues pods' tokens (and their CA bundle).
        serials.insert(
            "sa",
            rotation::fingerprint(&format!("{}{}", sa.trusted, sa.signing_public)),
        );
        let tokens =
            rotation::token_generation(&cas["ca"].bundle(), &sa.trusted, &sa.signing_public);
        let digest = |names: &[&str]| {
            let mut h = Sha256::new();
            for n in names {
                h.update(serials.get(n).map(String::as_str).unwrap_or_default());
                h.update([0]);
            }
            pki::hex(&h.finalize()[..8])
        };
        Ok(BTreeMap::from([
            ("etcd".to_owned(), digest(&["etcd"])),
            (
                "apiserver".to_owned(),
                digest(&[
                    "apiserver",
                    "apiserver-etcd-client",
                    "front-proxy-client",
                    "apiserver-kubelet-client",
                    "sa",
                ]),
            ),
            (
                "controller_manager".to_owned(),
                digest(&["controller-manager", "sa"]),
            ),
            ("coredns".to_owned(), digest(&["coredns"])),
            (
                "syncer".to_owned(),
                digest(&["syncer", "syncer-kubelet", "front-proxy-client"]),
            ),
            (ROLLOUT_TOKENS.to_owned(), tokens),
        ]))
    }

    pub(crate) async fn create_secret(
        &self,
        secrets: &Api<Secret>,
        name: &str,
        t: &Tenant,
        data: BTreeMap<String, ByteString>,
        annotations: Option<&[(&str, &str)]>,
    ) -> Result<()> {
        match secrets
            .create(&PostParams::default(), &secret(name, t, data, annotations))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(Error::kube(format!("create secret {name}"), e)),
        }
    }
}
