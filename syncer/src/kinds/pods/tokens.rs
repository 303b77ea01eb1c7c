//! Service-account tokens for host pods, issued by the tenant apiserver.
//!
//! For a tenant pod with a token volume, the syncer asks the *tenant* apiserver for a token
//! of the pod's service account, bound to the tenant pod (it dies with the pod), and keeps it in
//! a host Secret [`crate::naming::token_secret_name`] with the tenant CA (`kube-root-ca.crt`) and the
//! tenant namespace; the host pod's projected volume reads from it. The token is renewed at 80%
//! of its lifetime, or at once when it was issued under another token generation than the
//! syncer's (`--token-generation`: vcp changes it when it rotates the tenant's CA or signing
//! key, so a token signed by a key about to be retired, or a CA bundle about to go stale, is
//! replaced while both are still trusted). The Secret is generated for the pod
//! ([`super::generated`]: marked, so no tenant Secret can adopt it, and owned by the host pod,
//! so the host's garbage collector removes it with the pod). Tokens are never logged.
//!
//! A token is asked for only once the tenant pod is bound to its (virtual) node, as a kubelet
//! asks only for pods bound to it: the tenant apiserver then puts the node's name and UID in
//! the token (`authentication.kubernetes.io/node-name`, `node-uid`), which node-bound
//! authorizers and the conformance suite read. Until then the host pod waits for its volume;
//! the Secret follows the binding within one pass (see `FailedMount` in the events' filter).

use crate::engine::Engine;
use crate::engine::FIELD_MANAGER;
use crate::kinds::pods::generated::{self, Standing};
use crate::kinds::pods::translate::{TOKEN_KEYS, token_request};
use crate::kube_err;
use crate::{Error, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use vcp_core::host_pod::HostPod;
use vcp_core::naming;

const ANN_EXPIRES: &str = "vcp.dev/token-expires";
const ANN_RENEW: &str = "vcp.dev/token-renew-after";
/// The node the tenant pod was bound to when its token was issued.
const ANN_NODE: &str = "vcp.dev/token-node";
use vcp_core::naming::ANN_TOKEN_GENERATION as ANN_GENERATION;

/// Under what tenant pods' tokens are issued.
#[derive(Debug, Clone, Default)]
pub struct TokenSource {
    /// The current token generation; tokens recorded under another are reissued.
    pub generation: String,
    /// The CA bundle pods get as `ca.crt`; the tenant's `kube-root-ca.crt` when `None`.
    pub ca_file: Option<std::path::PathBuf>,
}

/// Whether a host token Secret may be kept: it is not due for renewal, was issued under the
/// current generation and names the node the pod is bound to (one written before the syncer
/// recorded nodes is kept until its renewal).
fn still_fresh(
    annotations: &BTreeMap<String, String>,
    generation: &str,
    node: &str,
    now: Timestamp,
) -> bool {
    let renew_after = annotations
        .get(ANN_RENEW)
        .and_then(|s| s.parse::<Timestamp>().ok());
    let same_generation = annotations
        .get(ANN_GENERATION)
        .map(String::as_str)
        .unwrap_or_default()
        == generation;
    let same_node = annotations.get(ANN_NODE).is_none_or(|n| n == node);
    same_generation && same_node && renew_after.is_some_and(|r| now < r)
}

/// Ensures the host token Secret of tenant pod `t`, bound to node `node`, is present and
/// fresh; `host_pod` (once it exists) becomes its owner. Nothing while `node` is `None`.
pub async fn ensure(
    e: &Engine,
    tokens: &TokenSource,
    t: &Pod,
    node: Option<&str>,
    host_pod: Option<&HostPod>,
) -> Result<()> {
    let (Some((audience, expiration)), Some(node)) = (token_request(t), node) else {
        return Ok(());
    };
    let (Some(uid), Some(ns)) = (t.uid(), t.namespace()) else {
        return Ok(());
    };
    let host_ns = naming::host_namespace(e.key(), &ns);
    let name = crate::naming::token_secret_name(&uid);
    let secrets: Api<Secret> = Api::namespaced(e.host.clone(), &host_ns);
    // From the Secret kind's host cache, which holds the tenant's token Secrets too.
    let current = crate::engine::cached_or_get(e, &e.host_secrets, &host_ns, &name).await?;
    match generated::standing(e.key(), current.as_ref().map(|c| &c.metadata), host_pod) {
        Standing::Foreign => {
            generated::refuse_foreign(e, t, "secret", &host_ns, &name).await;
            return Ok(());
        }
        Standing::Ours { owned: true }
            if current.as_ref().is_some_and(|c| {
                still_fresh(c.annotations(), &tokens.generation, node, Timestamp::now())
            }) =>
        {
            return Ok(());
        }
        _ => {}
    }
    let sa = t
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let mut req = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": expiration.max(600),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": t.name_any(), "uid": uid},
        },
    });
    if let Some(aud) = audience {
        req["spec"]["audiences"] = serde_json::json!([aud]);
    }
    let tenant_sas: Api<ServiceAccount> = Api::namespaced(e.tenant.clone(), &ns);
    let tr: TokenRequest = tenant_sas
        .create_subresource("token", &sa, &PostParams::default(), &req)
        .await
        .map_err(kube_err(format!(
            "request a token for service account {ns}/{sa}"
        )))?;
    let status = tr
        .status
        .ok_or_else(|| Error::Token(format!("no token for service account {ns}/{sa}")))?;
    let token = status
        .token
        .ok_or_else(|| Error::Token(format!("empty token for service account {ns}/{sa}")))?;
    let ca = match &tokens.ca_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|err| Error::Token(format!("read the token CA {}: {err}", path.display())))?,
        None => Api::<ConfigMap>::namespaced(e.tenant.clone(), &ns)
            .get_opt("kube-root-ca.crt")
            .await
            .map_err(kube_err(format!("get {ns}/kube-root-ca.crt")))?
            .and_then(|cm| cm.data?.get("ca.crt").cloned())
            .ok_or_else(|| {
                Error::Token(format!(
                    "the tenant has not published {ns}/kube-root-ca.crt yet"
                ))
            })?,
    };
    let expires = status
        .expiration_timestamp
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now);
    let lifetime = expires.as_second() - Timestamp::now().as_second();
    let renew =
        Timestamp::from_second(Timestamp::now().as_second() + lifetime * 8 / 10).unwrap_or(expires);
    let data: BTreeMap<String, ByteString> = TOKEN_KEYS
        .iter()
        .zip([token, ca, ns.clone()])
        .map(|(k, v)| ((*k).to_owned(), ByteString(v.into_bytes())))
        .collect();
    let secret = Secret {
        metadata: generated::meta(
            e.key(),
            &host_ns,
            &name,
            &uid,
            host_pod,
            [
                (ANN_EXPIRES.to_owned(), expires.to_string()),
                (ANN_RENEW.to_owned(), renew.to_string()),
                (ANN_GENERATION.to_owned(), tokens.generation.clone()),
                (ANN_NODE.to_owned(), node.to_owned()),
            ],
        ),
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    if current.is_none() {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match secrets.create(&pp, &secret).await {
            Ok(_) => {
                tracing::info!(ns = %ns, pod = %t.name_any(), "issued tenant token for host pod");
                return Ok(());
            }
            // Raced with another reconcile, or a foreign object appeared: the next pass decides.
            Err(kube::Error::Api(ae)) if ae.code == 409 => return Ok(()),
            Err(err) => {
                return Err(kube_err(format!("create host secret {host_ns}/{name}"))(
                    err,
                ));
            }
        }
    }
    secrets
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(kube_err(format!("renew host secret {host_ns}/{name}")))?;
    tracing::info!(ns = %ns, pod = %t.name_any(), "renewed tenant token for host pod");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(renew_after: &str, generation: Option<&str>) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(ANN_RENEW.to_owned(), renew_after.to_owned())]);
        if let Some(g) = generation {
            a.insert(ANN_GENERATION.to_owned(), g.to_owned());
        }
        a
    }

    #[test]
    fn a_token_is_kept_until_its_renewal_time_or_a_new_generation() {
        let now: Timestamp = "2026-11-25T12:00:00Z".parse().unwrap();
        let later = "2026-11-25T12:30:00Z";
        let earlier = "2026-11-25T11:30:00Z";
        assert!(still_fresh(
            &annotations(later, Some("g1")),
            "g1",
            "n1",
            now
        ));
        assert!(
            !still_fresh(&annotations(earlier, Some("g1")), "g1", "n1", now),
            "due"
        );
        assert!(
            !still_fresh(&annotations(later, Some("g1")), "g2", "n1", now),
            "issued under the key being retired"
        );
        assert!(
            still_fresh(&annotations(later, None), "", "n1", now),
            "a syncer without generations keeps what older syncers wrote"
        );
        assert!(!still_fresh(&annotations(later, None), "g1", "n1", now));
        assert!(!still_fresh(
            &annotations("garbage", Some("g1")),
            "g1",
            "n1",
            now
        ));
    }

    #[test]
    fn a_token_names_the_node_its_pod_is_bound_to() {
        let now: Timestamp = "2026-11-25T12:00:00Z".parse().unwrap();
        let mut a = annotations("2026-11-25T12:30:00Z", Some("g1"));
        a.insert(ANN_NODE.to_owned(), "n1".to_owned());
        assert!(still_fresh(&a, "g1", "n1", now));
        assert!(!still_fresh(&a, "g1", "n2", now), "issued for another node");
    }
}
