//! Tenant PKI with rcgen (pure: values in, PEM out; no I/O).
//!
//! Each tenant gets three CAs (cluster, etcd, front proxy) and a service-account key pair,
//! generated once and kept in Secrets of its control-plane namespace. Leaf certificates are
//! declared by [`plan`]: what each component needs, signed by which CA, with which names. The
//! provisioner compares each leaf's Secret against its plan (by [`LeafSpec::digest`]) and its
//! remaining lifetime ([`needs_renewal`]) and reissues it when either says so, which is how
//! certificates rotate without anyone asking.

pub mod groups;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use time::{Duration, OffsetDateTime};

/// Lifetime of a tenant's CAs.
pub const CA_VALIDITY: Duration = Duration::days(5 * 365);
/// Lifetime of component certificates; renewed when a third of it is left.
pub const LEAF_VALIDITY: Duration = Duration::days(365);

/// Errors of certificate handling.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("stored certificate for {0} cannot be parsed")]
    Parse(String),
    #[error("only a plain client certificate can carry several groups ({0} asked)")]
    TooManyGroups(usize),
}

type Result<T, E = PkiError> = std::result::Result<T, E>;

/// A certificate and its private key, PEM encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertKey {
    // Keys never reach logs, not even through a stray `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey")
            .field("cert_pem", &format!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What the inventory records about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub serial: String,
    pub fingerprint: String,
    pub subject: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// Reads serial, SHA-256 fingerprint, subject and validity from a PEM certificate.
pub fn inspect(purpose: &str, cert_pem: &str) -> Result<CertInfo> {
    let bad = || PkiError::Parse(purpose.to_owned());
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).map_err(|_| bad())?;
    let cert = pem.parse_x509().map_err(|_| bad())?;
    let ts = |t: x509_parser::time::ASN1Time| {
        OffsetDateTime::from_unix_timestamp(t.timestamp()).map_err(|_| bad())
    };
    Ok(CertInfo {
        serial: hex(cert.raw_serial()),
        fingerprint: hex(&Sha256::digest(&pem.contents)),
        subject: cert.subject().to_string(),
        not_before: ts(cert.validity().not_before)?,
        not_after: ts(cert.validity().not_after)?,
    })
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// True once less than a third of the certificate's lifetime is left (kubeadm and
/// cert-manager renew in the same region), or it is not yet valid, so a certificate is
/// replaced well before any client could see it expire.
pub fn needs_renewal(info: &CertInfo, now: OffsetDateTime) -> bool {
    let lifetime = info.not_after - info.not_before;
    now < info.not_before || info.not_after - now < lifetime / 3
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeafSpec {
    pub common_name: String,
    /// Kubernetes groups (O); more than one only for plain client certificates.
    pub groups: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub server: bool,
    pub client: bool,
}

impl LeafSpec {
    pub fn client(user: &str, groups: &[&str]) -> LeafSpec {
        LeafSpec {
            common_name: user.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            client: true,
            ..LeafSpec::default()
        }
    }

    pub fn server(name: &str, dns_names: Vec<String>, ips: Vec<IpAddr>) -> LeafSpec {
        LeafSpec {
            common_name: name.to_owned(),
            dns_names,
            ips,
            server: true,
            ..LeafSpec::default()
        }
    }

    /// A stable digest of everything the certificate says, stored beside it so a changed
    /// plan (a new address, say) reissues the certificate.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.common_name.as_bytes());
        for part in [&self.groups, &self.dns_names] {
            h.update([0]);
            for s in part {
                h.update(s.as_bytes());
                h.update([1]);
            }
        }
        h.update([0]);
        for ip in &self.ips {
            h.update(ip.to_string().as_bytes());
            h.update([1]);
        }
        h.update([u8::from(self.server), u8::from(self.client)]);
        hex(&h.finalize()[..12])
    }
}

/// A certificate authority that can issue leaves.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pair: CertKey,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn dn(common_name: &str, groups: &[String]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(g) = groups.first() {
        dn.push(DnType::OrganizationName, g.as_str());
    }
    dn
}

impl Ca {
    /// A new self-signed CA valid for [`CA_VALIDITY`].
    pub fn generate(common_name: &str, now: OffsetDateTime) -> Result<Ca> {
        let key = KeyPair::generate()?;
        let key_pem = key.serialize_pem();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        // Back-dated a little so a peer whose clock lags still accepts it.
        params.not_before = now - Duration::minutes(5);
        params.not_after = now + CA_VALIDITY;
        let cert = params.self_signed(&key)?;
        let pair = CertKey {
            cert_pem: cert.pem(),
            key_pem,
        };
        Ca::load(&pair)
    }

    /// A CA read back from its Secret.
    pub fn load(pair: &CertKey) -> Result<Ca> {
        let key = KeyPair::from_pem(&pair.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&pair.cert_pem, key)?;
        Ok(Ca {
            issuer,
            pair: pair.clone(),
        })
    }

    pub fn cert_key(&self) -> &CertKey {
        &self.pair
    }

    /// Issues a leaf valid for `validity` from `now`.
    pub fn issue(
        &self,
        spec: &LeafSpec,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<CertKey> {
        if spec.groups.len() > 1 {
            // rcgen writes one O; a client with several groups gets a hand-built certificate.
            if spec.server || !spec.dns_names.is_empty() || !spec.ips.is_empty() {
                return Err(PkiError::TooManyGroups(spec.groups.len()));
            }
            return groups::issue(&self.pair, &spec.common_name, &spec.groups, now, validity);
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(&spec.common_name, &spec.groups);
        params.subject_alt_names = spec
            .dns_names
            .iter()
            .map(|d| Ok(SanType::DnsName(d.clone().try_into()?)))
            .chain(spec.ips.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
            .collect::<Result<_, rcgen::Error>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if spec.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if spec.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        params.not_before = now - Duration::minutes(5);
        params.not_after = now + validity;
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A service-account signing key pair (PEM private key, PEM public key).
pub fn service_account_key() -> Result<(String, String)> {
    let k = KeyPair::generate()?;
    Ok((k.serialize_pem(), k.public_key_pem()))
}

/// The CAs of a tenant, by Secret name.
pub const CAS: [(&str, &str); 3] = [
    ("ca", "cluster-ca"),
    ("etcd-ca", "etcd-ca"),
    ("front-proxy-ca", "front-proxy-ca"),
];

/// One leaf certificate a tenant's control plane needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafPlan {
    /// Secret (in the control-plane namespace) and inventory purpose.
    pub name: &'static str,
    /// Secret name of the signing CA.
    pub ca: &'static str,
    pub spec: LeafSpec,
}

/// Addresses and names the tenant apiserver is reached at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiNames {
    /// The control-plane namespace.
    pub namespace: String,
    pub cluster_domain: String,
    /// First address of the service CIDR: the tenant's own `kubernetes` Service.
    pub kubernetes_service_ip: IpAddr,
    /// External host name or address in kubeconfigs, if any.
    pub external: Option<String>,
    pub etcd_replicas: u8,
}

/// User the orchestrator itself uses inside a tenant (bootstrap, readiness).
pub const ORCHESTRATOR_USER: &str = "vcp:orchestrator";
/// User of the tenant's syncer.
pub const SYNCER_USER: &str = "vcp:syncer";
/// User of the tenant's CoreDNS.
pub const COREDNS_USER: &str = "vcp:coredns";

/// Every leaf certificate of a tenant.
pub fn plan(n: &ApiNames) -> Vec<LeafPlan> {
    let ns = &n.namespace;
    let d = &n.cluster_domain;
    let svc_names = |svc: &str| -> Vec<String> {
        vec![
            svc.to_owned(),
            format!("{svc}.{ns}"),
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.{d}"),
        ]
    };
    let loopback: IpAddr = [127, 0, 0, 1].into();
    let mut api_dns = vec![
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
        format!("kubernetes.default.svc.{d}"),
    ];
    api_dns.extend(svc_names("kube-apiserver"));
    let mut api_ips = vec![loopback, n.kubernetes_service_ip];
    match n.external.as_deref().map(str::parse::<IpAddr>) {
        Some(Ok(ip)) if !api_ips.contains(&ip) => api_ips.push(ip),
        Some(Err(_)) => api_dns.push(n.external.clone().unwrap_or_default()),
        _ => {}
    }
    let mut etcd_dns = vec!["localhost".to_owned()];
    etcd_dns.extend(svc_names("etcd"));
    for i in 0..n.etcd_replicas {
        etcd_dns.push(format!("etcd-{i}.etcd.{ns}.svc"));
        etcd_dns.push(format!("etcd-{i}.etcd.{ns}.svc.{d}"));
    }
    let mut etcd = LeafSpec::server("etcd", etcd_dns, vec![loopback]);
    // One certificate serves clients and peers: peers authenticate each other with it too.
    etcd.client = true;
    vec![
        LeafPlan {
            name: "etcd",
            ca: "etcd-ca",
            spec: etcd,
        },
        LeafPlan {
            name: "apiserver-etcd-client",
            ca: "etcd-ca",
            spec: LeafSpec::client("kube-apiserver-etcd-client", &[]),
        },
        LeafPlan {
            name: "apiserver",
            ca: "ca",
            spec: LeafSpec::server("kube-apiserver", api_dns, api_ips),
        },
        LeafPlan {
            name: "front-proxy-client",
            ca: "front-proxy-ca",
            spec: LeafSpec::client("front-proxy-client", &[]),
        },
        LeafPlan {
            name: "controller-manager",
            ca: "ca",
            spec: LeafSpec::client("system:kube-controller-manager", &[]),
        },
        LeafPlan {
            name: "syncer",
            ca: "ca",
            spec: LeafSpec::client(SYNCER_USER, &["system:masters"]),
        },
        LeafPlan {
            name: "coredns",
            ca: "ca",
            spec: LeafSpec::client(COREDNS_USER, &[]),
        },
        LeafPlan {
            name: "orchestrator",
            ca: "ca",
            spec: LeafSpec::client(ORCHESTRATOR_USER, &["system:masters"]),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap()
    }

    fn names() -> ApiNames {
        ApiNames {
            namespace: "vcp-demoabc123".into(),
            cluster_domain: "cluster.local".into(),
            kubernetes_service_ip: [10, 96, 0, 1].into(),
            external: Some("127.0.0.1".into()),
            etcd_replicas: 3,
        }
    }

    fn parse(pem: &str) -> (Vec<u8>, String) {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let subject = p.parse_x509().unwrap().subject().to_string();
        (p.contents, subject)
    }

    #[test]
    fn leaves_are_signed_by_their_ca_with_the_planned_names_and_usages() {
        let ca = Ca::generate("tenant-ca", now()).unwrap();
        let plan = plan(&names());
        let api = plan.iter().find(|p| p.name == "apiserver").unwrap();
        let leaf = ca.issue(&api.spec, now(), LEAF_VALIDITY).unwrap();
        let (der, _) = parse(&leaf.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let (ca_der, _) = parse(&ca.cert_key().cert_pem);
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|g| g.to_string())
            .collect();
        for want in [
            "DNSName(kubernetes.default.svc.cluster.local)",
            "DNSName(kube-apiserver.vcp-demoabc123.svc)",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing in {names:?}"
            );
        }
        let ips: Vec<&[u8]> = san
            .value
            .general_names
            .iter()
            .filter_map(|g| match g {
                GeneralName::IPAddress(b) => Some(*b),
                _ => None,
            })
            .collect();
        assert!(ips.contains(&&[10u8, 96, 0, 1][..]), "{names:?}");
        assert!(ips.contains(&&[127u8, 0, 0, 1][..]), "{names:?}");
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let etcd = plan.iter().find(|p| p.name == "etcd").unwrap();
        assert!(etcd.spec.server && etcd.spec.client);
        assert!(
            etcd.spec
                .dns_names
                .contains(&"etcd-2.etcd.vcp-demoabc123.svc".to_owned())
        );
    }

    #[test]
    fn a_loaded_ca_issues_like_the_generated_one() {
        let ca = Ca::generate("tenant-ca", now()).unwrap();
        let again = Ca::load(ca.cert_key()).unwrap();
        let leaf = again
            .issue(
                &LeafSpec::client("alice", &["view"]),
                now(),
                Duration::hours(1),
            )
            .unwrap();
        let (der, subject) = parse(&leaf.cert_pem);
        assert_eq!(subject, "CN=alice, O=view");
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let (ca_der, _) = parse(&ca.cert_key().cert_pem);
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(cert.issuer().to_string(), "CN=tenant-ca");
    }

    #[test]
    fn lifetimes_are_bounded_and_renewal_starts_at_two_thirds() {
        let ca = Ca::generate("c", now()).unwrap();
        let info = inspect("c", &ca.cert_key().cert_pem).unwrap();
        assert_eq!(info.not_after, now() + CA_VALIDITY);
        let leaf = ca
            .issue(&LeafSpec::client("u", &[]), now(), LEAF_VALIDITY)
            .unwrap();
        let info = inspect("u", &leaf.cert_pem).unwrap();
        assert_eq!(info.not_after - now(), LEAF_VALIDITY);
        assert_eq!(info.fingerprint.len(), 64);
        assert!(!needs_renewal(&info, now()));
        assert!(!needs_renewal(&info, now() + Duration::days(240)));
        assert!(needs_renewal(&info, now() + Duration::days(245)));
        assert!(needs_renewal(&info, now() - Duration::days(1)));
    }

    #[test]
    fn several_groups_are_all_kept_never_silently_dropped() {
        let ca = Ca::generate("c", now()).unwrap();
        let leaf = ca
            .issue(&LeafSpec::client("u", &["a", "b"]), now(), LEAF_VALIDITY)
            .unwrap();
        let (_, subject) = parse(&leaf.cert_pem);
        assert_eq!(subject, "O=a, O=b, CN=u");
        let mut server = LeafSpec::server("s", vec!["x".into()], vec![]);
        server.groups = vec!["a".into(), "b".into()];
        assert!(matches!(
            ca.issue(&server, now(), LEAF_VALIDITY).unwrap_err(),
            PkiError::TooManyGroups(2)
        ));
    }

    #[test]
    fn digest_changes_with_any_field_and_keys_never_print() {
        let a = LeafSpec::client("u", &["g"]);
        let mut b = a.clone();
        b.groups = vec!["h".into()];
        let mut c = a.clone();
        c.ips.push([1, 2, 3, 4].into());
        assert_ne!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert_eq!(a.digest(), a.clone().digest());
        let ca = Ca::generate("c", now()).unwrap();
        let printed = format!("{:?}", ca.cert_key());
        assert!(!printed.contains("PRIVATE KEY"), "{printed}");
    }
}
