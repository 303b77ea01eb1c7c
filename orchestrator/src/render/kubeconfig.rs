//! Kubeconfig documents (pure).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

/// A kubeconfig for a control-plane pod: the client certificate and CA come from files of a
/// mounted Secret (`tls.crt`, `tls.key`, `ca.crt` in `dir`), so a renewed certificate needs no
/// new kubeconfig.
pub fn in_cluster(server: &str, dir: &str) -> String {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tenant", "cluster": {
            "server": server,
            "certificate-authority": format!("{dir}/ca.crt"),
        }}],
        "users": [{"name": "vcp", "user": {
            "client-certificate": format!("{dir}/tls.crt"),
            "client-key": format!("{dir}/tls.key"),
        }}],
        "contexts": [{"name": "vcp", "context": {"cluster": "tenant", "user": "vcp"}}],
        "current-context": "vcp",
    });
    serde_yaml::to_string(&doc).expect("a JSON value is valid YAML")
}

/// A self-contained kubeconfig for a person or tool outside the cluster.
pub fn embedded(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem),
        }}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    });
    serde_yaml::to_string(&doc).expect("a JSON value is valid YAML")
}
