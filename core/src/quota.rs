//! The resources of a tenant-wide quota, by name: what a plan's `quota` lists, what the syncer's
//! ledger counts and its metrics label, and what the orchestrator samples and stores (one
//! column each of `usage_samples`, `migrations/0002_usage.sql`, checked by a test there).

/// The resources of a quota, by their field names (the `resource` label of the metrics, the
/// columns of `usage_samples`), in that table's column order.
pub const RESOURCES: [&str; 9] = [
    "pods",
    "requests_cpu",
    "requests_memory",
    "limits_cpu",
    "limits_memory",
    "services",
    "persistent_volume_claims",
    "requests_storage",
    "namespaces",
];

#[cfg(test)]
mod tests {
    #[test]
    fn resource_names_are_distinct_snake_case() {
        let mut seen = std::collections::BTreeSet::new();
        for r in super::RESOURCES {
            assert!(r.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{r}");
            assert!(seen.insert(r), "{r} twice");
        }
    }
}
