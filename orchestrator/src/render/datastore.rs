//! Shared datastores as names and objects (pure): an etcd cluster run by vcp that keeps many
//! tenants' data, each tenant under its own key prefix with its own etcd user.
//!
//! Data flow: `--datastores FILE` declares them (name -> [`Spec`], [`parse_datastores`]); a
//! plan names one (`datastore: NAME`). [`render`] turns a datastore into its host objects
//! (`templates/datastore.yaml`, in its own namespace), and [`Placement`] is what a tenant's
//! templates see of it: the members to dial and the prefix to keep its keys under. The tenant's
//! etcd user is [`user`]: the common name of the client certificate its apiserver presents,
//! which etcd takes as the user name, and whose role reaches only [`key_range`].

use super::{LABEL_COMPONENT, LABEL_MANAGED_BY, RenderError, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// One shared datastore's size and placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// etcd members: 1 (a test or a small platform) or 3 (survives losing one).
    #[serde(default = "three")]
    pub members: u8,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<Value>,
    #[serde(default)]
    pub storage_class: Option<String>,
    /// Each member's volume.
    #[serde(default = "default_storage")]
    pub storage: String,
    /// The members' container resources.
    #[serde(default)]
    pub resources: Value,
    /// etcd's backend quota in bytes (`--quota-backend-bytes`); every tenant's data counts
    /// against it. Absent: etcd's default (2 GiB).
    #[serde(default)]
    pub quota_bytes: Option<u64>,
    /// etcd's `--snapshot-count`: raft entries kept in memory between snapshots (100-100000;
    /// absent: etcd's 10000). Fewer hold less memory, at more frequent snapshots.
    #[serde(default)]
    pub snapshot_count: Option<u64>,
    /// The members' `GOGC` (10-1000; absent: Go's 100).
    #[serde(default)]
    pub gogc: Option<u32>,
    /// The members' `GOMEMLIMIT` in MiB (at least 16; absent: none).
    #[serde(default)]
    pub memory_limit_mib: Option<u32>,
}

fn three() -> u8 {
    3
}

fn default_storage() -> String {
    "4Gi".into()
}

/// Longest datastore name: its namespace (`vcp-datastore-<name>`) stays a DNS label.
pub const MAX_NAME: usize = 40;

/// Named datastores (`--datastores FILE`: a YAML map of name -> [`Spec`]).
pub fn parse_datastores(yaml: &str) -> Result<BTreeMap<String, Spec>> {
    let stores: BTreeMap<String, Spec> =
        serde_yaml::from_str(yaml).map_err(|e| RenderError::Plan {
            plan: "<datastores file>".into(),
            message: e.to_string(),
        })?;
    for (name, s) in &stores {
        let bad = |message: String| RenderError::Plan {
            plan: format!("datastore {name}"),
            message,
        };
        if !is_name(name) {
            return Err(bad(format!(
                "a datastore name is 1 to {MAX_NAME} lowercase letters, digits and '-', \
                 starting with a letter and not ending with '-'"
            )));
        }
        if !matches!(s.members, 1 | 3) {
            return Err(bad("members must be 1 or 3".into()));
        }
        if s.snapshot_count
            .is_some_and(|c| !(100..=100_000).contains(&c))
        {
            return Err(bad("snapshot_count must be 100 to 100000".into()));
        }
        if s.gogc.is_some_and(|g| !(10..=1000).contains(&g)) {
            return Err(bad("gogc must be 10 to 1000".into()));
        }
        if s.memory_limit_mib.is_some_and(|m| m < 16) {
            return Err(bad("memory_limit_mib must be at least 16".into()));
        }
    }
    Ok(stores)
}

fn is_name(n: &str) -> bool {
    crate::names::is_dns_label(n)
        && n.len() <= MAX_NAME
        && n.starts_with(|c: char| c.is_ascii_lowercase())
}

/// The host namespace of datastore `name`.
pub fn namespace(name: &str) -> String {
    format!("vcp-datastore-{name}")
}

/// The label on a datastore's namespace and objects (its value: the datastore's name).
pub const LABEL_DATASTORE: &str = "vcp.dev/datastore";

/// The apiserver's `--etcd-prefix` for tenant `key`.
pub fn prefix(key: &str) -> String {
    format!("/vcp/{key}")
}

/// The keys tenant `key`'s role reaches: `[start, end)` as etcd ranges go. The apiserver
/// writes `<prefix>/<resource>/...`, so the range is the prefix with its slash: `/vcp/ab/`
/// and never `/vcp/abc/` of a tenant whose key starts the same way.
pub fn key_range(key: &str) -> (String, String) {
    prefix_range(&prefix(key))
}

/// The keys an apiserver with `--etcd-prefix=<prefix>` writes: `[<prefix>/, <prefix>0)`.
pub fn prefix_range(prefix: &str) -> (String, String) {
    // '0' is the byte after '/': the end of every key that starts with "<prefix>/".
    (format!("{prefix}/"), format!("{prefix}0"))
}

/// The etcd user (and role) of tenant `key`: the common name of its apiserver's client
/// certificate.
pub fn user(key: &str) -> String {
    format!("tenant-{key}")
}

/// Tenant `user`'s password on a datastore whose root has `root_password`: HMAC-SHA256 of the
/// user's name keyed by root's password, hex. The grant Job (which holds root's password)
/// sets it and vcp (which can read root's Secret) hands it to the tenant's snapshot Jobs, so it
/// is stored nowhere else, and no tenant's password says anything about another's or root's.
pub fn tenant_password(root_password: &str, user: &str) -> String {
    use hmac::{KeyInit as _, Mac as _};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(root_password.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(user.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Secret of a tenant's control-plane namespace with its user and password on its
/// datastore (`user`, `password`).
pub const SECRET_TENANT_USER: &str = "datastore-user";

/// The user vcp's own Jobs administer a datastore as.
pub const ROOT: &str = "root";
/// The organization of the admin Jobs' client certificate, which has no common name (see
/// `tool`): what names it in etcd's and the host's logs.
pub const ADMIN_ORGANIZATION: &str = "vcp:datastore-admin";

/// The Secrets of a datastore's namespace.
pub const SECRET_CA: &str = "etcd-ca";
pub const SECRET_MEMBER: &str = "etcd";
pub const SECRET_ROOT: &str = "etcd-root";

/// The client URLs of a datastore's members.
pub fn servers(name: &str, members: u8) -> String {
    let ns = namespace(name);
    (0..members)
        .map(|i| format!("https://etcd-{i}.etcd.{ns}.svc:2379"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The DNS names a datastore's member certificate carries.
pub fn member_dns(name: &str, members: u8, cluster_domain: &str) -> Vec<String> {
    let ns = namespace(name);
    let mut out = vec![
        "localhost".to_owned(),
        "etcd".to_owned(),
        format!("etcd.{ns}"),
        format!("etcd.{ns}.svc"),
        format!("etcd.{ns}.svc.{cluster_domain}"),
    ];
    for i in 0..members {
        out.push(format!("etcd-{i}.etcd.{ns}.svc"));
        out.push(format!("etcd-{i}.etcd.{ns}.svc.{cluster_domain}"));
    }
    out
}

/// What a tenant's templates see of the datastore that keeps its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub name: String,
    pub namespace: String,
    pub servers: String,
    pub prefix: String,
}

impl Placement {
    pub fn new(name: &str, spec: &Spec, key: &str) -> Placement {
        Placement {
            name: name.to_owned(),
            namespace: namespace(name),
            servers: servers(name, spec.members),
            prefix: prefix(key),
        }
    }
}

/// A Job vcp runs in a datastore's namespace (`vcp tool datastore ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admin {
    /// The root user and role, then authentication on (once per datastore).
    Init,
    /// A tenant's user and its role over the tenant's prefix.
    Grant { key: String },
    /// A tenant's user and role gone, and (unless kept) its keys.
    Revoke { key: String, keep_data: bool },
}

impl Admin {
    /// The Job's name: one per datastore for init, one per tenant for the others.
    pub fn job(&self) -> String {
        match self {
            Admin::Init => "init".into(),
            Admin::Grant { key } => format!("grant-{key}"),
            Admin::Revoke { key, .. } => format!("revoke-{key}"),
        }
    }

    /// The `vcp tool datastore ...` arguments after the connection flags.
    pub fn args(&self) -> Vec<String> {
        match self {
            Admin::Init => vec!["init".into()],
            Admin::Grant { key } => {
                let (start, end) = key_range(key);
                vec![
                    "grant".into(),
                    format!("--user={}", user(key)),
                    format!("--range-start={start}"),
                    format!("--range-end={end}"),
                ]
            }
            Admin::Revoke { key, keep_data } => {
                let (start, end) = key_range(key);
                let mut a = vec![
                    "revoke".into(),
                    format!("--user={}", user(key)),
                    format!("--range-start={start}"),
                    format!("--range-end={end}"),
                ];
                if *keep_data {
                    a.push("--keep-data".into());
                }
                a
            }
        }
    }
}

/// The context of `templates/datastore.yaml` and `templates/datastore-job.yaml`.
pub fn context(name: &str, spec: &Spec, etcd_image: &str, tools_image: &str) -> Value {
    let ns = namespace(name);
    let members: Vec<String> = (0..spec.members).map(|i| format!("etcd-{i}")).collect();
    // Not LABEL_CONTROL_PLANE_OF: that one names a tenant, and a datastore is no tenant's.
    let labels = |component: &str| {
        json!({
            LABEL_DATASTORE: name,
            LABEL_COMPONENT: component,
            LABEL_MANAGED_BY: "vcp",
        })
    };
    let selector = json!({LABEL_DATASTORE: name, LABEL_COMPONENT: "datastore-etcd"});
    json!({
        "name": name,
        "namespace": ns,
        "spec": spec,
        "etcd_image": etcd_image,
        "tools_image": tools_image,
        "labels": labels("datastore-etcd"),
        "selector": selector,
        "labels_jobs": labels("datastore-admin"),
        "label_datastore": LABEL_DATASTORE,
        "servers": servers(name, spec.members),
        "initial_cluster": members.iter()
            .map(|m| format!("{m}=https://{m}.etcd.{ns}.svc:2380"))
            .collect::<Vec<_>>().join(","),
        "peer_cn": crate::pki::ETCD_PEER_CN,
        "secret_ca": SECRET_CA,
        "secret_member": SECRET_MEMBER,
        "secret_root": SECRET_ROOT,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_range_holds_its_keys_and_no_other_tenants() {
        let (start, end) = key_range("ab12");
        let inside = |k: &str| k >= start.as_str() && k < end.as_str();
        assert!(inside("/vcp/ab12/pods/default/x"));
        assert!(inside("/vcp/ab12/health"));
        // A key that extends this one, and the prefix itself without its slash.
        assert!(!inside("/vcp/ab123/pods/default/x"));
        assert!(!inside("/vcp/ab12"));
        assert!(!inside("/vcp/ab1/pods"));
        assert!(!inside("/registry/pods"));
        assert!(!inside("compact_rev_key"));
    }

    #[test]
    fn tenant_passwords_are_keyed_by_roots_and_differ_per_user() {
        // RFC 4231, test case 2: the construction is HMAC-SHA256 as specified.
        assert_eq!(
            tenant_password("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let a = tenant_password("root-secret", &user("aaaa"));
        assert_eq!(a.len(), 64);
        assert_eq!(a, tenant_password("root-secret", &user("aaaa")));
        assert_ne!(a, tenant_password("root-secret", &user("aaab")));
        assert_ne!(a, tenant_password("other-root", &user("aaaa")));
        assert!(!a.contains("root-secret"));
    }

    #[test]
    fn datastore_files_are_checked() {
        let ok = parse_datastores("shared: {}\nsmall: {members: 1}\n").unwrap();
        assert_eq!(ok["shared"].members, 3);
        assert_eq!(ok["small"].members, 1);
        for (yaml, want) in [
            ("Shared: {}", "lowercase"),
            ("a-: {}", "lowercase"),
            ("x: {members: 2}", "members must be 1 or 3"),
            ("x: {snapshot_count: 50}", "snapshot_count"),
            ("x: {gogc: 5}", "gogc"),
            ("x: {memory_limit_mib: 8}", "memory_limit_mib"),
            ("x: {replicas: 3}", "unknown field"),
            ("x: [", "<datastores file>"),
        ] {
            let e = parse_datastores(yaml).unwrap_err().to_string();
            assert!(e.contains(want), "{yaml}: {e}");
        }
        let long = format!("{}: {{}}", "a".repeat(MAX_NAME + 1));
        assert!(parse_datastores(&long).is_err());
    }

    #[test]
    fn admin_jobs_are_named_per_tenant_and_grant_exactly_the_range() {
        let g = Admin::Grant { key: "k1".into() };
        assert_eq!(g.job(), "grant-k1");
        assert_eq!(
            g.args(),
            [
                "grant",
                "--user=tenant-k1",
                "--range-start=/vcp/k1/",
                "--range-end=/vcp/k10"
            ]
        );
        let r = Admin::Revoke {
            key: "k1".into(),
            keep_data: true,
        };
        assert_eq!(r.job(), "revoke-k1");
        assert!(r.args().contains(&"--keep-data".to_owned()));
        assert_eq!(Admin::Init.job(), "init");
    }

    #[test]
    fn placement_names_every_member() {
        let spec = parse_datastores("s: {}").unwrap().remove("s").unwrap();
        let p = Placement::new("s", &spec, "k1");
        assert_eq!(p.namespace, "vcp-datastore-s");
        assert_eq!(p.prefix, "/vcp/k1");
        assert_eq!(p.servers.split(',').count(), 3);
        assert!(
            p.servers
                .starts_with("https://etcd-0.etcd.vcp-datastore-s.svc:2379")
        );
    }
}
