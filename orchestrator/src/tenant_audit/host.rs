//! What a pass does for a tenant's audit log: gives its apiserver the policy of its plan and a
//! webhook to vcp's ingest with a token of the tenant's own, in the host Secret
//! `audit-config`, and returns the digest that rolls the apiserver when either changes.
//!
//! The token lives in two places: in the Secret (plaintext, for the apiserver; the host
//! control-plane namespace is out of the tenant's reach) and in the inventory (its SHA-256
//! only, for the ingest). A pass keeps the Secret's token while the inventory holds its hash;
//! otherwise (first pass, or a replica killed between the two writes) it makes a new one,
//! stores its hash first and then writes the Secret, so the Secret never holds a token the
//! ingest would refuse for longer than a pass.

use crate::host::Provisioner;
use crate::http::auth::token_hash;
use crate::inventory::Tenant;
use crate::render::audit as rendered;
use crate::render::{self, Object, Plan};
use crate::{Error, Result};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;

impl Provisioner {
    /// Writes the tenant's audit Secret; the digest for the apiserver's pod template (empty
    /// when the tenant keeps no audit log: no ingest configured, or a plan with `policy: none`).
    pub(crate) async fn ensure_audit(&self, t: &Tenant, ns: &str, plan: &Plan) -> Result<String> {
        let (Some(url), Some(policy)) = (
            self.config.settings.audit_url.as_deref(),
            rendered::policy(&plan.audit),
        ) else {
            return Ok(String::new());
        };
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), ns);
        let current = secrets
            .get_opt(rendered::SECRET)
            .await
            .map_err(|e| Error::kube(format!("read secret {ns}/{}", rendered::SECRET), e))?
            .and_then(|s| s.data?.get(rendered::TOKEN_KEY).cloned())
            .and_then(|b| String::from_utf8(b.0).ok());
        let token = match current {
            Some(tok)
                if self
                    .inventory
                    .audit_token_is(t.id, &token_hash(&tok))
                    .await? =>
            {
                tok
            }
            _ => {
                let tok = vcp_pki::new_token();
                self.inventory
                    .set_audit_token(t.id, &token_hash(&tok))
                    .await?;
                tracing::info!(tenant = %t.name, "new audit ingest token");
                tok
            }
        };
        let webhook = rendered::webhook_kubeconfig(url, &token);
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let secret = Object(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": rendered::SECRET,
                "namespace": ns,
                "labels": {
                    render::LABEL_CONTROL_PLANE_OF: t.key,
                    render::LABEL_MANAGED_BY: "vcp",
                },
            },
            "type": "Opaque",
            // `data`, not `stringData`: applied again unchanged, it changes nothing.
            "data": {
                rendered::POLICY_FILE: b64(&policy),
                rendered::WEBHOOK_FILE: b64(&webhook),
                rendered::TOKEN_KEY: b64(&token),
            },
        }));
        crate::host::ssa::apply(&self.host, &secret, false).await?;
        Ok(rendered::digest(&policy, &webhook))
    }
}
