//! Client certificates with several groups, written by hand (pure).
//!
//! Kubernetes reads a client certificate's groups from every O attribute of its subject, but
//! rcgen keeps one value per attribute type, so a certificate for `alice` in `view` and `ops`
//! cannot come out of it. This writes the X.509 structure itself (RFC 5280) with yasna and
//! signs it with the CA's key through rcgen's signer: ECDSA P-256 with SHA-256, the same
//! algorithm rcgen uses for every key here.

use crate::{CertKey, PkiError, hex};
use rcgen::{KeyPair, PublicKeyData, SigningKey};
use time::{Duration, OffsetDateTime};
use yasna::models::{ObjectIdentifier, UTCTime};
use yasna::{DERWriter, Tag};

const ECDSA_WITH_SHA256: &[u64] = &[1, 2, 840, 10045, 4, 3, 2];
const ORGANIZATION: &[u64] = &[2, 5, 4, 10];
const COMMON_NAME: &[u64] = &[2, 5, 4, 3];
const KEY_USAGE: &[u64] = &[2, 5, 29, 15];
const EXT_KEY_USAGE: &[u64] = &[2, 5, 29, 37];
const BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];
const AUTHORITY_KEY_ID: &[u64] = &[2, 5, 29, 35];
const CLIENT_AUTH: &[u64] = &[1, 3, 6, 1, 5, 5, 7, 3, 2];

fn oid(parts: &[u64]) -> ObjectIdentifier {
    ObjectIdentifier::from_slice(parts)
}

fn algorithm(w: DERWriter) {
    w.write_sequence(|w| w.next().write_oid(&oid(ECDSA_WITH_SHA256)));
}

fn extension(w: &mut yasna::DERWriterSeq, id: &[u64], critical: bool, value: Vec<u8>) {
    w.next().write_sequence(|w| {
        w.next().write_oid(&oid(id));
        if critical {
            w.next().write_bool(true);
        }
        w.next().write_bytes(&value);
    });
}

/// Issues a client certificate for `user` in every one of `groups`, signed by the CA.
pub fn issue(
    ca: &CertKey,
    user: &str,
    groups: &[String],
    serial: Option<[u8; 16]>,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CertKey, PkiError> {
    let bad = || PkiError::Parse("issuing CA".into());
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).map_err(|_| bad())?;
    let ca_cert = pem.parse_x509().map_err(|_| bad())?;
    let issuer = ca_cert.tbs_certificate.subject.as_raw().to_vec();
    let ca_key_id = ca_cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
            _ => None,
        });
    let key = KeyPair::generate()?;
    let serial = match serial {
        Some(s) => s,
        None => crate::new_serial()?,
    };
    // UTCTime has whole seconds and two-digit years (RFC 5280 wants it before 2050).
    let whole = |t: OffsetDateTime| t.replace_nanosecond(0).map_err(|_| bad());
    let (start, end) = (whole(now - Duration::minutes(5))?, whole(now + validity)?);
    if end.year() >= 2050 {
        return Err(PkiError::Parse("a validity past 2049".into()));
    }
    let not_before = UTCTime::from_datetime(start);
    let not_after = UTCTime::from_datetime(end);
    let spki = key.subject_public_key_info();

    let tbs = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_tagged(Tag::context(0), |w| w.write_u8(2));
            w.next().write_bigint_bytes(&serial, true);
            algorithm(w.next());
            w.next().write_der(&issuer);
            w.next().write_sequence(|w| {
                w.next().write_utctime(&not_before);
                w.next().write_utctime(&not_after);
            });
            w.next().write_sequence(|w| {
                for g in groups {
                    w.next().write_set(|w| {
                        w.next().write_sequence(|w| {
                            w.next().write_oid(&oid(ORGANIZATION));
                            w.next().write_utf8_string(g);
                        });
                    });
                }
                w.next().write_set(|w| {
                    w.next().write_sequence(|w| {
                        w.next().write_oid(&oid(COMMON_NAME));
                        w.next().write_utf8_string(user);
                    });
                });
            });
            w.next().write_der(&spki);
            w.next().write_tagged(Tag::context(3), |w| {
                w.write_sequence(|w| {
                    // digitalSignature and keyEncipherment: bits 0 and 2.
                    extension(
                        w,
                        KEY_USAGE,
                        true,
                        yasna::construct_der(|w| w.write_bitvec_bytes(&[0b1010_0000], 3)),
                    );
                    extension(
                        w,
                        EXT_KEY_USAGE,
                        false,
                        yasna::construct_der(|w| {
                            w.write_sequence(|w| w.next().write_oid(&oid(CLIENT_AUTH)))
                        }),
                    );
                    extension(
                        w,
                        BASIC_CONSTRAINTS,
                        true,
                        yasna::construct_der(|w| w.write_sequence(|_| {})),
                    );
                    if let Some(id) = &ca_key_id {
                        extension(
                            w,
                            AUTHORITY_KEY_ID,
                            false,
                            yasna::construct_der(|w| {
                                w.write_sequence(|w| {
                                    w.next().write_tagged_implicit(Tag::context(0), |w| {
                                        w.write_bytes(id)
                                    })
                                })
                            }),
                        );
                    }
                });
            });
        });
    });
    let signature = ca_key.sign(&tbs)?;
    let der = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_der(&tbs);
            algorithm(w.next());
            w.next().write_bitvec_bytes(&signature, signature.len() * 8);
        });
    });
    let cert_pem = pem_encode("CERTIFICATE", &der);
    debug_assert!(!hex(&serial).is_empty());
    Ok(CertKey {
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ca, inspect};

    #[test]
    fn every_group_is_an_organization_and_the_ca_signature_verifies() {
        // Sub-second precision, as the clock gives it.
        let now = OffsetDateTime::from_unix_timestamp_nanos(1_790_000_000_123_456_789).unwrap();
        let ca = Ca::generate("tenant-ca", now, Duration::days(365)).unwrap();
        let groups = vec!["view".to_owned(), "ops".to_owned(), "team a".to_owned()];
        let leaf = issue(
            ca.cert_key(),
            "alice",
            &groups,
            None,
            now,
            Duration::hours(2),
        )
        .unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(leaf.cert_pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        let orgs: Vec<&str> = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(orgs, ["view", "ops", "team a"]);
        let cn: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["alice"]);
        let (_, ca_pem) =
            x509_parser::pem::parse_x509_pem(ca.cert_key().cert_pem.as_bytes()).unwrap();
        let ca_cert = ca_pem.parse_x509().unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(cert.issuer(), ca_cert.subject());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(!cert.is_ca());
        let info = inspect("alice", &leaf.cert_pem).unwrap();
        assert_eq!(
            info.not_after,
            (now + Duration::hours(2)).replace_nanosecond(0).unwrap()
        );
        // A different CA's signature does not verify.
        let other = Ca::generate("other", now, Duration::days(365)).unwrap();
        let (_, other_pem) =
            x509_parser::pem::parse_x509_pem(other.cert_key().cert_pem.as_bytes()).unwrap();
        assert!(
            cert.verify_signature(Some(other_pem.parse_x509().unwrap().public_key()))
                .is_err()
        );
    }
}
