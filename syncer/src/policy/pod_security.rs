//! Pod Security Standards (pure): which fields of a pod break a level.
//!
//! The syncer checks every tenant pod against its plan's level before the pod reaches the
//! host; the host's Pod Security admission checks it again on every host namespace. A pod with
//! violations stays in the tenant, Pending, with a Warning event and a condition that name
//! each field and rule.

use super::Refusal;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// A Pod Security Standards level. Ordered from the most to the least permissive.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Unrestricted: an explicit admin choice.
    Privileged,
    /// Prevents known privilege escalations (the default).
    #[default]
    Baseline,
    /// Hardened: baseline plus current pod-hardening practice.
    Restricted,
}

impl Level {
    /// The level as Pod Security admission labels spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every field of `pod` that `level` does not allow (empty: admitted).
pub fn check(pod: &Pod, level: Level) -> Vec<Refusal> {
    let mut out = Vec::new();
    if level == Level::Privileged {
        return out;
    }
    let Some(spec) = &pod.spec else { return out };
    if spec.host_network == Some(true) {
        out.push(Refusal::new(
            "spec.hostNetwork",
            "baseline: host namespaces",
            "host networking is not allowed",
        ));
    }
    out
}
