//! Tenant PKI: which certificates a tenant's control plane needs, built from [`vcp_pki`].
//!
//! Each tenant gets three CAs (cluster, etcd, front proxy) and a service-account key pair,
//! generated once and kept in Secrets of its control-plane namespace. Leaf certificates are
//! declared by [`plan`]: what each component needs, signed by which CA, with which names. The
//! provisioner compares each leaf's Secret against its plan (by [`LeafSpec::digest`]) and its
//! remaining lifetime ([`needs_renewal`]) and reissues it when either says so, which is how
//! certificates rotate without anyone asking. [`seal`] seals the keys the inventory keeps (the
//! tenants' etcd encryption keys) with the inventory key.

pub mod rotation;
pub mod seal;

use std::net::IpAddr;
use time::Duration;
pub use vcp_pki::*;

/// Lifetime of a tenant's CAs.
pub const CA_VALIDITY: Duration = Duration::days(5 * 365);
/// Lifetime of component certificates; renewed when a third of it is left.
pub const LEAF_VALIDITY: Duration = Duration::days(365);

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
    /// The tenant's etcd user on a shared datastore ([`crate::render::datastore::user`]):
    /// its apiserver's etcd client certificate names it and the datastore's CA signs it
    /// ([`DATASTORE_CA`]); the tenant has no etcd certificate of its own. `None`: its own etcd.
    pub datastore_user: Option<String>,
}

/// The signer of a shared-datastore tenant's etcd client certificate: the datastore's CA,
/// which vcp keeps in the datastore's namespace, not the tenant's.
pub const DATASTORE_CA: &str = "datastore-ca";
/// The leaf (and Secret) with no common name that vcp's Jobs reach a tenant's datastore with.
pub const DATASTORE_CLIENT: &str = "datastore-client";
/// That leaf's organization: what names it in etcd's and the host's logs.
pub const DATASTORE_CLIENT_ORGANIZATION: &str = "vcp:datastore-tenant";

/// User the orchestrator itself uses inside a tenant (bootstrap, readiness).
pub const ORCHESTRATOR_USER: &str = "vcp:orchestrator";
/// User of the tenant's syncer.
pub const SYNCER_USER: &str = "vcp:syncer";
/// User of the tenant's CoreDNS.
pub const COREDNS_USER: &str = "vcp:coredns";
/// Common name of the etcd members' certificate, the only one etcd admits on its peer port.
pub const ETCD_PEER_CN: &str = "etcd";

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
    let mut etcd = LeafSpec::server(ETCD_PEER_CN, etcd_dns, vec![loopback]);
    // One certificate serves clients and peers: peers authenticate each other with it too.
    etcd.client = true;
    let etcd_leaves = match &n.datastore_user {
        None => vec![
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
        ],
        Some(user) => vec![
            LeafPlan {
                name: "apiserver-etcd-client",
                ca: DATASTORE_CA,
                spec: LeafSpec::client(user, &[]),
            },
            // vcp's snapshot Jobs speak etcd's JSON gateway, which refuses a certificate that
            // names a user once authentication is on: theirs names none, and the user is who
            // its password says (`tenant_password` of the datastore's names).
            LeafPlan {
                name: DATASTORE_CLIENT,
                ca: DATASTORE_CA,
                spec: LeafSpec::client("", &[DATASTORE_CLIENT_ORGANIZATION]),
            },
        ],
    };
    etcd_leaves
        .into_iter()
        .chain([
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
            // The apiserver's client towards kubelets: the syncer's kubelet endpoint admits only
            // this name, and the endpoint's serving certificate names the syncer's Service, which
            // virtual nodes give as their address (the apiserver verifies it with the tenant CA).
            LeafPlan {
                name: "apiserver-kubelet-client",
                ca: "ca",
                spec: LeafSpec::client(KUBELET_CLIENT_USER, &[]),
            },
            LeafPlan {
                name: "syncer-kubelet",
                ca: "ca",
                // Also the name the tenant apiserver verifies when it passes on a metrics.k8s.io
                // request (the tenant Service of its APIService, see the syncer's `top`).
                spec: LeafSpec::server(
                    "vcp-syncer",
                    svc_names("vcp-syncer")
                        .into_iter()
                        .chain([format!(
                            "{}.{}.svc",
                            vcp_policy::services::METRICS_SERVICE.1,
                            vcp_policy::services::METRICS_SERVICE.0
                        )])
                        .collect(),
                    vec![loopback],
                ),
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
        ])
        .collect()
}

/// A Secret's value under key `k` as text: how the tenant's certificates and keys are read
/// back from the Secrets that hold them (the pass, rotations and kubeconfig signing).
pub fn secret_str(s: &k8s_openapi::api::core::v1::Secret, k: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(k)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::time::OffsetDateTime;
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
            datastore_user: None,
        }
    }

    fn parse(pem: &str) -> Vec<u8> {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        p.contents
    }

    #[test]
    fn leaves_are_signed_by_their_ca_with_the_planned_names_and_usages() {
        let ca = Ca::generate("tenant-ca", now(), CA_VALIDITY).unwrap();
        let plan = plan(&names());
        let api = plan.iter().find(|p| p.name == "apiserver").unwrap();
        let leaf = ca.issue(&api.spec, now(), LEAF_VALIDITY).unwrap();
        let der = parse(&leaf.cert_pem);
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let ca_der = parse(&ca.cert_key().cert_pem);
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
    fn the_kubelet_pair_is_the_apiservers_client_and_the_syncers_service() {
        let plan = plan(&names());
        let client = plan
            .iter()
            .find(|p| p.name == "apiserver-kubelet-client")
            .unwrap();
        assert_eq!(
            (client.ca, client.spec.client, client.spec.server),
            ("ca", true, false)
        );
        assert_eq!(client.spec.common_name, KUBELET_CLIENT_USER);
        let serving = plan.iter().find(|p| p.name == "syncer-kubelet").unwrap();
        assert_eq!(
            (serving.ca, serving.spec.server, serving.spec.client),
            ("ca", true, false)
        );
        assert!(
            serving
                .spec
                .dns_names
                .contains(&"vcp-syncer.vcp-demoabc123.svc".to_owned()),
            "virtual nodes name the syncer by its Service: {:?}",
            serving.spec.dns_names
        );
        assert!(
            serving
                .spec
                .dns_names
                .contains(&"vcp-metrics.kube-system.svc".to_owned()),
            "the tenant apiserver verifies the metrics API by its tenant Service: {:?}",
            serving.spec.dns_names
        );
        let names: std::collections::BTreeSet<_> = plan.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), plan.len(), "one Secret per leaf");
    }

    #[test]
    fn a_tenant_on_a_shared_datastore_has_a_client_certificate_from_it_and_no_etcd() {
        let n = ApiNames {
            datastore_user: Some("tenant-demoabc123".into()),
            ..names()
        };
        let plan = plan(&n);
        assert!(plan.iter().all(|l| l.name != "etcd"));
        let client = plan
            .iter()
            .find(|l| l.name == "apiserver-etcd-client")
            .unwrap();
        assert_eq!(client.ca, DATASTORE_CA);
        assert_eq!(client.spec.common_name, "tenant-demoabc123");
        assert!(client.spec.client && !client.spec.server);
        let jobs = plan.iter().find(|l| l.name == DATASTORE_CLIENT).unwrap();
        assert_eq!(jobs.ca, DATASTORE_CA);
        assert!(jobs.spec.common_name.is_empty() && jobs.spec.client && !jobs.spec.server);
    }
}
