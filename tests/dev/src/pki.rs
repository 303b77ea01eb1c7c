//! The host cluster's PKI, built from `vcp_pki` (pure: values in, PEM strings out).
//!
//! One cluster CA signs the apiserver's serving certificate, the serving certificates of the
//! controller-manager and scheduler (so their health endpoints are verified, not trusted
//! blindly) and one client certificate per component, each with its own identity, as
//! kubeadm lays it out. A separate front-proxy CA serves the aggregation layer, and an ECDSA
//! key pair signs service-account tokens. Every certificate has a bounded lifetime.

use crate::Result;
use std::net::IpAddr;
use time::{Duration, OffsetDateTime};
pub use vcp_pki::{Ca, CertKey, LeafSpec, new_token, service_account_key};

/// Lifetime of the dev cluster's CAs.
pub const CA_VALIDITY: Duration = Duration::days(365);
/// Lifetime of leaf certificates.
pub const LEAF_VALIDITY: Duration = Duration::days(90);

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
    /// The apiserver's client certificate towards kubelets ([`vcp_pki::KUBELET_CLIENT_USER`]).
    pub kubelet_client: CertKey,
    /// A kubelet API's serving certificate on the loopback: kwok's in the host cluster, the
    /// syncer's kubelet endpoint in a tenant (which also serves the tenant's metrics.k8s.io
    /// under its tenant Service's name, [`TENANT_METRICS_NAME`]).
    pub kubelet_serving: CertKey,
    /// metrics-server's serving certificate, by the name the host apiserver verifies
    /// ([`METRICS_SERVER_NAME`]).
    pub metrics_serving: CertKey,
    pub service_account_key_pem: String,
    pub service_account_pub_pem: String,
}

/// The name the host apiserver verifies metrics-server's certificate by: its Service's.
pub const METRICS_SERVER_NAME: &str = "metrics-server.kube-system.svc";
/// The name a tenant apiserver verifies the syncer's metrics API by: the tenant Service
/// `kube-system/vcp-metrics`.
pub const TENANT_METRICS_NAME: &str = "vcp-metrics.kube-system.svc";

/// The kubelet serving certificate's specification (also used to top up old state dirs).
pub fn kubelet_serving_spec() -> LeafSpec {
    LeafSpec::server(
        "kubelet",
        vec!["localhost".to_owned(), TENANT_METRICS_NAME.to_owned()],
        vec![[127, 0, 0, 1].into()],
    )
}

/// metrics-server's serving certificate's specification.
pub fn metrics_serving_spec() -> LeafSpec {
    LeafSpec::server(
        "metrics-server",
        vec!["localhost".to_owned(), METRICS_SERVER_NAME.to_owned()],
        vec![[127, 0, 0, 1].into()],
    )
}

/// Identities used by the host control plane's clients.
pub const ADMIN_USER: &str = "vcp-dev-admin";

impl ClusterPki {
    /// Generates a complete PKI. `api_ips` are the addresses the apiserver is reached at (the
    /// loopback, the Service ClusterIP of `kubernetes`, the advertise address).
    pub fn generate(api_ips: &[IpAddr], now: OffsetDateTime) -> Result<ClusterPki> {
        let ca = Ca::generate("vcp-dev-ca", now, CA_VALIDITY)?;
        let front_proxy_ca = Ca::generate("vcp-dev-front-proxy-ca", now, CA_VALIDITY)?;
        let loopback: IpAddr = [127, 0, 0, 1].into();
        let localhost = || vec!["localhost".to_owned()];
        let leaf = |ca: &Ca, spec: LeafSpec| ca.issue(&spec, now, LEAF_VALIDITY);
        let api_names = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        let apiserver = leaf(
            &ca,
            LeafSpec::server(
                "kube-apiserver",
                api_names.iter().map(|n| (*n).to_owned()).collect(),
                api_ips.to_vec(),
            ),
        )?;
        let (sa_key, sa_pub) = service_account_key()?;
        Ok(ClusterPki {
            front_proxy_client: leaf(&front_proxy_ca, LeafSpec::client("front-proxy-client", &[]))?,
            admin: leaf(&ca, LeafSpec::client(ADMIN_USER, &["system:masters"]))?,
            controller_manager: leaf(&ca, LeafSpec::client("system:kube-controller-manager", &[]))?,
            controller_manager_serving: leaf(
                &ca,
                LeafSpec::server("kube-controller-manager", localhost(), vec![loopback]),
            )?,
            scheduler: leaf(&ca, LeafSpec::client("system:kube-scheduler", &[]))?,
            scheduler_serving: leaf(
                &ca,
                LeafSpec::server("kube-scheduler", localhost(), vec![loopback]),
            )?,
            kubelet_client: leaf(&ca, LeafSpec::client(vcp_pki::KUBELET_CLIENT_USER, &[]))?,
            kubelet_serving: leaf(&ca, kubelet_serving_spec())?,
            metrics_serving: leaf(&ca, metrics_serving_spec())?,
            apiserver,
            service_account_key_pem: sa_key,
            service_account_pub_pem: sa_pub,
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
            ("kubelet-client", &self.kubelet_client),
            ("kubelet-serving", &self.kubelet_serving),
            ("metrics-serving", &self.metrics_serving),
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
        let ca = Ca::generate("test-ca", now(), CA_VALIDITY).unwrap();
        let pair = ca
            .issue(&LeafSpec::client("alice", &["view"]), now(), LEAF_VALIDITY)
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
        let ca = Ca::generate("test-ca", now(), CA_VALIDITY).unwrap();
        let leaf = ca
            .issue(&LeafSpec::client("bob", &[]), now(), LEAF_VALIDITY)
            .unwrap();
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
        assert_eq!(files.len(), 26);
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
