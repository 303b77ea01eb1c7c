//! Certificates for vcp, with rcgen (pure: values in, PEM out; no I/O).
//!
//! A [`Ca`] is generated once (or loaded back from where its owner keeps it) and issues leaf
//! certificates described by a [`LeafSpec`]: the user or server name, Kubernetes groups, the
//! names and addresses a server answers at, and the usages. [`inspect`] reads back what the
//! inventory records (serial, fingerprint, subject, validity) and [`needs_renewal`] decides
//! rotation. The orchestrator builds tenant PKIs from these parts and the dev harness builds
//! the host cluster's; neither holds a certificate routine of its own. [`new_token`] makes the
//! random bearer secrets of the platform API, and [`random_bytes`] any other random secret
//! (the tenants' etcd encryption keys).

pub mod groups;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use time::{Duration, OffsetDateTime};

/// The user a kube-apiserver calls kubelets as (`--kubelet-client-certificate`): the only
/// client a tenant's kubelet endpoint (its syncer) admits, and the host apiserver's own in the
/// dev cluster.
pub const KUBELET_CLIENT_USER: &str = "vcp:apiserver-kubelet-client";

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

/// Result with the PKI's error.
pub type Result<T, E = PkiError> = std::result::Result<T, E>;

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

/// A fresh random certificate serial: positive, 16 bytes without a leading zero byte (so
/// its DER and hex forms have fixed lengths).
pub fn new_serial() -> Result<[u8; 16]> {
    let mut serial = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut serial)
        .map_err(|_| PkiError::Parse("random serial".into()))?;
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    Ok(serial)
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
    /// The certificate's serial, when the caller must know it before signing (a kubeconfig
    /// names its own serial in a group); otherwise a random one.
    pub serial: Option<[u8; 16]>,
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
    // No common name at all when none is asked for (not an empty one): etcd's JSON gateway
    // refuses a client certificate that names one once authentication is on.
    if !common_name.is_empty() {
        dn.push(DnType::CommonName, common_name);
    }
    if let Some(g) = groups.first() {
        dn.push(DnType::OrganizationName, g.as_str());
    }
    dn
}

impl Ca {
    /// A new self-signed CA valid for `validity` from `now`. It signs leaves only (path
    /// length 0): no intermediate CAs anywhere in vcp.
    pub fn generate(common_name: &str, now: OffsetDateTime, validity: Duration) -> Result<Ca> {
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
        params.not_after = now + validity;
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
            return groups::issue(
                &self.pair,
                &spec.common_name,
                &spec.groups,
                spec.serial,
                now,
                validity,
            );
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
        if let Some(serial) = spec.serial {
            params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
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

/// `N` bytes from the system's secure random source (key material, nonces, tokens).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system random source works");
    b
}

/// A new random bearer token: `vcp_` and 64 hex characters (256 bits).
pub fn new_token() -> String {
    format!("vcp_{}", hex(&random_bytes::<32>()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    const CA_VALIDITY: Duration = Duration::days(5 * 365);
    const LEAF_VALIDITY: Duration = Duration::days(365);

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap()
    }

    fn parse(pem: &str) -> (Vec<u8>, String) {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let subject = p.parse_x509().unwrap().subject().to_string();
        (p.contents, subject)
    }

    #[test]
    fn a_client_without_a_name_has_no_common_name_attribute() {
        let ca = Ca::generate("ds-ca", now(), CA_VALIDITY).unwrap();
        let leaf = ca
            .issue(
                &LeafSpec::client("", &["vcp:datastore-admin"]),
                now(),
                LEAF_VALIDITY,
            )
            .unwrap();
        let (_, subject) = parse(&leaf.cert_pem);
        assert_eq!(subject, "O=vcp:datastore-admin");
        let named = ca
            .issue(&LeafSpec::client("root", &[]), now(), LEAF_VALIDITY)
            .unwrap();
        assert_eq!(parse(&named.cert_pem).1, "CN=root");
    }

    #[test]
    fn a_loaded_ca_issues_like_the_generated_one() {
        let ca = Ca::generate("tenant-ca", now(), CA_VALIDITY).unwrap();
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
        let ca = Ca::generate("c", now(), CA_VALIDITY).unwrap();
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
    fn a_serial_chosen_before_signing_is_the_certificates_serial_on_both_paths() {
        let ca = Ca::generate("c", now(), CA_VALIDITY).unwrap();
        for groups in [&["one"][..], &["one", "two"]] {
            let serial = new_serial().unwrap();
            let spec = LeafSpec {
                serial: Some(serial),
                ..LeafSpec::client("u", groups)
            };
            let leaf = ca.issue(&spec, now(), LEAF_VALIDITY).unwrap();
            let info = inspect("u", &leaf.cert_pem).unwrap();
            assert_eq!(info.serial, hex(&serial), "{groups:?}");
            assert_eq!(info.serial.len(), 32);
        }
        // Unasked, serials are random.
        let a = ca
            .issue(&LeafSpec::client("u", &[]), now(), LEAF_VALIDITY)
            .unwrap();
        let b = ca
            .issue(&LeafSpec::client("u", &[]), now(), LEAF_VALIDITY)
            .unwrap();
        assert_ne!(
            inspect("a", &a.cert_pem).unwrap().serial,
            inspect("b", &b.cert_pem).unwrap().serial
        );
    }

    #[test]
    fn several_groups_are_all_kept_never_silently_dropped() {
        let ca = Ca::generate("c", now(), CA_VALIDITY).unwrap();
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
        let ca = Ca::generate("c", now(), CA_VALIDITY).unwrap();
        let printed = format!("{:?}", ca.cert_key());
        assert!(!printed.contains("PRIVATE KEY"), "{printed}");
    }
}

#[cfg(test)]
mod ca_tests {
    use super::*;
    use x509_parser::prelude::*;

    #[test]
    fn cas_sign_leaves_only_and_leaves_cannot_sign() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let ca = Ca::generate("c", now, Duration::days(30)).unwrap();
        let leaf = ca
            .issue(&LeafSpec::client("u", &["g"]), now, Duration::days(1))
            .unwrap();
        let der = |pem: &str| {
            x509_parser::pem::parse_x509_pem(pem.as_bytes())
                .unwrap()
                .1
                .contents
        };
        let ca_der = der(&ca.cert_key().cert_pem);
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        let bc = ca_cert.basic_constraints().unwrap().unwrap().value;
        assert!(bc.ca);
        assert_eq!(bc.path_len_constraint, Some(0), "no intermediate CAs");
        let ku = ca_cert.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.crl_sign());
        let leaf_der = der(&leaf.cert_pem);
        let (_, leaf_cert) = X509Certificate::from_der(&leaf_der).unwrap();
        assert!(
            leaf_cert
                .basic_constraints()
                .unwrap()
                .is_none_or(|b| !b.value.ca)
        );
        let ku = leaf_cert.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && !ku.key_cert_sign());
    }
}

#[cfg(test)]
mod token_tests {
    #[test]
    fn tokens_are_long_random_and_distinct() {
        let (a, b) = (super::new_token(), super::new_token());
        assert!(a.starts_with("vcp_") && a.len() == 68, "{a}");
        assert_ne!(a, b);
    }
}
