//! The host cluster's PKI, generated with rcgen (pure: values in, PEM strings out).
//!
//! One cluster CA signs the apiserver's serving certificate, the serving certificates of the
//! controller-manager and scheduler (so their health endpoints are verified, not trusted
//! blindly) and one client certificate per component, each with its own identity, as
//! kubeadm lays it out. A separate front-proxy CA serves the aggregation layer, and an ECDSA
//! key pair signs service-account tokens. Every certificate has a bounded lifetime.

use crate::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use time::{Duration, OffsetDateTime};

/// Lifetime of the dev cluster's CAs.
pub const CA_VALIDITY: Duration = Duration::days(365);
/// Lifetime of leaf certificates.
pub const LEAF_VALIDITY: Duration = Duration::days(90);

/// A certificate and its private key, PEM encoded.
#[derive(Debug, Clone)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf certificate is for.
///
/// One organization at most: rcgen keeps one value per attribute type in a subject, so a
/// second O would silently replace the first (and drop a Kubernetes group).
#[derive(Debug, Clone, Default)]
pub struct LeafSpec {
    pub common_name: String,
    pub organization: Option<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub server: bool,
    pub client: bool,
}

impl LeafSpec {
    /// A client certificate for `user`, in `group` if given (Kubernetes reads CN as the user
    /// and O as a group).
    pub fn client(user: &str, group: Option<&str>) -> Self {
        LeafSpec {
            common_name: user.to_owned(),
            organization: group.map(str::to_owned),
            client: true,
            ..Default::default()
        }
    }

    /// A serving certificate for `name` at the given DNS names and addresses.
    pub fn server(name: &str, dns_names: &[&str], ips: &[IpAddr]) -> Self {
        LeafSpec {
            common_name: name.to_owned(),
            dns_names: dns_names.iter().map(|d| (*d).to_owned()).collect(),
            ips: ips.to_vec(),
            server: true,
            ..Default::default()
        }
    }
}

/// A certificate authority that can issue leaves.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pair: CertKey,
}

impl Ca {
    /// A new self-signed CA valid for [`CA_VALIDITY`] from `now`.
    pub fn new(common_name: &str, now: OffsetDateTime) -> Result<Ca> {
        let key = KeyPair::generate()?;
        let key_pem = key.serialize_pem();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        // Back-dated a little so a clock a few seconds behind still accepts it.
        params.not_before = now - Duration::minutes(5);
        params.not_after = now + CA_VALIDITY;
        let issuer = CertifiedIssuer::self_signed(params, key)?;
        let pair = CertKey {
            cert_pem: issuer.pem(),
            key_pem,
        };
        Ok(Ca { issuer, pair })
    }

    /// The CA's own certificate and key.
    pub fn cert_key(&self) -> &CertKey {
        &self.pair
    }

    /// Issues a leaf certificate valid for [`LEAF_VALIDITY`] from `now`.
    pub fn issue(&self, spec: &LeafSpec, now: OffsetDateTime) -> Result<CertKey> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(&spec.common_name, spec.organization.as_deref());
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
        params.not_after = now + LEAF_VALIDITY;
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn dn(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

/// Everything the host control plane needs, as PEM.
pub struct ClusterPki {
    pub ca: CertKey,
    pub front_proxy_ca: CertKey,
    pub apiserver: CertKey,
    pub front_proxy_client: CertKey,
    pub admin: CertKey,
    pub controller_manager: CertKey,
    pub controller_manager_serving: CertKey,
    pub scheduler: CertKey,
    pub scheduler_serving: CertKey,
    pub service_account_key_pem: String,
    pub service_account_pub_pem: String,
}

/// Identities used by the host control plane's clients.
pub const ADMIN_USER: &str = "vcp-dev-admin";

impl ClusterPki {
    /// Generates a complete PKI. `api_ips` are the addresses the apiserver is reached at (the
    /// loopback, the Service ClusterIP of `kubernetes`, the advertise address).
    pub fn generate(api_ips: &[IpAddr], now: OffsetDateTime) -> Result<ClusterPki> {
        let ca = Ca::new("vcp-dev-ca", now)?;
        let front_proxy_ca = Ca::new("vcp-dev-front-proxy-ca", now)?;
        let loopback: IpAddr = [127, 0, 0, 1].into();
        let apiserver = ca.issue(
            &LeafSpec::server(
                "kube-apiserver",
                &[
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                api_ips,
            ),
            now,
        )?;
        let sa = KeyPair::generate()?;
        Ok(ClusterPki {
            front_proxy_client: front_proxy_ca
                .issue(&LeafSpec::client("front-proxy-client", None), now)?,
            admin: ca.issue(&LeafSpec::client(ADMIN_USER, Some("system:masters")), now)?,
            controller_manager: ca.issue(
                &LeafSpec::client("system:kube-controller-manager", None),
                now,
            )?,
            controller_manager_serving: ca.issue(
                &LeafSpec::server("kube-controller-manager", &["localhost"], &[loopback]),
                now,
            )?,
            scheduler: ca.issue(&LeafSpec::client("system:kube-scheduler", None), now)?,
            scheduler_serving: ca.issue(
                &LeafSpec::server("kube-scheduler", &["localhost"], &[loopback]),
                now,
            )?,
            apiserver,
            service_account_key_pem: sa.serialize_pem(),
            service_account_pub_pem: sa.public_key_pem(),
            ca: ca.cert_key().clone(),
            front_proxy_ca: front_proxy_ca.cert_key().clone(),
        })
    }

    /// File name and content of every PEM file, as written under `<state>/pki/`.
    pub fn files(&self) -> Vec<(String, &str)> {
        let mut files = Vec::new();
        for (name, pair) in [
            ("ca", &self.ca),
            ("front-proxy-ca", &self.front_proxy_ca),
            ("apiserver", &self.apiserver),
            ("front-proxy-client", &self.front_proxy_client),
            ("admin", &self.admin),
            ("controller-manager", &self.controller_manager),
            (
                "controller-manager-serving",
                &self.controller_manager_serving,
            ),
            ("scheduler", &self.scheduler),
            ("scheduler-serving", &self.scheduler_serving),
        ] {
            files.push((format!("{name}.crt"), pair.cert_pem.as_str()));
            files.push((format!("{name}.key"), pair.key_pem.as_str()));
        }
        files.push(("sa.key".to_owned(), self.service_account_key_pem.as_str()));
        files.push(("sa.pub".to_owned(), self.service_account_pub_pem.as_str()));
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    fn parse(pem: &str) -> Vec<u8> {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        p.contents
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    #[test]
    fn apiserver_certificate_is_signed_by_the_ca_and_names_every_address() {
        let ip: IpAddr = [10, 96, 0, 1].into();
        let pki = ClusterPki::generate(&[[127, 0, 0, 1].into(), ip], now()).unwrap();
        let ca_der = parse(&pki.ca.cert_pem);
        let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
        let der = parse(&pki.apiserver.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        cert.verify_signature(Some(ca.public_key())).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        for name in &san.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) => {
                    ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()))
                }
                _ => {}
            }
        }
        assert!(dns.iter().any(|d| d == "kubernetes.default.svc"), "{dns:?}");
        assert!(dns.iter().any(|d| d == "localhost"), "{dns:?}");
        assert_eq!(ips, [IpAddr::from([127, 0, 0, 1]), ip]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
    }

    #[test]
    fn client_certificates_carry_user_as_cn_and_group_as_o() {
        let ca = Ca::new("test-ca", now()).unwrap();
        let pair = ca
            .issue(&LeafSpec::client("alice", Some("view")), now())
            .unwrap();
        let der = parse(&pair.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap())
            .collect();
        let o: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["alice"]);
        assert_eq!(o, ["view"]);
        assert!(
            cert.extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .client_auth
        );
    }

    #[test]
    fn lifetimes_are_bounded() {
        let ca = Ca::new("test-ca", now()).unwrap();
        let leaf = ca.issue(&LeafSpec::client("bob", None), now()).unwrap();
        for (pem, max) in [
            (&ca.cert_key().cert_pem, CA_VALIDITY),
            (&leaf.cert_pem, LEAF_VALIDITY),
        ] {
            let der = parse(pem);
            let (_, cert) = X509Certificate::from_der(&der).unwrap();
            let not_after = cert.validity().not_after.timestamp();
            assert!(not_after <= (now() + max).unix_timestamp());
            assert!(not_after > now().unix_timestamp());
        }
    }

    #[test]
    fn every_ca_is_distinct_and_keys_are_pkcs8() {
        let pki = ClusterPki::generate(&[[127, 0, 0, 1].into()], now()).unwrap();
        assert_ne!(pki.ca.cert_pem, pki.front_proxy_ca.cert_pem);
        let files = pki.files();
        assert_eq!(files.len(), 20);
        assert!(
            files
                .iter()
                .filter(|(n, _)| n.ends_with(".key"))
                .all(|(_, pem)| pem.starts_with("-----BEGIN PRIVATE KEY"))
        );
        assert!(
            pki.service_account_pub_pem
                .starts_with("-----BEGIN PUBLIC KEY")
        );
    }
}
