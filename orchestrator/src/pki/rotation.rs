//! Rotating a tenant's CAs and service-account key without downtime (pure: no client, no pool).
//!
//! An admin asks for a rotation of one target; the inventory keeps its phase, and each
//! provisioner pass turns that phase into key material in the target's host Secret, renders
//! every component from it, and advances the phase once the whole control plane is Ready with
//! it and no pod that predates it still runs. The Secret keeps the pair in use
//! (`tls.crt`/`tls.key`, or `sa.key`/`sa.pub`) and, while a rotation runs, the next pair beside
//! it (`next.*`), with the phase as an annotation, so a Secret always says by itself what to
//! trust and what signs:
//!
//! | phase    | trusted      | signs leaves and tokens                                  |
//! | -------- | ------------ | -------------------------------------------------------- |
//! | `trust`  | old and new  | old                                                      |
//! | `sign`   | old and new  | new (the tenant apiserver's serving certificate: old)    |
//! | `serve`  | old and new  | new                                                      |
//! | `retire` | new          | new (the pair in use is now the new one; `next.*` gone)  |
//!
//! Every component trusts the new pair before anything is signed with it, and everything is
//! signed with it before the old one stops being trusted, so no connection between components
//! ever meets a certificate or token its peer does not trust. `sign` lasts at least the
//! rotation's overlap: the time users have to fetch new kubeconfigs before the serving
//! certificate moves to the new CA in `serve` (kubeconfigs issued before `sign` hold only the old
//! CA), and the time a service-account token signed by the old key may still be in use. Tenant
//! pods' tokens do not wait for it: the syncer reissues them whenever the token generation
//! ([`token_generation`]) changes, and a phase advances only once every pod's token is of the
//! current generation.

use super::{Ca, CertKey, secret_str};
use crate::Result;
use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use time::Duration;

/// What can be rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// The cluster CA: the apiserver's serving and client CA, every component's client
    /// certificate, the kubelet pair and every user kubeconfig.
    Ca,
    /// etcd's serving, peer and client CA.
    EtcdCa,
    /// The CA of the apiserver's front-proxy client (aggregated APIs: the metrics API).
    FrontProxyCa,
    /// The key that signs and verifies service-account tokens.
    ServiceAccountKey,
    /// The key the tenant apiserver encrypts Secrets with in etcd (`crate::render::encryption`).
    /// Its phases: `trust` (the new key decrypts), `sign` (the new key encrypts), `serve` (every
    /// object is rewritten with it), `retire` (the old key is dropped).
    EncryptionKey,
}

impl Target {
    pub const ALL: [Target; 5] = [
        Target::Ca,
        Target::EtcdCa,
        Target::FrontProxyCa,
        Target::ServiceAccountKey,
        Target::EncryptionKey,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Target::Ca => "ca",
            Target::EtcdCa => "etcd-ca",
            Target::FrontProxyCa => "front-proxy-ca",
            Target::ServiceAccountKey => "service-account-key",
            Target::EncryptionKey => "encryption-key",
        }
    }

    /// The host Secret (in the control-plane namespace) that keeps its pairs (for the
    /// encryption key: the configuration rendered from the inventory, which keeps the keys).
    pub fn secret(self) -> &'static str {
        match self {
            Target::Ca => "ca",
            Target::EtcdCa => "etcd-ca",
            Target::FrontProxyCa => "front-proxy-ca",
            Target::ServiceAccountKey => "sa",
            Target::EncryptionKey => ENCRYPTION_SECRET,
        }
    }

    /// How long `sign` lasts unless the request says otherwise: a day for users to fetch new
    /// kubeconfigs, the longest token lifetime for the service-account key, nothing for CAs
    /// no one outside the control plane holds, nor for the encryption key, which no one
    /// outside the apiserver holds.
    pub fn default_overlap(self) -> Duration {
        match self {
            Target::Ca => Duration::hours(24),
            Target::ServiceAccountKey => MAX_TOKEN_LIFETIME,
            Target::EtcdCa | Target::FrontProxyCa | Target::EncryptionKey => Duration::ZERO,
        }
    }
}

/// The host Secret with the tenant apiserver's encryption configuration (rendered by
/// `crate::render::encryption` from the keys the inventory keeps).
pub const ENCRYPTION_SECRET: &str = "encryption-config";

/// The longest lifetime the tenant apiserver gives a service-account token
/// (`--service-account-max-token-expiration`, without extension): how long a token signed by a
/// retired key could otherwise still be presented.
pub const MAX_TOKEN_LIFETIME: Duration = Duration::hours(24);

/// The longest overlap a request may ask for.
pub const MAX_OVERLAP: Duration = Duration::days(30);

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Target, String> {
        Target::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!("unknown rotation target {s:?}: expected ca, etcd-ca, front-proxy-ca, service-account-key or encryption-key")
            })
    }
}

/// Where a rotation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Trust,
    Sign,
    Serve,
    Retire,
    Done,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Trust => "trust",
            Phase::Sign => "sign",
            Phase::Serve => "serve",
            Phase::Retire => "retire",
            Phase::Done => "done",
        }
    }

    /// Whether the Secret holds a next pair in this phase.
    pub fn has_next(self) -> bool {
        matches!(self, Phase::Trust | Phase::Sign | Phase::Serve)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Phase, String> {
        [
            Phase::Trust,
            Phase::Sign,
            Phase::Serve,
            Phase::Retire,
            Phase::Done,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| format!("unknown rotation phase {s:?}"))
    }
}

/// Annotation of a CA or key Secret: the phase its next pair is in.
pub const ANN_PHASE: &str = "vcp.dev/rotation-phase";

/// What the provisioner makes of a target's Secret for a rotation in `phase`, given whether it
/// holds a next pair now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretChange {
    /// Generate a next pair (keep it if one is there) and annotate the phase.
    Next(Phase),
    /// The next pair becomes the pair in use; `next.*` and the annotation go.
    Swap,
    /// Nothing to do.
    Keep,
}

pub fn secret_change(phase: Phase, has_next: bool) -> SecretChange {
    match (phase.has_next(), has_next) {
        (true, _) => SecretChange::Next(phase),
        (false, true) => SecretChange::Swap,
        (false, false) => SecretChange::Keep,
    }
}

/// Which pair signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    Current,
    Next,
}

/// Which pair signs in `phase` (`None`: no rotation under way). `held_by_users`: the
/// certificate is verified by kubeconfigs already handed out (the apiserver's serving
/// certificate), which hold only the old CA until they are reissued.
pub fn signer(phase: Option<Phase>, held_by_users: bool) -> Signer {
    match phase {
        Some(Phase::Sign) if !held_by_users => Signer::Next,
        Some(Phase::Serve) => Signer::Next,
        _ => Signer::Current,
    }
}

/// The certificates (or public keys) to trust: the pair in use and the next one, if any, as
/// one PEM bundle.
pub fn trusted(current: &str, next: Option<&str>) -> String {
    let mut out = String::new();
    for pem in std::iter::once(current).chain(next) {
        out.push_str(pem.trim_end());
        out.push('\n');
    }
    out
}

/// What a phase waits for before the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Every component runs with this phase's material and is Ready.
    pub ready: bool,
    /// Every tenant pod holds a token (and CA bundle) of this phase's generation.
    pub tokens_current: bool,
    /// A control-plane pod that a roll replaced still runs (it is terminating): it holds an
    /// earlier phase's material and may still answer, since the apiserver keeps serving
    /// through its shutdown delay and finishes what it accepted. Its replacement being Ready
    /// is not enough: the next phase would sign with, or stop trusting, what it does not
    /// trust or present.
    pub replaced_running: bool,
    /// How long the rotation has been in this phase.
    pub in_phase: Duration,
    /// The rotation's overlap (how long `sign` lasts at least).
    pub overlap: Duration,
    /// Everything written with the old material has been written again with the new one (an
    /// encryption key's storage migration, done in `serve`; always true for other targets,
    /// whose old material leaves nothing behind in storage).
    pub rewritten: bool,
}

/// The phase after `phase`, if it may start now.
pub fn advance(phase: Phase, p: &Progress) -> Option<Phase> {
    if !p.ready || !p.tokens_current || p.replaced_running {
        return None;
    }
    match phase {
        Phase::Trust => Some(Phase::Sign),
        Phase::Sign if p.in_phase >= p.overlap => Some(Phase::Serve),
        Phase::Sign => None,
        // The old key is dropped only once nothing is stored under it any more.
        Phase::Serve if !p.rewritten => None,
        Phase::Serve => Some(Phase::Retire),
        Phase::Retire => Some(Phase::Done),
        Phase::Done => None,
    }
}

/// The token generation: a digest of everything a pod's token and CA bundle depend on (the
/// cluster CA bundle, the trusted service-account keys and the signing one). The syncer
/// reissues every token issued under another.
pub fn token_generation(ca_bundle: &str, trusted_keys: &str, signing_key_public: &str) -> String {
    let mut h = Sha256::new();
    for part in [ca_bundle, trusted_keys, signing_key_public] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    crate::pki::hex(&h.finalize()[..8])
}

/// A short digest of a PEM text, for annotations that say which pair signed a leaf.
pub fn fingerprint(pem: &str) -> String {
    crate::pki::hex(&Sha256::digest(pem.trim().as_bytes())[..8])
}

/// A CA as its Secret holds it now.
#[derive(Debug)]
pub struct CaMaterial {
    pub current: Ca,
    pub next: Option<Ca>,
    /// The phase of the next CA (`None` without one).
    pub phase: Option<Phase>,
}

impl CaMaterial {
    /// Every certificate to trust, as one PEM bundle.
    pub fn bundle(&self) -> String {
        trusted(
            &self.current.cert_key().cert_pem,
            self.next.as_ref().map(|c| c.cert_key().cert_pem.as_str()),
        )
    }

    /// The CA that signs a leaf now; `held_by_users`: see [`signer`].
    pub fn signer(&self, held_by_users: bool) -> &Ca {
        match (signer(self.phase, held_by_users), &self.next) {
            (Signer::Next, Some(next)) => next,
            _ => &self.current,
        }
    }
}

/// Where a CA Secret holds the next CA while a rotation runs.
pub const NEXT_CERT: &str = "next.crt";
pub const NEXT_KEY: &str = "next.key";

/// The phase a CA Secret's next CA is in, from its annotation.
pub fn phase_of(s: &Secret) -> Option<Phase> {
    s.metadata
        .annotations
        .as_ref()?
        .get(ANN_PHASE)?
        .parse()
        .ok()
}

/// The CA material a CA Secret holds.
pub fn ca_of(s: &Secret) -> Result<CaMaterial> {
    let load = |cert: &str, key: &str| -> Result<Option<Ca>> {
        match (secret_str(s, cert), secret_str(s, key)) {
            (Some(cert_pem), Some(key_pem)) => Ok(Some(Ca::load(&CertKey { cert_pem, key_pem })?)),
            _ => Ok(None),
        }
    };
    let current = load("tls.crt", "tls.key")?.ok_or_else(|| {
        crate::Error::Config(format!(
            "secret {} holds no CA",
            s.metadata.name.as_deref().unwrap_or_default()
        ))
    })?;
    let next = load(NEXT_CERT, NEXT_KEY)?;
    let phase = next.as_ref().and_then(|_| phase_of(s));
    Ok(CaMaterial {
        current,
        next,
        phase,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PHASES: [Phase; 5] = [
        Phase::Trust,
        Phase::Sign,
        Phase::Serve,
        Phase::Retire,
        Phase::Done,
    ];

    fn progress(ready: bool, tokens: bool, in_phase: i64, overlap: i64) -> Progress {
        Progress {
            ready,
            tokens_current: tokens,
            replaced_running: false,
            in_phase: Duration::seconds(in_phase),
            overlap: Duration::seconds(overlap),
            rewritten: true,
        }
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused_with_the_choices() {
        for t in Target::ALL {
            assert_eq!(t.as_str().parse::<Target>(), Ok(t));
        }
        for p in PHASES {
            assert_eq!(p.as_str().parse::<Phase>(), Ok(p));
        }
        let e = "root-ca".parse::<Target>().unwrap_err();
        assert!(e.contains("service-account-key"), "{e}");
        assert!("sa".parse::<Target>().is_err());
    }

    #[test]
    fn phases_walk_in_order_only_when_ready_and_tokens_are_current() {
        let go = progress(true, true, 0, 0);
        assert_eq!(advance(Phase::Trust, &go), Some(Phase::Sign));
        assert_eq!(advance(Phase::Sign, &go), Some(Phase::Serve));
        assert_eq!(advance(Phase::Serve, &go), Some(Phase::Retire));
        assert_eq!(advance(Phase::Retire, &go), Some(Phase::Done));
        assert_eq!(advance(Phase::Done, &go), None);
        for p in PHASES {
            assert_eq!(
                advance(p, &progress(false, true, 99, 0)),
                None,
                "{p} not ready"
            );
            assert_eq!(
                advance(p, &progress(true, false, 99, 0)),
                None,
                "{p} stale tokens"
            );
        }
    }

    #[test]
    fn no_phase_moves_on_while_a_replaced_pod_still_runs() {
        // The trust phase's apiserver is Ready and its predecessor, which trusts only the old
        // CA, is still in its shutdown delay: signing with the new CA now would fail what it
        // still serves.
        for p in PHASES {
            let waiting = Progress {
                replaced_running: true,
                ..progress(true, true, 3600, 0)
            };
            assert_eq!(advance(p, &waiting), None, "{p}");
        }
    }

    #[test]
    fn the_old_encryption_key_is_dropped_only_once_everything_is_rewritten() {
        let not_yet = Progress {
            rewritten: false,
            ..progress(true, true, 0, 0)
        };
        assert_eq!(advance(Phase::Serve, &not_yet), None);
        // Only `serve` waits for the rewrite: before it the new key does not write yet.
        assert_eq!(advance(Phase::Trust, &not_yet), Some(Phase::Sign));
        assert_eq!(advance(Phase::Sign, &not_yet), Some(Phase::Serve));
        assert_eq!(
            advance(Phase::Serve, &progress(true, true, 0, 0)),
            Some(Phase::Retire)
        );
        assert_eq!(Target::EncryptionKey.default_overlap(), Duration::ZERO);
        assert_eq!(
            "encryption-key".parse::<Target>(),
            Ok(Target::EncryptionKey)
        );
    }

    #[test]
    fn sign_lasts_the_overlap_and_no_other_phase_waits_for_it() {
        assert_eq!(advance(Phase::Sign, &progress(true, true, 59, 60)), None);
        assert_eq!(
            advance(Phase::Sign, &progress(true, true, 60, 60)),
            Some(Phase::Serve)
        );
        for p in [Phase::Trust, Phase::Serve, Phase::Retire] {
            assert!(advance(p, &progress(true, true, 0, 3600)).is_some(), "{p}");
        }
    }

    #[test]
    fn the_secret_holds_a_next_pair_from_trust_to_serve_and_swaps_once() {
        assert_eq!(
            secret_change(Phase::Trust, false),
            SecretChange::Next(Phase::Trust)
        );
        assert_eq!(
            secret_change(Phase::Serve, true),
            SecretChange::Next(Phase::Serve)
        );
        assert_eq!(secret_change(Phase::Retire, true), SecretChange::Swap);
        // A pass after the swap (or a replica repeating it) finds nothing left to do.
        assert_eq!(secret_change(Phase::Retire, false), SecretChange::Keep);
        assert_eq!(secret_change(Phase::Done, false), SecretChange::Keep);
    }

    #[test]
    fn the_serving_certificate_moves_to_the_new_ca_one_phase_after_everything_else() {
        assert_eq!(signer(None, false), Signer::Current);
        assert_eq!(signer(Some(Phase::Trust), false), Signer::Current);
        assert_eq!(signer(Some(Phase::Sign), false), Signer::Next);
        assert_eq!(signer(Some(Phase::Sign), true), Signer::Current);
        assert_eq!(signer(Some(Phase::Serve), true), Signer::Next);
        assert_eq!(signer(Some(Phase::Retire), true), Signer::Current);
    }

    #[test]
    fn the_bundle_holds_both_certificates_on_their_own_lines() {
        let b = trusted("-----A-----", Some("-----B-----\n"));
        assert_eq!(b, "-----A-----\n-----B-----\n");
        assert_eq!(trusted("-----A-----\n", None), "-----A-----\n");
    }

    #[test]
    fn the_token_generation_follows_every_input() {
        let g = token_generation("ca", "keys", "signer");
        assert_eq!(g, token_generation("ca", "keys", "signer"));
        assert_ne!(g, token_generation("ca2", "keys", "signer"));
        assert_ne!(g, token_generation("ca", "keys2", "signer"));
        assert_ne!(g, token_generation("ca", "keys", "signer2"));
        // The separator keeps parts from sliding into each other.
        assert_ne!(
            token_generation("ab", "c", "d"),
            token_generation("a", "bc", "d")
        );
    }

    proptest! {
        /// Whatever the order of passes, the material a pass sees is never one that stops
        /// trusting what still signs: from any phase, signing pairs are always trusted.
        #[test]
        fn what_signs_is_always_trusted(steps in proptest::collection::vec(any::<bool>(), 0..20)) {
            let mut phase = Phase::Trust;
            let mut has_next = false;
            for ready in steps {
                match secret_change(phase, has_next) {
                    SecretChange::Next(_) => has_next = true,
                    SecretChange::Swap => has_next = false,
                    SecretChange::Keep => {}
                }
                for held in [false, true] {
                    let s = signer(has_next.then_some(phase), held);
                    prop_assert!(s == Signer::Current || has_next,
                        "{phase}: signs with a next pair that is not there");
                }
                if let Some(p) = advance(phase, &progress(ready, true, 0, 0)) {
                    phase = p;
                }
            }
        }
    }
}
