//! Secrets: copied into the host namespace under the same name. Service-account token
//! Secrets of the tenant are not copied: a tenant token must never be usable on the host (and
//! the type is reserved for the host's own token controller).

use crate::tenant::Ctx;
use k8s_openapi::api::core::v1::Secret;
use vcp_core::naming::host_meta;

/// The host copy of a tenant Secret, or `None` for types that must not reach the host.
pub fn to_host(secret: &Secret, ctx: &Ctx) -> Option<Secret> {
    if secret.type_.as_deref() == Some("kubernetes.io/service-account-token") {
        return None;
    }
    Some(Secret {
        metadata: host_meta(&secret.metadata, &ctx.key),
        data: secret.data.clone(),
        string_data: secret.string_data.clone(),
        type_: secret.type_.clone(),
        immutable: secret.immutable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;

    #[test]
    fn secrets_are_copied_but_service_account_tokens_are_not() {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "apps"},
            "type": "Opaque",
            "data": {"password": "cHc="},
        }))
        .unwrap();
        let host = to_host(&s, &ctx()).unwrap();
        assert_eq!(host.data.unwrap()["password"].0, b"pw");
        let mut token = s.clone();
        token.type_ = Some("kubernetes.io/service-account-token".into());
        assert!(to_host(&token, &ctx()).is_none());
    }
}
