//! Names of the objects only the syncer makes (pure). Tenant keys, host names, markers and
//! label rewriting are `vcp_core::naming`, shared with the orchestrator; what is here follows
//! the same rules for two kinds of object that have no tenant original.

use vcp_core::naming::{HASH_LEN, MAX_SUBDOMAIN, short_hash};

/// Name of the host Secret holding the service-account token of the tenant pod with `uid`.
/// Tenant Secrets cannot take it over (see [`vcp_core::naming::ANN_GENERATED`]).
pub fn token_secret_name(pod_uid: &str) -> String {
    format!("vcp-sa-{}", short_hash(pod_uid))
}

/// Name of the host ConfigMap holding the tenant ClusterTrustBundles that the projected
/// `clusterTrustBundle` sources of the tenant pod with `uid` select (one per pod, a key per
/// source). Generated like the token Secret, so no tenant ConfigMap can take it over.
pub fn trust_bundles_name(pod_uid: &str) -> String {
    format!("vcp-ctb-{}", short_hash(pod_uid))
}

/// The signer domain of every tenant's pod certificates on the host: no host signer answers
/// it, only the syncers relay it ([`crate::kinds::podcerts`]), and their host role may `sign`
/// for it (`pods.vcp.dev/*`) but update a request's status only in their own namespaces.
pub const POD_SIGNER_DOMAIN: &str = "pods.vcp.dev";

/// The host signer of tenant `key`'s pod certificates from the tenant's signer `signer`:
/// `pods.vcp.dev/<key>.<hash of signer>`. A tenant names any signer it likes, a host signer's
/// too; on the host it becomes one of vcp's, which no host signer answers. The tenant's name
/// is found again from the pod that asked (whose projection names it).
pub fn host_pod_signer(key: &str, signer: &str) -> String {
    format!("{POD_SIGNER_DOMAIN}/{key}.{}", short_hash(signer))
}

/// Name of the tenant Event copied from the host Event with `host_event_uid`, about tenant
/// object `object`: deterministic, so a copy is never made twice (a relist, a restart), and
/// named like the kubelet's (`<object>.<suffix>`) so it sorts with the object's own events.
pub fn event_name(object: &str, host_event_uid: &str) -> String {
    let room = MAX_SUBDOMAIN - 1 - HASH_LEN;
    // Object names are ASCII (DNS-1123), so byte slicing is safe.
    let object = &object[..object.len().min(room)];
    format!("{object}.{}", short_hash(host_event_uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_pod_signers_are_vcps_own_per_tenant_and_signer() {
        let a = host_pod_signer("demo", "example.com/s");
        assert!(a.starts_with("pods.vcp.dev/demo."), "{a}");
        assert_eq!(a, host_pod_signer("demo", "example.com/s"));
        assert_ne!(a, host_pod_signer("demo", "example.com/t"));
        assert_ne!(a, host_pod_signer("other", "example.com/s"));
        // A valid signer name: one '/', a dotted domain, a path of DNS-1123 subdomains.
        let (domain, path) = a.split_once('/').unwrap();
        assert!(domain.contains('.') && !path.contains('/'));
        assert!(
            path.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        );
    }

    #[test]
    fn event_names_are_deterministic_distinct_and_bounded() {
        assert_eq!(event_name("web-1", "u1"), event_name("web-1", "u1"));
        assert_ne!(event_name("web-1", "u1"), event_name("web-1", "u2"));
        assert!(event_name("web-1", "u1").starts_with("web-1."));
        assert_eq!(event_name(&"p".repeat(253), "u1").len(), MAX_SUBDOMAIN);
    }
}
