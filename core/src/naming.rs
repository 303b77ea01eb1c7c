//! Tenant keys, tenant <-> host names, labels and ownership markers (pure).
//!
//! Every tenant has a short immutable key ([`TenantKey`]): the orchestrator makes one when the
//! tenant is created, the syncer gets it as `--tenant-key`, and both check it with the one rule
//! here. A tenant namespace `ns` lives on the host as
//! `<key>-<ns>`; a cluster-scoped object (a PersistentVolume) as `<key>-<name>`. Objects inside a
//! namespace keep their names, since the namespace already separates tenants.
//!
//! Why the mapping is injective:
//! - Keys contain no `-` (`[a-z][a-z0-9]{0,19}`), so the first `-` of a host name ends the key:
//!   tenant `a` with namespace `b-c` (`a-b-c`) can never meet tenant `a-b`, which cannot exist.
//! - A name that fits stays `<key>-<name>`, which is then *shorter* than the limit. A name that
//!   does not fit becomes `<key>-<prefix>-<hash>`, *exactly* the limit long, where the hash
//!   covers the whole tenant name. The two forms have different lengths, so a crafted
//!   namespace cannot take the shortened name of another one.
//!
//! Reversal does not parse names: every host object carries markers ([`host_meta`]), the tenant
//! label `vcp.dev/tenant=<key>` (so watches, cleanup and usage sampling select by label) and
//! annotations with the tenant-side name, namespace and UID. A host object without this
//! tenant's markers is never modified or deleted.
//!
//! Tenants may use labels and annotations under `vcp.dev` too, and keys the host acts on
//! ([`HOST_RESERVED_DOMAINS`], [`HOST_RESERVED_KEYS`]: Pod Security admission levels, namespace
//! node selectors and toleration lists, cloud load-balancer settings, ...). On the host such
//! keys are rewritten with a `t.` prefix (`vcp.dev/x` -> `t.vcp.dev/x`, `t.vcp.dev/x` ->
//! `t.t.vcp.dev/x`, `pod-security.kubernetes.io/enforce` -> `t.pod-security.kubernetes.io/enforce`)
//! so a tenant can never forge a marker nor give the host an instruction, and rewritten back
//! on the way up. A key is reserved if it is one of those or `t.` followed by a reserved key,
//! so reserved and plain keys map to disjoint sets and the rewrite stays injective.

use crate::{Error, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The label every host object of a tenant carries: its value is the tenant key.
pub const LABEL_TENANT: &str = "vcp.dev/tenant";
/// The label of a tenant's control-plane namespace and every object the orchestrator renders
/// into it (its value is the tenant key); the syncer's NetworkPolicies select the tenant's
/// CoreDNS and apiserver by it, and replicas watch control planes by it.
pub const LABEL_CONTROL_PLANE_OF: &str = "vcp.dev/control-plane-of";
/// Which component of a control plane a pod is (`kube-apiserver`, `coredns`, ...): set by the
/// orchestrator's templates, selected by the syncer's NetworkPolicies.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Tenant-side name of a host object.
pub const ANN_NAME: &str = "vcp.dev/tenant-name";
/// Tenant-side namespace of a host object (absent for cluster-scoped objects).
pub const ANN_NAMESPACE: &str = "vcp.dev/tenant-namespace";
/// Tenant-side UID of a host object.
pub const ANN_UID: &str = "vcp.dev/tenant-uid";
/// On host objects the syncer generates itself (token Secrets): what they were made for. A
/// tenant object never adopts a host object carrying it.
pub const ANN_GENERATED: &str = "vcp.dev/generated-for";
/// The token generation a host token Secret was issued under (the syncer's
/// `--token-generation`): vcp reads it to know when every pod holds a token of the current one.
pub const ANN_TOKEN_GENERATION: &str = "vcp.dev/token-generation";
/// On a host Service the syncer keeps while it recreates the tenant Service with the host's
/// ClusterIP (a ClusterIP cannot change in place): when it started (RFC 3339). Garbage
/// collection leaves such a host object alone for [`RECREATING_GRACE_SECONDS`], so the
/// recreated tenant Service adopts it instead of a new host Service getting another address.
pub const ANN_RECREATING: &str = "vcp.dev/recreating";
/// How long [`ANN_RECREATING`] holds off garbage collection.
pub const RECREATING_GRACE_SECONDS: i64 = 60;

/// Whether a host object's [`ANN_RECREATING`] mark, if any, still holds at `now`.
pub fn recreating(
    annotations: &BTreeMap<String, String>,
    now: k8s_openapi::jiff::Timestamp,
) -> bool {
    annotations
        .get(ANN_RECREATING)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|since| {
            let age = now.as_second() - since.as_second();
            (0..RECREATING_GRACE_SECONDS).contains(&age)
        })
}

/// The upgrade canary: a ConfigMap in the tenant's `default` namespace that the orchestrator
/// stamps at each upgrade gate (data key [`CANARY_KEY`]) and the syncer always copies to the
/// host, whatever pods use, then marks with [`ANN_CANARY_SEEN`] once the host copy carries the
/// stamp: the round trip that shows the syncer works on the new version.
pub const CANARY_NAMESPACE: &str = "default";
pub const CANARY_NAME: &str = "vcp-upgrade-canary";
pub const CANARY_KEY: &str = "upgrade";
/// On the tenant's canary: the stamp the syncer saw on the host copy.
pub const ANN_CANARY_SEEN: &str = "vcp.dev/canary-seen";

/// Whether a tenant object is the upgrade canary.
pub fn is_canary(namespace: &str, name: &str) -> bool {
    namespace == CANARY_NAMESPACE && name == CANARY_NAME
}

/// The domain whose label and annotation keys belong to vcp.
pub const RESERVED_DOMAIN: &str = "vcp.dev";
/// Longest namespace name (DNS-1123 label).
pub const MAX_NAMESPACE: usize = 63;
/// Longest name of most cluster-scoped objects (DNS-1123 subdomain).
pub const MAX_SUBDOMAIN: usize = 253;
/// Hex digits of SHA-256 that end a shortened name.
pub const HASH_LEN: usize = 10;
/// Longest tenant key.
pub const MAX_KEY: usize = 20;

/// A validated tenant key: `[a-z][a-z0-9]{0,19}`, no `-` (the injectivity argument above rests
/// on that). Made only by [`TenantKey::new`] (or its `TryFrom`, `FromStr` and `Deserialize`
/// forms, which call it), so holding one means the rule was checked; read as text through
/// `Deref<Target = str>`, since selectors, names and logs all want the text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantKey(String);

impl TenantKey {
    /// Validates a key.
    pub fn new(key: &str) -> Result<TenantKey> {
        let ok = (1..=MAX_KEY).contains(&key.len())
            && key.starts_with(|c: char| c.is_ascii_lowercase())
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if ok {
            Ok(TenantKey(key.to_owned()))
        } else {
            Err(Error::InvalidKey(key.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TenantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for TenantKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

// Maps keyed by tenant keys are looked up by the text a request carries (the gateway's
// routes, by the server name); the derived `Hash` and `Eq` are the inner `String`'s, as
// `Borrow` requires.
impl std::borrow::Borrow<str> for TenantKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for TenantKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TenantKey {
    type Error = Error;

    fn try_from(key: String) -> Result<TenantKey> {
        TenantKey::new(&key)
    }
}

impl std::str::FromStr for TenantKey {
    type Err = Error;

    fn from_str(key: &str) -> Result<TenantKey> {
        TenantKey::new(key)
    }
}

impl PartialEq<str> for TenantKey {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for TenantKey {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<TenantKey> for String {
    fn from(key: TenantKey) -> String {
        key.0
    }
}

/// The first [`HASH_LEN`] hex digits of the SHA-256 of `s`: the suffix of every shortened name,
/// and the whole distinguishing part of names made from UIDs.
pub fn short_hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(HASH_LEN)
        .map(|n| char::from_digit(n.into(), 16).unwrap())
        .collect()
}

/// `<key>-<name>` if shorter than `max`, else `<key>-<prefix>-<hash>` exactly `max` long.
fn prefixed(key: &TenantKey, name: &str, max: usize) -> String {
    let full = format!("{key}-{name}");
    if full.len() < max {
        return full;
    }
    let room = max - key.0.len() - 2 - HASH_LEN;
    // Names are ASCII (DNS-1123), so byte slicing is safe.
    format!("{key}-{}-{}", &name[..room], short_hash(name))
}

/// Host namespace of tenant namespace `ns`.
pub fn host_namespace(key: &TenantKey, ns: &str) -> String {
    prefixed(key, ns, MAX_NAMESPACE)
}

/// Host name of a cluster-scoped tenant object (a PersistentVolume).
pub fn host_cluster_name(key: &TenantKey, name: &str) -> String {
    prefixed(key, name, MAX_SUBDOMAIN)
}

/// The host namespace holding a tenant's control plane (its apiserver, etcd, CoreDNS and
/// syncer). It cannot meet a translated namespace `<key'>-<ns>` as long as no key is `vcp`:
/// the orchestrator's keys are at least seven characters long (see its `names`).
pub fn control_plane_namespace(key: &TenantKey) -> String {
    format!("vcp-{key}")
}

/// Where a host object came from, read from its markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRef {
    pub namespace: Option<String>,
    pub name: String,
    pub uid: Option<String>,
}

/// The tenant object behind a host object, if the host object carries `key`'s markers.
pub fn tenant_ref(
    key: &TenantKey,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Option<TenantRef> {
    if labels.get(LABEL_TENANT).map(String::as_str) != Some(key.as_str()) {
        return None;
    }
    Some(TenantRef {
        namespace: annotations.get(ANN_NAMESPACE).cloned(),
        name: annotations.get(ANN_NAME)?.clone(),
        uid: annotations.get(ANN_UID).cloned(),
    })
}

/// Whether a host object belongs to tenant `key` (it carries the tenant label).
pub fn owned_by(key: &TenantKey, labels: &BTreeMap<String, String>) -> bool {
    labels.get(LABEL_TENANT).map(String::as_str) == Some(key.as_str())
}

/// The markers for a host object made from tenant object `r`.
pub fn markers(
    key: &TenantKey,
    r: &TenantRef,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let labels = BTreeMap::from([(LABEL_TENANT.to_owned(), key.to_string())]);
    let mut ann = BTreeMap::from([(ANN_NAME.to_owned(), r.name.clone())]);
    if let Some(ns) = &r.namespace {
        ann.insert(ANN_NAMESPACE.to_owned(), ns.clone());
    }
    if let Some(uid) = &r.uid {
        ann.insert(ANN_UID.to_owned(), uid.clone());
    }
    (labels, ann)
}

/// Host metadata for a namespaced tenant object with metadata `tenant`: same name, translated
/// namespace, tenant labels and annotations (reserved keys rewritten), markers, and nothing the
/// host must not inherit (owner references, finalizers, managed fields, resource versions).
/// Every host object the syncer makes from a tenant object starts from this.
pub fn host_meta(tenant: &ObjectMeta, key: &TenantKey) -> ObjectMeta {
    let r = TenantRef {
        namespace: tenant.namespace.clone(),
        // As kube's `ResourceExt::name_any`: a name, else the generate-name prefix.
        name: tenant
            .name
            .clone()
            .or_else(|| tenant.generate_name.clone())
            .unwrap_or_default(),
        uid: tenant.uid.clone(),
    };
    let (marker_labels, marker_annotations) = markers(key, &r);
    let mut labels = map_to_host(tenant.labels.as_ref().unwrap_or(&BTreeMap::new()));
    labels.extend(marker_labels);
    let mut annotations = map_to_host(tenant.annotations.as_ref().unwrap_or(&BTreeMap::new()));
    // kubectl's record of the tenant's last apply is meaningless (and large) on the host.
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    annotations.extend(marker_annotations);
    ObjectMeta {
        name: Some(r.name),
        namespace: r.namespace.map(|ns| host_namespace(key, &ns)),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

fn domain_of(key: &str) -> Option<&str> {
    key.split_once('/').map(|(d, _)| d)
}

/// Label and annotation domains (and their subdomains) the host acts on: a tenant's keys there
/// are stored under a `t.` prefix, never as written.
/// - `pod-security.kubernetes.io`: Pod Security admission levels of a namespace;
/// - `scheduler.alpha.kubernetes.io`: namespace node selectors and toleration lists of the
///   PodNodeSelector and PodTolerationRestriction admission plugins;
/// - `service.beta.kubernetes.io`, `service.kubernetes.io`: cloud load-balancer settings and
///   the proxy that serves a Service;
/// - `endpointslice.kubernetes.io`: which controller manages a slice;
/// - `node.kubernetes.io`, `node-role.kubernetes.io`: node roles and conditions;
/// - `cluster-autoscaler.kubernetes.io`: whether the autoscaler may remove a node;
/// - `networking.gke.io`, `cloud.google.com`: cloud networking.
pub const HOST_RESERVED_DOMAINS: [&str; 10] = [
    "pod-security.kubernetes.io",
    "scheduler.alpha.kubernetes.io",
    "service.beta.kubernetes.io",
    "service.kubernetes.io",
    "endpointslice.kubernetes.io",
    "node.kubernetes.io",
    "node-role.kubernetes.io",
    "cluster-autoscaler.kubernetes.io",
    "networking.gke.io",
    "cloud.google.com",
];

/// Single keys the host sets or acts on, outside the reserved domains: a namespace's own name
/// label (the host sets it to the host name; network policies select by it).
pub const HOST_RESERVED_KEYS: [&str; 1] = ["kubernetes.io/metadata.name"];

fn reserved_domain(domain: &str) -> bool {
    std::iter::once(RESERVED_DOMAIN)
        .chain(HOST_RESERVED_DOMAINS)
        .any(|r| domain == r || domain.strip_suffix(r).is_some_and(|p| p.ends_with('.')))
}

/// Whether a key is stored under a `t.` prefix on the host: in a reserved domain, one of the
/// reserved keys, or `t.` followed by a reserved key (so a tenant's own `t.vcp.dev/x` cannot
/// meet the host form of `vcp.dev/x`).
fn reserved(k: &str) -> bool {
    domain_of(k).is_some_and(reserved_domain)
        || HOST_RESERVED_KEYS.contains(&k)
        || k.strip_prefix("t.").is_some_and(reserved)
}

/// A tenant label or annotation key as it is stored on the host.
pub fn key_to_host(k: &str) -> String {
    if reserved(k) {
        format!("t.{k}")
    } else {
        k.to_owned()
    }
}

/// A host label or annotation key as the tenant sees it, or `None` for keys vcp or the host
/// set themselves (markers, admission levels).
pub fn key_to_tenant(k: &str) -> Option<String> {
    if !reserved(k) {
        return Some(k.to_owned());
    }
    k.strip_prefix("t.")
        .filter(|inner| reserved(inner))
        .map(str::to_owned)
}

/// Tenant labels or annotations as stored on the host (without markers; add those separately).
pub fn map_to_host(m: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (key_to_host(k), v.clone())).collect()
}

/// Host labels or annotations as the tenant sees them: markers dropped, keys restored.
pub fn map_to_tenant(m: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    m.iter()
        .filter_map(|(k, v)| Some((key_to_tenant(k)?, v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(s: &str) -> TenantKey {
        TenantKey::new(s).unwrap()
    }

    fn dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn the_crafted_collision_cannot_be_expressed() {
        // Tenant "a-b" would be needed to meet tenant "a" with namespace "b-c".
        assert!(TenantKey::new("a-b").is_err());
        assert_eq!(host_namespace(&key("a"), "b-c"), "a-b-c");
        assert_ne!(
            host_namespace(&key("ab"), "c"),
            host_namespace(&key("a"), "bc")
        );
    }

    #[test]
    fn keys_are_validated() {
        for bad in [
            "",
            "A",
            "1abc",
            "a_b",
            "a.b",
            "abcdefghijklmnopqrstu",
            "a-b",
        ] {
            assert!(TenantKey::new(bad).is_err(), "{bad}");
        }
        for good in ["a", "demo", "team1x7k2", "abcdefghijklmnopqrst"] {
            assert!(TenantKey::new(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn every_way_to_make_a_key_checks_the_rule() {
        assert!(serde_json::from_str::<TenantKey>(r#""a-b""#).is_err());
        assert!("a-b".parse::<TenantKey>().is_err());
        assert!(TenantKey::try_from("A".to_owned()).is_err());
        let k: TenantKey = serde_json::from_str(r#""demo""#).unwrap();
        assert_eq!(serde_json::to_string(&k).unwrap(), r#""demo""#);
        assert_eq!(&*k, "demo");
    }

    #[test]
    fn host_metadata_carries_markers_and_rewritten_keys_only() {
        let tenant: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "web", "namespace": "apps", "uid": "u1", "resourceVersion": "7",
            "labels": {"app": "web", "vcp.dev/tenant": "forged"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "o"}],
            "finalizers": ["x"],
        }))
        .unwrap();
        let host = host_meta(&tenant, &key("demo"));
        assert_eq!(host.namespace.as_deref(), Some("demo-apps"));
        let labels = host.labels.unwrap();
        assert_eq!(labels[LABEL_TENANT], "demo");
        assert_eq!(labels["t.vcp.dev/tenant"], "forged");
        let ann = host.annotations.unwrap();
        assert_eq!(
            (
                ann[ANN_NAME].as_str(),
                ann[ANN_NAMESPACE].as_str(),
                ann[ANN_UID].as_str()
            ),
            ("web", "apps", "u1")
        );
        assert!(!ann.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert!(host.owner_references.is_none() && host.finalizers.is_none());
        assert!(host.resource_version.is_none());
    }

    #[test]
    fn long_names_are_shortened_to_exactly_the_limit_with_a_hash() {
        let ns = "n".repeat(63);
        let host = host_namespace(&key("demo"), &ns);
        assert_eq!(host.len(), 63);
        assert!(dns_label(&host), "{host}");
        // A namespace spelled like the shortened form stays one character short of it.
        let crafted = host.strip_prefix("demo-").unwrap();
        assert_eq!(host_namespace(&key("demo"), crafted).len(), 63);
        assert_ne!(host_namespace(&key("demo"), crafted), host);
    }

    #[test]
    fn reserved_label_keys_are_rewritten_and_restored() {
        let tenant = BTreeMap::from([
            ("vcp.dev/tenant".to_owned(), "forged".to_owned()),
            ("t.vcp.dev/x".to_owned(), "1".to_owned()),
            ("app".to_owned(), "web".to_owned()),
            ("example.com/team".to_owned(), "a".to_owned()),
        ]);
        let host = map_to_host(&tenant);
        assert!(
            !host.contains_key(LABEL_TENANT),
            "a tenant forged the tenant label"
        );
        assert_eq!(host["t.vcp.dev/tenant"], "forged");
        assert_eq!(host["t.t.vcp.dev/x"], "1");
        assert_eq!(map_to_tenant(&host), tenant);
        let mut with_markers = host.clone();
        with_markers.insert(LABEL_TENANT.into(), "demo".into());
        assert_eq!(
            map_to_tenant(&with_markers),
            tenant,
            "markers never reach the tenant"
        );
    }

    #[test]
    fn markers_identify_the_tenant_object_and_only_for_its_tenant() {
        let r = TenantRef {
            namespace: Some("apps".into()),
            name: "web".into(),
            uid: Some("u1".into()),
        };
        let (labels, ann) = markers(&key("demo"), &r);
        assert_eq!(tenant_ref(&key("demo"), &labels, &ann), Some(r));
        assert_eq!(tenant_ref(&key("other"), &labels, &ann), None);
        assert_eq!(tenant_ref(&key("demo"), &BTreeMap::new(), &ann), None);
    }

    /// A key the host or vcp acts on as written (not the `t.` form of one).
    fn base_reserved(k: &str) -> bool {
        domain_of(k).is_some_and(reserved_domain) && !k.starts_with("t.")
            || HOST_RESERVED_KEYS.contains(&k)
    }

    fn arb_label_key() -> impl Strategy<Value = String> {
        let prefix = prop_oneof![Just(""), Just("t."), Just("t.t."), Just("x.")];
        let domain = prop_oneof![
            Just("vcp.dev"),
            Just("pod-security.kubernetes.io"),
            Just("kubernetes.io"),
            Just("example.com"),
            Just("node.kubernetes.io"),
        ];
        let name = prop_oneof![Just("metadata.name".to_owned()), "[a-z]{1,3}"];
        (prefix, domain, name).prop_map(|(p, d, n)| format!("{p}{d}/{n}"))
    }

    #[test]
    fn host_meaningful_keys_never_reach_the_host_as_written() {
        let tenant = BTreeMap::from([
            (
                "pod-security.kubernetes.io/enforce".to_owned(),
                "privileged".to_owned(),
            ),
            (
                "scheduler.alpha.kubernetes.io/node-selector".to_owned(),
                "x=y".to_owned(),
            ),
            ("kubernetes.io/metadata.name".to_owned(), "apps".to_owned()),
            ("app.kubernetes.io/name".to_owned(), "web".to_owned()),
            ("kubernetes.io/hostname".to_owned(), "n1".to_owned()),
        ]);
        let host = map_to_host(&tenant);
        assert_eq!(host["t.pod-security.kubernetes.io/enforce"], "privileged");
        assert_eq!(host["t.scheduler.alpha.kubernetes.io/node-selector"], "x=y");
        assert_eq!(host["t.kubernetes.io/metadata.name"], "apps");
        assert_eq!(host["app.kubernetes.io/name"], "web", "ordinary keys stay");
        assert_eq!(host["kubernetes.io/hostname"], "n1");
        assert_eq!(map_to_tenant(&host), tenant);
        let mut set_by_host = host.clone();
        set_by_host.insert(
            "pod-security.kubernetes.io/enforce".into(),
            "baseline".into(),
        );
        set_by_host.insert("kubernetes.io/metadata.name".into(), "demo-apps".into());
        assert_eq!(
            map_to_tenant(&set_by_host),
            tenant,
            "the host's own never go up"
        );
    }

    fn arb_key() -> impl Strategy<Value = TenantKey> {
        "[a-z][a-z0-9]{0,19}".prop_map(|s| TenantKey::new(&s).unwrap())
    }

    fn arb_ns() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
            "[a-z]{1,3}(-[a-z]{1,3}){0,5}"
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn host_namespaces_are_injective_valid_and_bounded(
            k1 in arb_key(), n1 in arb_ns(), k2 in arb_key(), n2 in arb_ns()
        ) {
            let (h1, h2) = (host_namespace(&k1, &n1), host_namespace(&k2, &n2));
            prop_assert!(dns_label(&h1), "{} is not a DNS label", h1);
            let prefix = format!("{}-", k1);
            prop_assert!(h1.starts_with(&prefix));
            if (k1.clone(), n1.clone()) != (k2.clone(), n2.clone()) {
                prop_assert_ne!(h1, h2);
            }
        }

        #[test]
        fn label_keys_round_trip(domain in prop_oneof![
            Just("vcp.dev"), Just("t.vcp.dev"), Just("x.vcp.dev"), Just("example.com"),
            Just("pod-security.kubernetes.io"), Just("t.pod-security.kubernetes.io"),
            Just("scheduler.alpha.kubernetes.io"), Just("kubernetes.io"), Just("t.kubernetes.io"),
            Just("app.kubernetes.io"), Just("xpod-security.kubernetes.io"),
        ], name in prop_oneof![Just("metadata.name".to_owned()), "[a-z]{1,10}"]) {
            let k = format!("{domain}/{name}");
            prop_assert_eq!(key_to_tenant(&key_to_host(&k)), Some(k.clone()));
            prop_assert_ne!(key_to_host(&k), LABEL_TENANT.to_owned());
            // Nothing a tenant writes reaches the host as a key the host acts on.
            prop_assert!(!base_reserved(&key_to_host(&k)));
        }

        #[test]
        fn label_keys_are_injective(a in arb_label_key(), b in arb_label_key()) {
            if a != b {
                prop_assert_ne!(key_to_host(&a), key_to_host(&b));
            }
        }
    }

    #[test]
    fn a_recreating_mark_holds_for_its_grace_only() {
        let t = |s: &str| s.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
        let marked =
            BTreeMap::from([(ANN_RECREATING.to_owned(), "2026-11-25T10:00:00Z".to_owned())]);
        assert!(recreating(&marked, t("2026-11-25T10:00:00Z")));
        assert!(recreating(&marked, t("2026-11-25T10:00:59Z")));
        assert!(!recreating(&marked, t("2026-11-25T10:01:00Z")), "stale");
        assert!(
            !recreating(&marked, t("2026-11-25T09:59:00Z")),
            "from the future"
        );
        assert!(!recreating(&BTreeMap::new(), t("2026-11-25T10:00:00Z")));
        let junk = BTreeMap::from([(ANN_RECREATING.to_owned(), "soon".to_owned())]);
        assert!(!recreating(&junk, t("2026-11-25T10:00:00Z")));
    }
}
