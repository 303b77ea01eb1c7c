//! How lean a plan's control planes run: the settings a plan's `tuning` names, checked when the
//! plans load and turned into each component's extra flags and environment for the templates.
//!
//! Pure: [`Tuning::validate`] runs in `parse_plans`, and the render context carries
//! [`Tuning::args`], [`Tuning::env`], [`Tuning::controllers`] and
//! [`Tuning::dns_cache_seconds`] per component. Nothing
//! set means nothing added: a plan without `tuning` renders exactly as before it existed.
//!
//! Why these knobs: an idle tenant's memory is mostly Go heaps (the apiserver's above all) that
//! grow to twice what is live before a collection (`GOGC=100`), the apiserver's watch cache
//! (a store and an event window per resource), and etcd's in-memory raft log (kept up to
//! `--snapshot-count` entries). `GOGC` and `GOMEMLIMIT` trade CPU for memory; the watch cache
//! trades etcd reads for memory. Each is a plan's choice (docs/orchestrator.md, "Plans").

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The components `tuning` acts on (their Go runtimes; the syncer is Rust).
pub const GO_COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "coredns",
];

/// A plan's `tuning`; every field absent means the component's own default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    /// `GOGC` of every Go component: how far, in percent of the live heap, the heap grows
    /// before a collection (Go's default 100). 10 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gogc: Option<u32>,
    /// `GOMEMLIMIT` per component (`etcd`, `kube-apiserver`, `kube-controller-manager`,
    /// `coredns`), MiB: Go collects harder as the heap nears it. A soft limit: a component
    /// whose live heap is larger runs on, collecting often. At least 16.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_limit_mib: BTreeMap<String, u32>,
    /// The apiserver's watch cache (`--watch-cache`): `false` serves lists and watches from
    /// etcd, which keeps no copy of every object in the apiserver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver_watch_cache: Option<bool>,
    /// etcd's backend quota (`--quota-backend-bytes`), MiB: past it etcd refuses writes until
    /// compacted and defragmented. 64 to 8192.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_quota_mib: Option<u32>,
    /// Raft entries etcd keeps in memory before a snapshot (`--snapshot-count`; 10000 by
    /// default). 100 to 100000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshot_count: Option<u32>,
    /// The longest CoreDNS keeps an answer (its `cache` plugin; 30 by default); 0: no cache.
    /// At most 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_cache_seconds: Option<u32>,
    /// API groups and versions the apiserver serves or not (`--runtime-config`), each
    /// `group/version=true|false` (`api/all`, `api/ga`, `api/beta`, `api/alpha` too). An API
    /// left out is not served at all: what the conformance suite tests of it then fails.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apiserver_runtime_config: Vec<String>,
    /// Controllers the controller-manager does not run, beyond `nodelifecycle` (which no
    /// tenant runs: its nodes are the host's), by the names `--controllers` takes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disabled_controllers: Vec<String>,
}

/// Whether `entry` is a `--runtime-config` entry: `group/version=true|false`, the core group
/// as `v1` or `api/v1`, or one of the `api/...` switches.
fn runtime_config_entry(entry: &str) -> bool {
    let Some((api, on)) = entry.split_once('=') else {
        return false;
    };
    let name = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
    };
    matches!(on, "true" | "false")
        && !api.is_empty()
        && api.split('/').count() <= 2
        && api.split('/').all(name)
}

/// Whether `name` can be a controller name (`--controllers`: lowercase words and dashes).
fn controller_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

impl Tuning {
    /// Why this tuning cannot be used, if it cannot (the plan is refused when plans load).
    pub fn validate(&self) -> Result<(), String> {
        let ranges = [
            ("gogc", self.gogc, 10, 1000),
            ("etcd_quota_mib", self.etcd_quota_mib, 64, 8192),
            (
                "etcd_snapshot_count",
                self.etcd_snapshot_count,
                100,
                100_000,
            ),
            ("dns_cache_seconds", self.dns_cache_seconds, 0, 3600),
        ];
        for (field, value, lo, hi) in ranges {
            if let Some(v) = value
                && !(lo..=hi).contains(&v)
            {
                return Err(format!("tuning.{field} must be {lo} to {hi}, not {v}"));
            }
        }
        for (c, mib) in &self.memory_limit_mib {
            if !GO_COMPONENTS.contains(&c.as_str()) {
                return Err(format!(
                    "tuning.memory_limit_mib names {c:?}; it takes {}",
                    GO_COMPONENTS.join(", ")
                ));
            }
            if *mib < 16 {
                return Err(format!(
                    "tuning.memory_limit_mib.{c} must be at least 16, not {mib}"
                ));
            }
        }
        if let Some(bad) = self
            .apiserver_runtime_config
            .iter()
            .find(|e| !runtime_config_entry(e))
        {
            return Err(format!(
                "tuning.apiserver_runtime_config entry {bad:?} is not group/version=true|false"
            ));
        }
        if let Some(bad) = self
            .disabled_controllers
            .iter()
            .find(|c| !controller_name(c))
        {
            return Err(format!(
                "tuning.disabled_controllers entry {bad:?} is not a controller name"
            ));
        }
        Ok(())
    }

    /// The flags `component` gets beyond its template's.
    pub fn args(&self, component: &str) -> Vec<String> {
        let mut out = Vec::new();
        match component {
            "kube-apiserver" => {
                if let Some(on) = self.apiserver_watch_cache {
                    out.push(format!("--watch-cache={on}"));
                }
                if !self.apiserver_runtime_config.is_empty() {
                    out.push(format!(
                        "--runtime-config={}",
                        self.apiserver_runtime_config.join(",")
                    ));
                }
            }
            "etcd" => {
                if let Some(q) = self.etcd_quota_mib {
                    out.push(format!("--quota-backend-bytes={}", u64::from(q) << 20));
                }
                if let Some(n) = self.etcd_snapshot_count {
                    out.push(format!("--snapshot-count={n}"));
                }
            }
            _ => {}
        }
        out
    }

    /// The environment `component` gets beyond its template's (`GOGC`, `GOMEMLIMIT`), as
    /// container `env` entries.
    pub fn env(&self, component: &str) -> Vec<Value> {
        let mut out = Vec::new();
        if !GO_COMPONENTS.contains(&component) {
            return out;
        }
        if let Some(g) = self.gogc {
            out.push(json!({"name": "GOGC", "value": g.to_string()}));
        }
        if let Some(mib) = self.memory_limit_mib.get(component) {
            out.push(json!({"name": "GOMEMLIMIT", "value": format!("{mib}MiB")}));
        }
        out
    }

    /// The controller-manager's `--controllers`: all but `nodelifecycle` and the plan's.
    pub fn controllers(&self) -> String {
        std::iter::once("*".to_owned())
            .chain(std::iter::once("-nodelifecycle".to_owned()))
            .chain(self.disabled_controllers.iter().map(|c| format!("-{c}")))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// CoreDNS's `cache` plugin's TTL cap; 0 leaves the plugin out.
    pub fn dns_cache_seconds(&self) -> u32 {
        self.dns_cache_seconds.unwrap_or(30)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning(yaml: &str) -> Tuning {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn nothing_set_adds_nothing() {
        let t = Tuning::default();
        assert_eq!(t.validate(), Ok(()));
        for c in GO_COMPONENTS {
            assert!(t.args(c).is_empty() && t.env(c).is_empty(), "{c}");
        }
        assert_eq!(t.dns_cache_seconds(), 30);
        assert_eq!(t.controllers(), "*,-nodelifecycle");
    }

    #[test]
    fn served_apis_and_controllers_come_from_the_plan() {
        let t = tuning(
            "{apiserver_runtime_config: [flowcontrol.apiserver.k8s.io/v1=false, api/alpha=false, v1=true],
              disabled_controllers: [ttl, resourceclaim]}",
        );
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(
            t.args("kube-apiserver"),
            ["--runtime-config=flowcontrol.apiserver.k8s.io/v1=false,api/alpha=false,v1=true"]
        );
        assert_eq!(t.controllers(), "*,-nodelifecycle,-ttl,-resourceclaim");
    }

    #[test]
    fn each_setting_reaches_its_component_only() {
        let t = tuning(
            "{gogc: 50, memory_limit_mib: {kube-apiserver: 160, etcd: 48}, apiserver_watch_cache: false,
              etcd_quota_mib: 256, etcd_snapshot_count: 2000, dns_cache_seconds: 0}",
        );
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(t.args("kube-apiserver"), ["--watch-cache=false"]);
        assert_eq!(
            t.args("etcd"),
            ["--quota-backend-bytes=268435456", "--snapshot-count=2000"]
        );
        assert!(t.args("kube-controller-manager").is_empty());
        assert_eq!(
            t.env("kube-apiserver"),
            [
                json!({"name": "GOGC", "value": "50"}),
                json!({"name": "GOMEMLIMIT", "value": "160MiB"})
            ]
        );
        assert_eq!(t.env("coredns"), [json!({"name": "GOGC", "value": "50"})]);
        assert!(t.env("vcp-syncer").is_empty(), "not a Go component");
        assert_eq!(t.dns_cache_seconds(), 0);
    }

    #[test]
    fn out_of_range_or_unknown_settings_are_refused_with_the_field_named() {
        for (yaml, field) in [
            ("{gogc: 5}", "tuning.gogc"),
            ("{memory_limit_mib: {vcp-syncer: 64}}", "vcp-syncer"),
            (
                "{memory_limit_mib: {etcd: 8}}",
                "tuning.memory_limit_mib.etcd",
            ),
            ("{etcd_quota_mib: 10}", "tuning.etcd_quota_mib"),
            ("{etcd_snapshot_count: 5}", "tuning.etcd_snapshot_count"),
            ("{dns_cache_seconds: 7200}", "tuning.dns_cache_seconds"),
            (
                "{apiserver_runtime_config: [batch/v1]}",
                "tuning.apiserver_runtime_config",
            ),
            (
                "{apiserver_runtime_config: [\"batch/v1=maybe\"]}",
                "tuning.apiserver_runtime_config",
            ),
            (
                "{apiserver_runtime_config: [\"a/b/c=true\"]}",
                "tuning.apiserver_runtime_config",
            ),
            (
                "{apiserver_runtime_config: [\"Batch/v1=true,x=y\"]}",
                "tuning.apiserver_runtime_config",
            ),
            (
                "{disabled_controllers: [\"ttl,garbage\"]}",
                "tuning.disabled_controllers",
            ),
            (
                "{disabled_controllers: [\"\"]}",
                "tuning.disabled_controllers",
            ),
        ] {
            let err = tuning(yaml).validate().unwrap_err();
            assert!(err.contains(field), "{yaml}: {err}");
        }
        assert!(
            serde_yaml::from_str::<Tuning>("{gc: 50}").is_err(),
            "unknown field"
        );
    }
}
