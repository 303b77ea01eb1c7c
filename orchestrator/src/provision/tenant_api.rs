//! Talking to a tenant's own apiserver (through [`crate::host::tenant`]'s client): readiness
//! (`/readyz`), the bootstrap objects it writes (RBAC for vcp's components, the roles that aggregate), and
//! the gates of an upgrade hop (a write answered, a canary ConfigMap's round trip through the
//! syncer to the host and back).

use crate::host::{Provisioner, ssa as host};
use crate::inventory::Tenant;
use crate::lifecycle::steps::{self, StepResult};
use crate::lifecycle::upgrade;
use crate::{Error, Result, pki, render};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use vcp_core::naming::control_plane_namespace;

impl Provisioner {
    /// Whether the tenant is settled for its users: its `default` namespace exists, and the
    /// aggregated roles that user groups are bound to (`view`, `edit`; see
    /// [`crate::kubeconfigs::access::LEVELS`]) have their rules, which the controller-manager fills.
    pub(crate) async fn tenant_settled(
        &self,
        ns: &str,
        endpoint: Option<&str>,
    ) -> Result<StepResult> {
        if self.config.simulate {
            return Ok(StepResult::Ready);
        }
        let client = self.tenant_client(ns, endpoint).await?;
        // The apiserver creates `default` itself, in a loop of its own that may run seconds
        // after `/readyz` (seen in CI: a tenant Ready, then `namespaces "default" not found`
        // on a user's first write). Ready waits for it, so a first `kubectl apply` lands.
        let default = Api::<Namespace>::all(client.clone())
            .get_opt("default")
            .await
            .map_err(|e| Error::kube("read the tenant's default namespace", e))?;
        if default.is_none() {
            return Ok(StepResult::Waiting(
                "the apiserver has not created the default namespace yet".into(),
            ));
        }
        let roles: Api<ClusterRole> = Api::all(client);
        for name in ["view", "edit"] {
            let role = roles
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("read the tenant's {name} role"), e))?;
            if role.and_then(|r| r.rules).is_none_or(|r| r.is_empty()) {
                return Ok(StepResult::Waiting(format!(
                    "the controller-manager has not aggregated the {name} role yet"
                )));
            }
        }
        Ok(StepResult::Ready)
    }

    /// Whether the tenant apiserver gets answers from its revocation authorizer (the sidecar
    /// in its pod): a tenant is Ready only once it enforces revocations. Asked with a
    /// SubjectAccessReview for a made-up user carrying a revocation group (the webhook's
    /// matchConditions send it there); an authorizer the apiserver cannot reach shows as the
    /// review's evaluation error.
    /// In simulate mode nothing talks to the tenant (there is no apiserver to ask).
    pub(crate) async fn revocations_answered(
        &self,
        ns: &str,
        endpoint: Option<&str>,
    ) -> Result<StepResult> {
        use k8s_openapi::api::authorization::v1::SubjectAccessReview;
        if self.config.simulate {
            return Ok(StepResult::Ready);
        }
        let client = self.tenant_client(ns, endpoint).await?;
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "vcp:revocation-probe",
                "groups": [vcp_core::revocation::group_of("00")],
                "nonResourceAttributes": {"path": "/version", "verb": "get"},
            },
        }))
        .map_err(|e| Error::Config(format!("a SubjectAccessReview: {e}")))?;
        let answer = Api::<SubjectAccessReview>::all(client)
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| {
                Error::kube(
                    "ask the tenant apiserver about its revocation authorizer",
                    e,
                )
            })?;
        Ok(match answer.status.and_then(|s| s.evaluation_error) {
            Some(e) if !e.is_empty() => StepResult::Waiting(format!(
                "the apiserver does not reach its revocation authorizer yet: {e}"
            )),
            _ => StepResult::Ready,
        })
    }

    /// The tenant apiserver's `GET /readyz`, asked directly (not through its pods' probe).
    pub(crate) async fn readyz(&self, ns: &str, endpoint: Option<&str>) -> steps::Readyz {
        if self.config.simulate {
            return steps::Readyz::Simulated;
        }
        let answer = async {
            let client = self.tenant_client(ns, endpoint).await?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Config(e.to_string()))?;
            client
                .request_text(req)
                .await
                .map_err(|e| Error::kube("ask the tenant apiserver /readyz", e))
        };
        match answer.await {
            Ok(body) => steps::Readyz::Answered(body),
            Err(Error::Kube { source, .. }) => steps::Readyz::Unreachable(source.to_string()),
            Err(e) => steps::Readyz::Unreachable(e.public()),
        }
    }

    /// An upgrade's own gate, checked once every step is ready on the hop's version: the
    /// tenant API answers a write (a canary ConfigMap in `default`, applied with this hop's
    /// stamp) and reads it back. (The syncer copies ConfigMaps only while a pod uses them, so
    /// the round trip through the syncer to the host needs a canary it always carries; not
    /// built yet.) In simulate mode nothing talks to the tenant.
    pub(crate) async fn upgrade_gate(
        &self,
        t: &Tenant,
        a: &upgrade::Active,
        endpoint: Option<&str>,
    ) -> StepResult {
        if self.config.simulate {
            return StepResult::Ready;
        }
        match self.canary(t, a, endpoint).await {
            Ok(r) => r,
            Err(e) => StepResult::Waiting(format!("canary: {}", e.public())),
        }
    }

    pub(crate) async fn canary(
        &self,
        t: &Tenant,
        a: &upgrade::Active,
        endpoint: Option<&str>,
    ) -> Result<StepResult> {
        use vcp_core::naming::{
            ANN_CANARY_SEEN, CANARY_KEY, CANARY_NAME, CANARY_NAMESPACE, host_namespace,
        };
        let stamp = format!("{}/{}", a.id, a.hop_to);
        let ns = control_plane_namespace(&t.key);
        let client = self.tenant_client(&ns, endpoint).await?;
        let tenant: Api<ConfigMap> = Api::namespaced(client, CANARY_NAMESPACE);
        let canary = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CANARY_NAME},
            "data": {CANARY_KEY: stamp},
        });
        tenant
            .patch(
                CANARY_NAME,
                &PatchParams::apply(host::FIELD_MANAGER).force(),
                &Patch::Apply(&canary),
            )
            .await
            .map_err(|e| Error::kube("write the upgrade canary", e))?;
        let read = tenant
            .get(CANARY_NAME)
            .await
            .map_err(|e| Error::kube("read the upgrade canary", e))?;
        let has = |cm: &ConfigMap| cm.data.as_ref().and_then(|d| d.get(CANARY_KEY)) == Some(&stamp);
        if !has(&read) {
            return Ok(StepResult::Waiting(
                "the tenant API lost the canary write".into(),
            ));
        }
        // The round trip: the syncer copied it to the host and marked the tenant object back.
        // Both are checked, since the tenant itself could write the mark.
        let host_ns = host_namespace(&t.key, CANARY_NAMESPACE);
        let on_host = Api::<ConfigMap>::namespaced(self.host.clone(), &host_ns)
            .get_opt(CANARY_NAME)
            .await
            .map_err(|e| Error::kube("read the upgrade canary's host copy", e))?;
        if !on_host.as_ref().is_some_and(has) {
            return Ok(StepResult::Waiting(
                "the canary is not on the host yet (syncer)".into(),
            ));
        }
        if kube::ResourceExt::annotations(&read).get(ANN_CANARY_SEEN) != Some(&stamp) {
            return Ok(StepResult::Waiting(
                "the canary is not back from the host yet (syncer)".into(),
            ));
        }
        Ok(StepResult::Ready)
    }

    pub(crate) async fn bootstrap(&self, ns: &str, endpoint: Option<&str>) -> Result<StepResult> {
        if self.config.simulate {
            return Ok(StepResult::Ready);
        }
        let client = self.tenant_client(ns, endpoint).await?;
        let pp = PatchParams::apply(host::FIELD_MANAGER).force();
        let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
        for (group, role) in crate::kubeconfigs::access::LEVELS {
            let name = crate::kubeconfigs::access::level_binding_name(group);
            let body = crate::kubeconfigs::access::level_binding(group, role);
            crbs.patch(&name, &pp, &Patch::Apply(&body))
                .await
                .map_err(|e| Error::kube(format!("bind group {group} in the tenant"), e))?;
        }
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "vcp:coredns", "labels": {render::LABEL_MANAGED_BY: "vcp"}},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        });
        roles
            .patch("vcp:coredns", &pp, &Patch::Apply(&role))
            .await
            .map_err(|e| Error::kube("create the CoreDNS role in the tenant", e))?;
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "vcp:coredns", "labels": {render::LABEL_MANAGED_BY: "vcp"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": pki::COREDNS_USER}],
        });
        crbs.patch("vcp:coredns", &pp, &Patch::Apply(&binding))
            .await
            .map_err(|e| Error::kube("bind the CoreDNS role in the tenant", e))?;
        Ok(StepResult::Ready)
    }
}
