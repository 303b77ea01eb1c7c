//! A tenant apiserver's audit log (pure): the audit Policy (`audit.k8s.io/v1`) its plan asks
//! for, and the webhook kubeconfig that sends the events to vcp.
//!
//! plan's `audit` ([`AuditPlan`]) -> [`policy`] (YAML) + vcp's ingest URL and the tenant's
//! ingest token -> [`webhook_kubeconfig`] -> both in the host Secret [`SECRET`] (vcp writes it,
//! `crate::tenant_audit::host`) -> [`digest`] on the apiserver's pod template, so a change
//! rolls it (the apiserver reads both files only at start).
//!
//! **Levels.** `default`: `Metadata` for every request (who, what, on which object, the
//! answer's code) and `RequestResponse` for writes of RBAC objects (which rights changed, and
//! how). Secrets, ConfigMaps and token requests and reviews are `Metadata` whatever the level
//! below: their bodies hold the secrets themselves, and an event body ends up in vcp's
//! Postgres; vcp also strips any body from a Secret's event it receives
//! (`crate::tenant_audit::events`). `metadata`: `Metadata` for everything. `none`: no audit
//! log (no flags, no Secret). Events, health checks and the apiserver's own loopback requests
//! are never logged: they are most of the volume and say nothing about who did what.
//!
//! Only the stage `ResponseComplete` (and `Panic`) is sent: `RequestReceived` is omitted by
//! the policy, and vcp drops `ResponseStarted` (a watch's opening) on receipt; one event per
//! request keeps the volume down.

use serde::{Deserialize, Serialize};
use serde_json::json;

/// The host Secret (in the control-plane namespace) holding the policy and the webhook
/// kubeconfig.
pub const SECRET: &str = "audit-config";

/// The policy's key in [`SECRET`], and its file name where the apiserver mounts it.
pub const POLICY_FILE: &str = "policy.yaml";

/// The webhook kubeconfig's key in [`SECRET`], and its file name.
pub const WEBHOOK_FILE: &str = "webhook.kubeconfig";

/// The ingest token's key in [`SECRET`] (vcp reads it back to keep the token across passes).
pub const TOKEN_KEY: &str = "token";

/// Longest retention a plan may ask for, in days.
pub const MAX_RETENTION_DAYS: u32 = 3_650;

/// Retention when a plan does not say, in days.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;

/// Which requests are logged, and how much of each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditLevel {
    /// `Metadata` for everything, `RequestResponse` for RBAC writes.
    #[default]
    Default,
    /// `Metadata` for everything.
    Metadata,
    /// No audit log.
    None,
}

/// A plan's audit log: `audit: {policy: default|metadata|none, retention_days: N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditPlan {
    #[serde(default)]
    pub policy: AuditLevel,
    /// How long vcp keeps the events, in days (1 to [`MAX_RETENTION_DAYS`]).
    #[serde(default = "default_retention")]
    pub retention_days: u32,
}

fn default_retention() -> u32 {
    DEFAULT_RETENTION_DAYS
}

impl Default for AuditPlan {
    fn default() -> AuditPlan {
        AuditPlan {
            policy: AuditLevel::Default,
            retention_days: DEFAULT_RETENTION_DAYS,
        }
    }
}

impl AuditPlan {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_RETENTION_DAYS).contains(&self.retention_days) {
            return Err(format!(
                "audit.retention_days must be 1 to {MAX_RETENTION_DAYS}"
            ));
        }
        Ok(())
    }

    /// Whether the plan's apiservers keep an audit log at all.
    pub fn enabled(&self) -> bool {
        self.policy != AuditLevel::None
    }
}

/// Rules every policy starts with: what is never logged, and the resources whose bodies are
/// never logged (first match wins in an audit policy).
fn common_rules() -> Vec<serde_json::Value> {
    vec![
        // The apiserver's own loopback client (its controllers, bootstrap).
        json!({"level": "None", "users": ["system:apiserver"]}),
        json!({"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version"]}),
        json!({"level": "None", "resources": [
            {"group": "", "resources": ["events"]},
            {"group": "events.k8s.io", "resources": ["events"]},
        ]}),
        // Bodies here are secrets: never more than who touched which object.
        json!({"level": "Metadata", "resources": [
            {"group": "", "resources": ["secrets", "configmaps", "serviceaccounts/token"]},
            {"group": "authentication.k8s.io", "resources": ["tokenreviews"]},
        ]}),
    ]
}

/// The audit Policy for `plan`, as YAML; `None` when the plan keeps no audit log.
pub fn policy(plan: &AuditPlan) -> Option<String> {
    let mut rules = common_rules();
    match plan.policy {
        AuditLevel::None => return None,
        AuditLevel::Default => rules.push(json!({
            "level": "RequestResponse",
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
            "resources": [{"group": "rbac.authorization.k8s.io"}],
        })),
        AuditLevel::Metadata => {}
    }
    rules.push(json!({"level": "Metadata"}));
    let doc = json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "omitManagedFields": true,
        "rules": rules,
    });
    Some(serde_yaml::to_string(&doc).expect("a policy always serializes"))
}

/// The kubeconfig of the apiserver's audit webhook: `url` (vcp's ingest) with the tenant's
/// ingest `token`. Over https the token is the bearer. Over plain http it is the last
/// segment of the path (`<url>/<token>`): client-go sends a kubeconfig's credentials only
/// over TLS, so a bearer token would never arrive; the ingest takes either.
pub fn webhook_kubeconfig(url: &str, token: &str) -> String {
    let (server, user) = if url.starts_with("http://") {
        (format!("{}/{token}", url.trim_end_matches('/')), json!({}))
    } else {
        (url.to_owned(), json!({"token": token}))
    };
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "vcp", "cluster": {"server": server}}],
        "users": [{"name": "apiserver", "user": user}],
        "contexts": [{"name": "vcp", "context": {"cluster": "vcp", "user": "apiserver"}}],
        "current-context": "vcp",
    });
    serde_yaml::to_string(&doc).expect("a kubeconfig always serializes")
}

/// The `host:port` a URL dials (default ports by scheme): what the authorizer's relay is told
/// to dial from the pod (`--audit-ingest`). `None` for a URL that is not http(s) with a host.
pub fn authority(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let port = match (uri.scheme_str()?, uri.port_u16()) {
        (_, Some(p)) => p,
        ("http", None) => 80,
        ("https", None) => 443,
        _ => return None,
    };
    if !matches!(uri.scheme_str()?, "http" | "https") {
        return None;
    }
    let host = uri.host().filter(|h| !h.is_empty())?;
    Some(format!("{host}:{port}"))
}

/// What rolls the apiserver when the policy or the webhook changes: a short SHA-256 of both
/// (the token in it is 256 bits of randomness, so the digest says nothing of it).
pub fn digest(policy: &str, webhook: &str) -> String {
    super::digest(&format!("{policy}\n---\n{webhook}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn rules(level: AuditLevel) -> Vec<Value> {
        let yaml = policy(&AuditPlan {
            policy: level,
            retention_days: 30,
        })
        .unwrap();
        let v: Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(v["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(v["kind"], "Policy");
        assert_eq!(v["omitStages"], json!(["RequestReceived"]));
        v["rules"].as_array().unwrap().clone()
    }

    /// The level the first matching rule gives a request on `(group, resource)` with `verb`,
    /// as the apiserver's policy checker reads rules (the fields used here).
    fn level_of(rules: &[Value], user: &str, verb: &str, group: &str, resource: &str) -> String {
        for r in rules {
            if let Some(users) = r["users"].as_array()
                && !users.iter().any(|u| u == user)
            {
                continue;
            }
            if r.get("nonResourceURLs").is_some() {
                continue;
            }
            if let Some(verbs) = r["verbs"].as_array()
                && !verbs.iter().any(|v| v == verb)
            {
                continue;
            }
            if let Some(res) = r["resources"].as_array() {
                let hit = res.iter().any(|g| {
                    g["group"] == group
                        && g["resources"]
                            .as_array()
                            .is_none_or(|rs| rs.iter().any(|x| x == resource))
                });
                if !hit {
                    continue;
                }
            }
            return r["level"].as_str().unwrap().to_owned();
        }
        "None".into()
    }

    #[test]
    fn the_default_policy_records_rbac_writes_in_full_and_secrets_without_their_data() {
        let r = rules(AuditLevel::Default);
        let l = |verb, group, res| level_of(&r, "dave", verb, group, res);
        assert_eq!(l("get", "", "pods"), "Metadata");
        assert_eq!(l("create", "apps", "deployments"), "Metadata");
        for verb in ["create", "update", "patch", "delete"] {
            assert_eq!(
                l(verb, "rbac.authorization.k8s.io", "clusterrolebindings"),
                "RequestResponse"
            );
            assert_eq!(l(verb, "", "secrets"), "Metadata", "{verb} secrets");
            assert_eq!(l(verb, "", "configmaps"), "Metadata");
        }
        assert_eq!(l("get", "rbac.authorization.k8s.io", "roles"), "Metadata");
        assert_eq!(l("create", "", "events"), "None");
        assert_eq!(
            level_of(&r, "system:apiserver", "update", "", "pods"),
            "None"
        );
    }

    #[test]
    fn the_metadata_policy_never_logs_a_body_and_none_logs_nothing() {
        let r = rules(AuditLevel::Metadata);
        for (verb, group, res) in [
            ("create", "rbac.authorization.k8s.io", "roles"),
            ("update", "", "secrets"),
            ("get", "", "pods"),
        ] {
            assert_eq!(level_of(&r, "dave", verb, group, res), "Metadata");
        }
        assert!(
            r.iter()
                .all(|x| x["level"] != "Request" && x["level"] != "RequestResponse")
        );
        assert_eq!(
            policy(&AuditPlan {
                policy: AuditLevel::None,
                retention_days: 30
            }),
            None
        );
    }

    #[test]
    fn plans_keep_events_thirty_days_unless_they_say_and_retention_is_bounded() {
        let p: AuditPlan = serde_yaml::from_str("{}").unwrap();
        assert_eq!(p, AuditPlan::default());
        assert_eq!(p.retention_days, 30);
        assert!(p.enabled());
        let p: AuditPlan = serde_yaml::from_str("{policy: none}").unwrap();
        assert!(!p.enabled());
        let p: AuditPlan = serde_yaml::from_str("{policy: metadata, retention_days: 7}").unwrap();
        assert_eq!((p.policy, p.retention_days), (AuditLevel::Metadata, 7));
        for bad in [0, MAX_RETENTION_DAYS + 1] {
            let p = AuditPlan {
                retention_days: bad,
                ..AuditPlan::default()
            };
            assert!(p.validate().is_err(), "{bad}");
        }
        assert!(serde_yaml::from_str::<AuditPlan>("{policy: everything}").is_err());
        assert!(serde_yaml::from_str::<AuditPlan>("{retention: 3}").is_err());
    }

    #[test]
    fn the_webhook_sends_the_token_to_the_ingest_and_its_authority_is_dialled() {
        let k = webhook_kubeconfig("https://vcp.vcp-system.svc:8081/audit/v1/events", "tok");
        let v: Value = serde_yaml::from_str(&k).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://vcp.vcp-system.svc:8081/audit/v1/events"
        );
        assert_eq!(v["users"][0]["user"]["token"], "tok");
        // Plain http: client-go would drop the bearer, so the token is in the path.
        let plain = webhook_kubeconfig("http://vcp.vcp-system.svc:8081/audit/v1/events/", "tok");
        let v: Value = serde_yaml::from_str(&plain).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "http://vcp.vcp-system.svc:8081/audit/v1/events/tok"
        );
        assert_eq!(v["users"][0]["user"], json!({}));
        assert_eq!(v["current-context"], "vcp");
        assert_eq!(
            authority("http://vcp.vcp-system.svc:8081/x").as_deref(),
            Some("vcp.vcp-system.svc:8081")
        );
        assert_eq!(
            authority("https://vcp.example/x").as_deref(),
            Some("vcp.example:443")
        );
        assert_eq!(
            authority("http://10.0.0.1/x").as_deref(),
            Some("10.0.0.1:80")
        );
        assert_eq!(authority("ftp://vcp/x"), None);
        assert_eq!(authority("not a url"), None);
        // A new token is a new digest (a roll); the same inputs are not.
        let p = policy(&AuditPlan::default()).unwrap();
        let other = webhook_kubeconfig("http://vcp.vcp-system.svc:8081/audit/v1/events", "tok2");
        assert_ne!(digest(&p, &k), digest(&p, &other));
        assert_eq!(digest(&p, &k), digest(&p, &k.clone()));
    }
}
