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

/// A self-contained kubeconfig for a person or tool outside the cluster. `tls_server_name`: the
/// name to send and verify when `server` is an address the certificate does not carry (a
/// gateway dialled by address, [`crate::render::Expose::dial`]).
pub fn embedded(
    cluster: &str,
    (server, tls_server_name): (&str, Option<&str>),
    ca_pem: &str,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    let mut entry = json!({
        "server": server,
        "certificate-authority-data": STANDARD.encode(ca_pem),
    });
    if let Some(name) = tls_server_name {
        entry["tls-server-name"] = json!(name);
    }
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": entry}],
        "users": [{"name": user, "user": {
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem),
        }}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    });
    serde_yaml::to_string(&doc).expect("a JSON value is valid YAML")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(doc: &str) -> serde_json::Value {
        let v: serde_json::Value = serde_yaml::from_str(doc).unwrap();
        v["clusters"][0]["cluster"].clone()
    }

    #[test]
    fn a_server_name_is_written_only_when_the_address_differs_from_it() {
        let plain = embedded("t", ("https://a.example:6443", None), "CA", "u", "C", "K");
        let c = cluster(&plain);
        assert_eq!(c["server"], "https://a.example:6443");
        assert!(c.get("tls-server-name").is_none());

        let via = embedded(
            "t",
            ("https://10.0.0.2:31443", Some("k1.tenants.test")),
            "CA",
            "u",
            "C",
            "K",
        );
        let c = cluster(&via);
        assert_eq!(c["server"], "https://10.0.0.2:31443");
        assert_eq!(c["tls-server-name"], "k1.tenants.test");
        assert_eq!(c["certificate-authority-data"], STANDARD.encode("CA"));
    }
}
