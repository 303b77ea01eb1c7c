//! Kubeconfig files with embedded certificates (pure).

use crate::pki::CertKey;
use base64::Engine;

/// Renders a single-context kubeconfig for `user` at `server`, trusting `ca_pem`.
pub fn render(cluster: &str, server: &str, ca_pem: &str, user: &str, creds: &CertKey) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(&creds.cert_pem),
            "client-key-data": b64(&creds.key_pem),
        }}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    });
    serde_yaml::to_string(&doc).expect("a JSON value always serializes to YAML")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_kubeconfig_parses_with_kube_and_points_at_the_server() {
        let creds = CertKey {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let yaml = render("vcp-dev", "https://127.0.0.1:6443", "CA", "admin", &creds);
        let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("vcp-dev"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
    }
}
