//! A tenant apiserver's encryption at rest (pure): the EncryptionConfiguration
//! (`apiserver.config.k8s.io/v1`) it reads with `--encryption-provider-config`, from the keys
//! the inventory keeps and the phase of an encryption-key rotation.
//!
//! keys (inventory, opened with the inventory key) + rotation phase -> [`providers`] (the order
//! the apiserver tries them; the first encrypts) -> [`configuration`] (YAML, in the host Secret
//! [`SECRET`]) -> [`digest`] on the apiserver's pod template, so a change rolls it.
//!
//! **Provider: `secretbox`** (XSalsa20-Poly1305, 32-byte keys). The Kubernetes documentation
//! ranks it strong and recommends it over `aescbc` (CBC, unauthenticated, not recommended
//! there for its exposure to padding oracles) and `aesgcm` (random 96-bit nonces: a key must
//! be rotated every 200k writes, recommended only with automated rotation counting writes).
//! vcp's keys are static between rotations an admin asks for, so `secretbox`.
//!
//! **Order.** The provider that encrypts comes first; the others only decrypt, each matched by
//! its prefix in the stored value (`k8s:enc:secretbox:v1:<key name>:`). `identity` is always
//! listed, last when a key encrypts, so objects written before the tenant had a key (a tenant
//! from before encryption at rest) are still read until they are rewritten; first while such
//! a tenant's first key is only being introduced (its `trust` phase: every replica must be
//! able to read the key before any replica writes with it). Upstream's prefix transformer
//! moves past `identity` when it meets an encrypted value, which is what lets it lead.

use crate::names::is_dns_label;
use crate::pki::rotation::{self, Phase, Signer};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The host Secret (in the control-plane namespace) holding the configuration.
pub use crate::pki::rotation::ENCRYPTION_SECRET as SECRET;

/// The configuration's key in [`SECRET`], and its file name where the apiserver mounts it.
pub const FILE: &str = "encryption.yaml";

/// The provider every key is used with.
pub const PROVIDER: &str = "secretbox";

/// What a plan encrypts: `encryption: {resources: [secrets, configmaps]}`. Each entry is a
/// resource as the EncryptionConfiguration names it, `<resource>` in the core group or
/// `<resource>.<group>`; `secrets` is always among them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionPlan {
    #[serde(default = "default_resources")]
    pub resources: Vec<String>,
}

fn default_resources() -> Vec<String> {
    vec!["secrets".to_owned()]
}

impl Default for EncryptionPlan {
    fn default() -> EncryptionPlan {
        EncryptionPlan {
            resources: default_resources(),
        }
    }
}

impl EncryptionPlan {
    /// Refuses what the apiserver would refuse at start, or what vcp could not migrate:
    /// wildcards (`*.apps`: vcp rewrites each resource by name), duplicates, names that are
    /// not `<resource>[.<group>]`, and lists without `secrets`.
    pub fn validate(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for r in &self.resources {
            let (resource, group) = group_resource(r);
            let group_ok = !r.contains('.') || group.split('.').all(is_dns_label);
            if !is_dns_label(resource) || !group_ok {
                return Err(format!(
                    "encryption.resources: {r:?} is not <resource> or <resource>.<group> (lowercase; no wildcards)"
                ));
            }
            if !seen.insert(r.as_str()) {
                return Err(format!("encryption.resources: {r:?} is listed twice"));
            }
        }
        if !seen.contains("secrets") {
            return Err("encryption.resources must include secrets".into());
        }
        Ok(())
    }
}

/// An entry of [`EncryptionPlan::resources`] as (resource, group): `secrets` is
/// (`secrets`, ``), `deployments.apps` (`deployments`, `apps`).
pub fn group_resource(entry: &str) -> (&str, &str) {
    entry.split_once('.').unwrap_or((entry, ""))
}

/// One data key as the apiserver gets it. Its `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq)]
pub struct DataKey {
    /// `key1`, `key2`, ...: the name in the stored values' prefix.
    pub name: String,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One provider of the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider<'a> {
    Key(&'a DataKey),
    /// No encryption: writes plaintext if first; reads what was never encrypted.
    Identity,
}

/// The providers in the order the apiserver tries them, the one that encrypts first.
/// `current` is the key in use (`None`: none yet, the tenant predates encryption at rest),
/// `next` the key an encryption-key rotation introduces, in `phase`. The new key decrypts from
/// `trust` on and encrypts from `sign` on, as a new CA signs ([`rotation::signer`]); the old
/// one is gone from `retire` on (its row is retired: `current` is then the new key, `next`
/// none).
pub fn providers<'a>(
    current: Option<&'a DataKey>,
    next: Option<&'a DataKey>,
    phase: Option<Phase>,
) -> Vec<Provider<'a>> {
    let writer = match (rotation::signer(phase, false), next) {
        (Signer::Next, Some(n)) => Provider::Key(n),
        _ => current.map_or(Provider::Identity, Provider::Key),
    };
    let mut out = vec![writer];
    for p in [current, next]
        .into_iter()
        .flatten()
        .map(Provider::Key)
        .chain([Provider::Identity])
    {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The EncryptionConfiguration for `resources` with `providers` in order, as YAML. Keys next to
/// each other share one `secretbox` provider (its first key encrypts when it leads the list).
pub fn configuration(resources: &[String], providers: &[Provider<'_>]) -> String {
    use base64::Engine as _;
    let mut list: Vec<serde_json::Value> = Vec::new();
    let mut keys: Vec<serde_json::Value> = Vec::new();
    let flush = |keys: &mut Vec<serde_json::Value>, list: &mut Vec<serde_json::Value>| {
        if !keys.is_empty() {
            list.push(json!({PROVIDER: {"keys": std::mem::take(keys)}}));
        }
    };
    for p in providers {
        match p {
            Provider::Key(k) => keys.push(json!({
                "name": k.name,
                "secret": base64::engine::general_purpose::STANDARD.encode(k.secret),
            })),
            Provider::Identity => {
                flush(&mut keys, &mut list);
                list.push(json!({"identity": {}}));
            }
        }
    }
    flush(&mut keys, &mut list);
    let doc = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [{"resources": resources, "providers": list}],
    });
    serde_yaml::to_string(&doc).expect("a configuration always serializes")
}

/// What rolls the apiserver when the configuration changes: a short SHA-256 of it (of 256-bit
/// random keys, so it says nothing of them).
pub fn digest(configuration: &str) -> String {
    super::digest(configuration)
}

/// The prefix of a value the apiserver stored encrypted with key `name`.
pub fn stored_prefix(name: &str) -> String {
    format!("k8s:enc:{PROVIDER}:v1:{name}:")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, byte: u8) -> DataKey {
        DataKey {
            name: name.into(),
            secret: [byte; 32],
        }
    }

    fn names(ps: &[Provider<'_>]) -> Vec<String> {
        ps.iter()
            .map(|p| match p {
                Provider::Key(k) => k.name.clone(),
                Provider::Identity => "identity".into(),
            })
            .collect()
    }

    #[test]
    fn each_rotation_phase_orders_the_keys_as_the_rotation_needs() {
        let (k1, k2) = (key("key1", 1), key("key2", 2));
        let order = |cur, next, phase| names(&providers(cur, next, phase));
        // No rotation: the key encrypts, plaintext from before stays readable.
        assert_eq!(order(Some(&k1), None, None), ["key1", "identity"]);
        // trust: the new key is only read; sign and serve: it writes, the old is still read.
        assert_eq!(
            order(Some(&k1), Some(&k2), Some(Phase::Trust)),
            ["key1", "key2", "identity"]
        );
        for p in [Phase::Sign, Phase::Serve] {
            assert_eq!(
                order(Some(&k1), Some(&k2), Some(p)),
                ["key2", "key1", "identity"],
                "{p}"
            );
        }
        // retire: the old key's row is retired, so the new one is the only key.
        assert_eq!(
            order(Some(&k2), None, Some(Phase::Retire)),
            ["key2", "identity"]
        );
    }

    #[test]
    fn a_tenant_from_before_encryption_reads_its_first_key_before_it_writes_with_it() {
        let k1 = key("key1", 1);
        let order = |next, phase| names(&providers(None, next, phase));
        assert_eq!(order(None, None), ["identity"]);
        assert_eq!(order(Some(&k1), Some(Phase::Trust)), ["identity", "key1"]);
        assert_eq!(order(Some(&k1), Some(Phase::Sign)), ["key1", "identity"]);
        assert_eq!(order(Some(&k1), Some(Phase::Serve)), ["key1", "identity"]);
    }

    #[test]
    fn every_phase_can_read_what_the_phase_before_wrote() {
        // Replicas of two neighbouring phases run side by side during a roll: each must read
        // what the other writes.
        let (k1, k2) = (key("key1", 1), key("key2", 2));
        let seq: Vec<Vec<Provider<'_>>> = vec![
            providers(Some(&k1), None, None),
            providers(Some(&k1), Some(&k2), Some(Phase::Trust)),
            providers(Some(&k1), Some(&k2), Some(Phase::Sign)),
            providers(Some(&k1), Some(&k2), Some(Phase::Serve)),
            providers(Some(&k2), None, Some(Phase::Retire)),
        ];
        for w in seq.windows(2) {
            for (a, b) in [(&w[0], &w[1]), (&w[1], &w[0])] {
                assert!(b.contains(&a[0]), "{:?} cannot read {:?}", names(b), a[0]);
            }
        }
    }

    #[test]
    fn the_configuration_lists_keys_in_order_under_one_provider_and_identity_apart() {
        let (k1, k2) = (key("key1", 1), key("key2", 2));
        let yaml = configuration(
            &["secrets".into(), "configmaps".into()],
            &providers(Some(&k1), Some(&k2), Some(Phase::Sign)),
        );
        let v: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(v["apiVersion"], "apiserver.config.k8s.io/v1");
        assert_eq!(v["kind"], "EncryptionConfiguration");
        let r = &v["resources"][0];
        assert_eq!(r["resources"], json!(["secrets", "configmaps"]));
        let keys = &r["providers"][0]["secretbox"]["keys"];
        assert_eq!(keys[0]["name"], "key2");
        assert_eq!(keys[1]["name"], "key1");
        // 32 bytes, base64.
        assert_eq!(
            keys[0]["secret"],
            "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="
        );
        assert_eq!(r["providers"][1], json!({"identity": {}}));
        assert_eq!(r["providers"].as_array().unwrap().len(), 2);

        let first = configuration(
            &["secrets".into()],
            &providers(None, Some(&k1), Some(Phase::Trust)),
        );
        let v: serde_json::Value = serde_yaml::from_str(&first).unwrap();
        let ps = &v["resources"][0]["providers"];
        assert_eq!(ps[0], json!({"identity": {}}));
        assert_eq!(ps[1]["secretbox"]["keys"][0]["name"], "key1");
        // A change of order is a change of digest (a roll); the same input is not.
        assert_ne!(digest(&yaml), digest(&first));
        assert_eq!(digest(&first), digest(&first.clone()));
        assert!(
            !format!("{k1:?}").contains("secret: ["),
            "keys never reach Debug"
        );
        assert_eq!(stored_prefix("key2"), "k8s:enc:secretbox:v1:key2:");
    }

    #[test]
    fn plans_encrypt_secrets_by_default_and_name_resources_exactly() {
        assert_eq!(EncryptionPlan::default().resources, ["secrets"]);
        let ok = |r: &[&str]| {
            EncryptionPlan {
                resources: r.iter().map(|s| (*s).to_owned()).collect(),
            }
            .validate()
        };
        assert_eq!(ok(&["secrets", "configmaps", "deployments.apps"]), Ok(()));
        assert_eq!(ok(&["secrets", "widgets.example.com"]), Ok(()));
        for bad in [
            &["configmaps"][..],
            &[][..],
            &["secrets", "secrets"][..],
            &["secrets", "*.apps"][..],
            &["secrets", "*.*"][..],
            &["secrets", "Pods"][..],
            &["secrets", "pods."][..],
            &["secrets", "-x"][..],
        ] {
            assert!(ok(bad).is_err(), "{bad:?}");
        }
        assert_eq!(group_resource("secrets"), ("secrets", ""));
        assert_eq!(
            group_resource("widgets.example.com"),
            ("widgets", "example.com")
        );
    }
}
