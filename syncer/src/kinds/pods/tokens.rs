//! Service-account tokens for host pods, issued by the tenant apiserver.
//!
//! For a tenant pod with a token volume, the syncer asks the *tenant* apiserver for a token
//! of the pod's service account, bound to the tenant pod (it dies with the pod), and keeps it in
//! a host Secret [`crate::naming::token_secret_name`] with the tenant CA (`kube-root-ca.crt`) and the
//! tenant namespace; the host pod's projected volume reads from it. The token is renewed at 80%
//! of its lifetime. The Secret is marked as generated (a tenant Secret can never adopt it) and
//! owned by the host pod, so the host's garbage collector removes it with the pod. Tokens are
//! never logged.

use crate::engine::Engine;
use crate::engine::FIELD_MANAGER;
use crate::kinds::pods::translate::{TOKEN_KEYS, token_request};
use crate::kube_err;
use crate::{Error, Result};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use vcp_core::naming;

const ANN_EXPIRES: &str = "vcp.dev/token-expires";
const ANN_RENEW: &str = "vcp.dev/token-renew-after";

/// Ensures the host token Secret of tenant pod `t` is present and fresh; `host_pod` (once it
/// exists) becomes its owner.
pub async fn ensure(e: &Engine, t: &Pod, host_pod: Option<&Pod>) -> Result<()> {
    let Some((audience, expiration)) = token_request(t) else {
        return Ok(());
    };
    let (Some(uid), Some(ns)) = (t.uid(), t.namespace()) else {
        return Ok(());
    };
    let host_ns = naming::host_namespace(e.key(), &ns);
    let name = crate::naming::token_secret_name(&uid);
    let secrets: Api<Secret> = Api::namespaced(e.host.clone(), &host_ns);
    let current = secrets
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get host secret {host_ns}/{name}")))?;
    if let Some(cur) = &current {
        if !naming::owned_by(e.key(), cur.labels())
            || !cur.annotations().contains_key(naming::ANN_GENERATED)
        {
            // Not ours: never overwrite (the pod will wait for its volume, visibly).
            e.report(
                t,
                "HostConflict",
                format!("host secret {host_ns}/{name} exists and is not managed by vcp"),
            )
            .await;
            return Ok(());
        }
        let renew_after = cur
            .annotations()
            .get(ANN_RENEW)
            .and_then(|s| s.parse::<Timestamp>().ok());
        let fresh = renew_after.is_some_and(|r| Timestamp::now() < r);
        let owned = host_pod.is_none()
            || cur
                .owner_references()
                .iter()
                .any(|o| Some(&o.uid) == host_pod.and_then(|p| p.metadata.uid.as_ref()));
        if fresh && owned {
            return Ok(());
        }
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
    let ca = Api::<ConfigMap>::namespaced(e.tenant.clone(), &ns)
        .get_opt("kube-root-ca.crt")
        .await
        .map_err(kube_err(format!("get {ns}/kube-root-ca.crt")))?
        .and_then(|cm| cm.data?.get("ca.crt").cloned())
        .ok_or_else(|| {
            Error::Token(format!(
                "the tenant has not published {ns}/kube-root-ca.crt yet"
            ))
        })?;
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
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(host_ns.clone()),
            labels: Some(BTreeMap::from([(
                naming::LABEL_TENANT.to_owned(),
                e.key().to_string(),
            )])),
            annotations: Some(BTreeMap::from([
                (naming::ANN_GENERATED.to_owned(), format!("pod/{uid}")),
                (ANN_EXPIRES.to_owned(), expires.to_string()),
                (ANN_RENEW.to_owned(), renew.to_string()),
            ])),
            owner_references: host_pod.and_then(|p| {
                Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: p.name_any(),
                    uid: p.metadata.uid.clone()?,
                    ..Default::default()
                }])
            }),
            ..Default::default()
        },
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
