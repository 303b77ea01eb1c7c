//! The tenant-wide quota of the plan (pure): what the tenant may hold on the host across all
//! its namespaces, and which objects get it.
//!
//! A host ResourceQuota is per namespace, so it cannot say "100 pods in all of this tenant's
//! namespaces". The syncer decides that before it creates a host object, from a running
//! [`Ledger`] of the tenant's objects that its watches keep current ([`ledger`]): objects on
//! the host (or admitted) hold their share; the others wait in line, in creation order (then
//! namespace and name), and each is admitted iff it fits what the holders and the objects
//! admitted before it left, as `services::admitted` does for NodePorts. The order is a
//! property of the tenant's objects alone, so every restarted syncer admits the same set, and
//! two objects created at once can never both take the last slot. Refused objects take
//! nothing and wait: when a holder goes, the next in line fits. [`admitted`] is the same
//! ledger fed everything at once.
//!
//! CPU and memory are counted as the host will see them: [`effective_resources`] applies the
//! plan's container defaults ([`Limits`]) where a container sets none, and the init-container
//! rule Kubernetes schedules by. The syncer writes the same defaults into the host pod
//! ([`fill_defaults`]), and every host namespace of the tenant gets a LimitRange with them and
//! a ResourceQuota with the tenant's totals as a backstop (the syncer's namespace translation).
//!
//! Quantities are Kubernetes quantity strings (`500m`, `2Gi`, `1.5`), parsed exactly by
//! [`parse_quantity`] (k8s-openapi carries them as strings only).
//!
//! What a tenant holds is counted twice, by the same rules: [`admitted`] counts the tenant
//! objects it admits (the syncer's `/metrics`), and [`host_usage`] counts the host objects the
//! syncer made of them (vcp samples it into its inventory for billing). The host copies of an
//! admitted set count exactly what admission counted, so a sample never exceeds the quota
//! (property-tested below).

pub mod ledger;

use super::{Error, Refusal};
use k8s_openapi::api::core::v1::{
    Container, Namespace, PersistentVolumeClaim, Pod, PodSpec, ResourceRequirements, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube_core::ResourceExt;
pub use ledger::{Counted, Judgement, Kind, Ledger};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use vcp_core::naming;

/// A Kubernetes quantity as written in a plan (`500m`, `64Gi`), checked by
/// `TenantPolicy::validate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl Quantity {
    /// Thousandths of the unit (millicores of CPU), rounded up; 0 if it does not parse
    /// (validation refuses such a policy first, and 0 fails closed).
    pub fn millis(&self) -> u64 {
        millis(&self.0).unwrap_or(0)
    }

    /// Whole units (bytes of memory or storage), rounded up; 0 if it does not parse.
    pub fn units(&self) -> u64 {
        units(&self.0).unwrap_or(0)
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Quantity(s.to_owned())
    }
}

/// The plan's limits for the tenant as a whole, over all its namespaces. Each is optional: an
/// absent one is unlimited. A plan that writes a `quota` section replaces the default quota
/// whole (unlisted resources become unlimited); a plan without one gets [`Quota::plan_default`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Quota {
    /// Pods that may exist at once (pods that finished or are terminating do not count).
    pub pods: Option<u64>,
    /// CPU all pods may request together (`20`, `500m`).
    pub requests_cpu: Option<Quantity>,
    /// Memory all pods may request together (`64Gi`).
    pub requests_memory: Option<Quantity>,
    /// CPU limits of all pods together.
    pub limits_cpu: Option<Quantity>,
    /// Memory limits of all pods together.
    pub limits_memory: Option<Quantity>,
    /// Services (the tenant apiserver's own `default/kubernetes` does not count).
    pub services: Option<u64>,
    /// PersistentVolumeClaims.
    pub persistent_volume_claims: Option<u64>,
    /// Storage all claims may request together (`200Gi`).
    pub requests_storage: Option<Quantity>,
    /// Namespaces the tenant creates (`default`, `kube-system`, `kube-public` and
    /// `kube-node-lease` always exist and do not count).
    pub namespaces: Option<u64>,
    /// Requests and limits of containers that set none (the host LimitRange's defaults).
    pub limits: Limits,
}

impl Quota {
    /// The quota of a plan that says nothing: finite, so no tenant can take a whole host by
    /// default, and roomy enough for a small team's services (a few dozen Deployments with
    /// replicas, their databases and volumes). With the container defaults (100m/128Mi
    /// requested, 1/512Mi limits), 100 pods request 10 CPU and 12.5Gi and are limited to 100
    /// CPU and 50Gi, inside every total, so pods that set no resources are limited by count,
    /// and pods that do by what they ask for. (Limits are a burst ceiling, so their CPU total
    /// may exceed the requests' fivefold; a lower one would cap pods without resources below
    /// the count: 40 CPU admits only 40 of them.)
    pub fn plan_default() -> Quota {
        Quota {
            pods: Some(100),
            requests_cpu: Some("20".into()),
            requests_memory: Some("64Gi".into()),
            limits_cpu: Some("100".into()),
            limits_memory: Some("128Gi".into()),
            services: Some(50),
            persistent_volume_claims: Some(20),
            requests_storage: Some("200Gi".into()),
            namespaces: Some(20),
            limits: Limits::default(),
        }
    }

    /// The limits as numbers (CPU in millicores, memory and storage in bytes).
    pub fn hard(&self) -> Hard {
        let m = |q: &Option<Quantity>| q.as_ref().map(Quantity::millis);
        let u = |q: &Option<Quantity>| q.as_ref().map(Quantity::units);
        Hard {
            pods: self.pods,
            requests_cpu: m(&self.requests_cpu),
            requests_memory: u(&self.requests_memory),
            limits_cpu: m(&self.limits_cpu),
            limits_memory: u(&self.limits_memory),
            services: self.services,
            persistent_volume_claims: self.persistent_volume_claims,
            requests_storage: u(&self.requests_storage),
            namespaces: self.namespaces,
        }
    }

    /// Checks every quantity parses and the container defaults make sense.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("requests_cpu", &self.requests_cpu),
            ("requests_memory", &self.requests_memory),
            ("limits_cpu", &self.limits_cpu),
            ("limits_memory", &self.limits_memory),
            ("requests_storage", &self.requests_storage),
        ];
        for (name, q) in fields {
            if let Some(q) = q {
                parse_quantity(&q.0).map_err(|e| format!("quota.{name}: {e}"))?;
            }
        }
        let l = &self.limits;
        let named = [
            ("default_request", l.default_request.as_ref()),
            ("default_limit", l.default_limit.as_ref()),
        ];
        for (name, r) in named {
            let Some(r) = r else { continue };
            parse_quantity(&r.cpu.0).map_err(|e| format!("quota.limits.{name}.cpu: {e}"))?;
            parse_quantity(&r.memory.0).map_err(|e| format!("quota.limits.{name}.memory: {e}"))?;
        }
        let Some(default_request) = &l.default_request else {
            // A container without requests would count as nothing: only a plan that totals
            // no requests (and sets no default limit, whose request it would be) can leave
            // them unset.
            if self.requests_cpu.is_some()
                || self.requests_memory.is_some()
                || l.default_limit.is_some()
            {
                return Err("quota.limits.default_request: may be null only when requests_cpu and requests_memory are unset and default_limit is null (a container without requests could not be counted)".into());
            }
            return Ok(());
        };
        let Some(default_limit) = &l.default_limit else {
            // A container without limits would count as unbounded: only a plan that totals
            // no limits can leave them unset.
            if self.limits_cpu.is_some() || self.limits_memory.is_some() {
                return Err("quota.limits.default_limit: may be null only when limits_cpu and limits_memory are unset (a container without limits could not be counted)".into());
            }
            return Ok(());
        };
        if default_request.cpu.millis() > default_limit.cpu.millis() {
            return Err("quota.limits.default_request.cpu: cannot exceed default_limit.cpu".into());
        }
        if default_request.memory.units() > default_limit.memory.units() {
            return Err(
                "quota.limits.default_request.memory: cannot exceed default_limit.memory".into(),
            );
        }
        Ok(())
    }
}

/// Container defaults, as a LimitRange's `defaultRequest` and `default`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Requests of a container that sets none (default 100m CPU, 128Mi memory). `null`: none,
    /// so such a container runs as BestEffort, as in a cluster without a LimitRange; allowed
    /// only in a quota without `requests_cpu` and `requests_memory` and with `default_limit:
    /// null`.
    pub default_request: Option<Resources>,
    /// Limits of a container that sets none (default 1 CPU, 512Mi memory). `null`: none, so
    /// such a container runs unlimited, as in a cluster without a LimitRange; allowed only in a
    /// quota without `limits_cpu` and `limits_memory`, which could not count it.
    pub default_limit: Option<Resources>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_request: Some(Resources {
                cpu: "100m".into(),
                memory: "128Mi".into(),
            }),
            default_limit: Some(Resources {
                cpu: "1".into(),
                memory: "512Mi".into(),
            }),
        }
    }
}

/// A CPU and a memory quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU (`100m`, `1`).
    pub cpu: Quantity,
    /// Memory (`128Mi`).
    pub memory: Quantity,
}

/// Quota limits as numbers: counts, CPU in millicores, memory and storage in bytes; null
/// (`None`) is unlimited. In the platform API, the `limits` a tenant's usage is measured
/// against: its plan's quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = QuotaLimits)]
pub struct Hard {
    /// Pods at once; null: unlimited.
    pub pods: Option<u64>,
    /// CPU requests of all pods, in millicores (1000 = 1 CPU); null: unlimited.
    pub requests_cpu: Option<u64>,
    /// Memory requests of all pods, in bytes; null: unlimited.
    pub requests_memory: Option<u64>,
    /// CPU limits of all pods, in millicores; null: unlimited.
    pub limits_cpu: Option<u64>,
    /// Memory limits of all pods, in bytes; null: unlimited.
    pub limits_memory: Option<u64>,
    /// Services; null: unlimited.
    pub services: Option<u64>,
    /// PersistentVolumeClaims; null: unlimited.
    pub persistent_volume_claims: Option<u64>,
    /// Storage requests of all claims, in bytes; null: unlimited.
    pub requests_storage: Option<u64>,
    /// Namespaces the tenant created (the four built-in ones do not count); null: unlimited.
    pub namespaces: Option<u64>,
}

/// What a tenant's objects hold together: counts, CPU in millicores, memory and storage in
/// bytes, as its quota counts them. The syncer counts the objects it admits (its `/metrics`);
/// vcp counts the tenant's objects on the host into its inventory, for the platform API and
/// billing. (In code: `admitted` and `host_usage`, by the same rules.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Pods that take quota: not finished (`Succeeded`, `Failed`), not terminating.
    pub pods: u64,
    /// CPU requests of those pods, in millicores (1000 = 1 CPU), with the plan's container
    /// defaults for containers that set none, init containers and overhead as Kubernetes
    /// counts them.
    pub requests_cpu: u64,
    /// Memory requests of those pods, in bytes.
    pub requests_memory: u64,
    /// CPU limits of those pods, in millicores.
    pub limits_cpu: u64,
    /// Memory limits of those pods, in bytes.
    pub limits_memory: u64,
    /// Services, except the tenant apiserver's own `default/kubernetes`.
    pub services: u64,
    /// PersistentVolumeClaims (not terminating).
    pub persistent_volume_claims: u64,
    /// Storage requests of those claims, in bytes.
    pub requests_storage: u64,
    /// Namespaces, except `default`, `kube-system`, `kube-public` and `kube-node-lease`.
    pub namespaces: u64,
}

pub use vcp_core::quota::RESOURCES;

impl Usage {
    /// One resource by field name (see [`RESOURCES`]).
    pub fn get(&self, resource: &str) -> Option<u64> {
        Some(match resource {
            "pods" => self.pods,
            "requests_cpu" => self.requests_cpu,
            "requests_memory" => self.requests_memory,
            "limits_cpu" => self.limits_cpu,
            "limits_memory" => self.limits_memory,
            "services" => self.services,
            "persistent_volume_claims" => self.persistent_volume_claims,
            "requests_storage" => self.requests_storage,
            "namespaces" => self.namespaces,
            _ => return None,
        })
    }
}

impl Usage {
    fn values(&self) -> [u64; 9] {
        [
            self.pods,
            self.requests_cpu,
            self.requests_memory,
            self.limits_cpu,
            self.limits_memory,
            self.services,
            self.persistent_volume_claims,
            self.requests_storage,
            self.namespaces,
        ]
    }

    fn from_values(v: [u64; 9]) -> Usage {
        let [
            pods,
            requests_cpu,
            requests_memory,
            limits_cpu,
            limits_memory,
            services,
            persistent_volume_claims,
            requests_storage,
            namespaces,
        ] = v;
        Usage {
            pods,
            requests_cpu,
            requests_memory,
            limits_cpu,
            limits_memory,
            services,
            persistent_volume_claims,
            requests_storage,
            namespaces,
        }
    }

    fn zip(&self, o: &Usage, f: impl Fn(u64, u64) -> u64) -> Usage {
        let (a, b) = (self.values(), o.values());
        Usage::from_values(std::array::from_fn(|i| f(a[i], b[i])))
    }

    /// Both together (saturating).
    pub fn plus(&self, o: &Usage) -> Usage {
        self.zip(o, u64::saturating_add)
    }

    /// This without `o` (saturating at zero).
    pub fn minus(&self, o: &Usage) -> Usage {
        self.zip(o, u64::saturating_sub)
    }

    /// Whether every resource is within its limit.
    pub fn within(&self, hard: &Hard) -> bool {
        self.values()
            .iter()
            .zip(hard.values())
            .all(|(used, hard)| hard.is_none_or(|h| *used <= h))
    }
}

impl Hard {
    /// What `used` holds beyond these limits: `(resource, used, limit)` in [`RESOURCES`]
    /// order; empty when it fits (what a plan change to these limits checks first).
    pub fn exceeded_by(&self, used: &Usage) -> Vec<(&'static str, u64, u64)> {
        RESOURCES
            .iter()
            .zip(self.values().into_iter().zip(used.values()))
            .filter_map(|(r, (limit, used))| {
                limit.filter(|l| used > *l).map(|limit| (*r, used, limit))
            })
            .collect()
    }

    /// The limits in [`RESOURCES`] order.
    fn values(&self) -> [Option<u64>; 9] {
        [
            self.pods,
            self.requests_cpu,
            self.requests_memory,
            self.limits_cpu,
            self.limits_memory,
            self.services,
            self.persistent_volume_claims,
            self.requests_storage,
            self.namespaces,
        ]
    }

    /// One limit by field name (see [`RESOURCES`]); `None` if unlimited.
    pub fn get(&self, resource: &str) -> Option<u64> {
        match resource {
            "pods" => self.pods,
            "requests_cpu" => self.requests_cpu,
            "requests_memory" => self.requests_memory,
            "limits_cpu" => self.limits_cpu,
            "limits_memory" => self.limits_memory,
            "services" => self.services,
            "persistent_volume_claims" => self.persistent_volume_claims,
            "requests_storage" => self.requests_storage,
            "namespaces" => self.namespaces,
            _ => None,
        }
    }
}

const NANO: i128 = 1_000_000_000;

/// A quantity in billionths of its unit (exact for every quantity the apiserver accepts down
/// to `1n`; finer fractions round up, as the apiserver rounds them).
pub fn parse_quantity(s: &str) -> Result<i128, Error> {
    let bad = || Error::InvalidQuantity(s.to_owned());
    let body = s.strip_prefix('+').unwrap_or(s);
    let end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') || frac.len() > 30 {
        return Err(bad());
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(bad());
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    // value = mantissa * num / den / 10^frac
    let (num, den): (i128, i128) = match suffix {
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "n" => (1, NANO),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "" => (1, 1),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (NANO, 1),
        "T" => (1_000 * NANO, 1),
        "P" => (1_000_000 * NANO, 1),
        "E" => (NANO * NANO, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad())?;
            if !(-18..=18).contains(&exp) || e[1..].starts_with('+') {
                return Err(bad());
            }
            if exp >= 0 {
                (10_i128.pow(exp.unsigned_abs()), 1)
            } else {
                (1, 10_i128.pow(exp.unsigned_abs()))
            }
        }
        _ => return Err(bad()),
    };
    let den = den
        .checked_mul(10_i128.pow(u32::try_from(frac.len()).map_err(|_| bad())?))
        .ok_or_else(bad)?;
    let scaled = mantissa
        .checked_mul(num)
        .and_then(|v| v.checked_mul(NANO))
        .ok_or_else(bad)?;
    // Round up: a quantity finer than a nano-unit still takes the nano-unit.
    Ok((scaled + den - 1) / den)
}

fn scaled(s: &str, per: i128) -> Result<u64, Error> {
    let n = parse_quantity(s)?;
    u64::try_from((n + per - 1) / per).map_err(|_| Error::InvalidQuantity(s.to_owned()))
}

/// A quantity in thousandths (millicores), rounded up.
pub fn millis(s: &str) -> Result<u64, Error> {
    scaled(s, 1_000_000)
}

/// A quantity in whole units (bytes), rounded up.
pub fn units(s: &str) -> Result<u64, Error> {
    scaled(s, NANO)
}

/// CPU (millicores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    pub cpu: u64,
    pub memory: u64,
}

impl Amount {
    fn plus(self, o: Amount) -> Amount {
        Amount {
            cpu: self.cpu.saturating_add(o.cpu),
            memory: self.memory.saturating_add(o.memory),
        }
    }

    fn max(self, o: Amount) -> Amount {
        Amount {
            cpu: self.cpu.max(o.cpu),
            memory: self.memory.max(o.memory),
        }
    }
}

/// One resource of one container as the host will see it: its value and how to write it.
struct Effective {
    request: (u64, K8sQuantity),
    limit: (u64, K8sQuantity),
}

/// A container's `resource` ("cpu" or "memory") after the plan's defaults, as Kubernetes
/// would default it: a request unset takes the limit if one is set (the apiserver's own
/// defaulting), else the plan's default request; a limit unset takes the plan's default limit,
/// or the request if that is higher (a LimitRange would make such a pod invalid; the syncer
/// writes the limit itself, so the host's LimitRange never fills it in).
fn effective(
    r: Option<&ResourceRequirements>,
    resource: &str,
    limits: &Limits,
) -> Result<Effective, Error> {
    let value = |q: &K8sQuantity| {
        if resource == "cpu" {
            millis(&q.0)
        } else {
            units(&q.0)
        }
    };
    let pick = |rs: &Resources| {
        let q = if resource == "cpu" {
            &rs.cpu
        } else {
            &rs.memory
        };
        K8sQuantity(q.0.clone())
    };
    let set = |m: Option<&BTreeMap<String, K8sQuantity>>| m.and_then(|m| m.get(resource)).cloned();
    let req_set = set(r.and_then(|r| r.requests.as_ref()));
    let lim_set = set(r.and_then(|r| r.limits.as_ref()));
    let request = match (&req_set, &lim_set) {
        (Some(q), _) | (None, Some(q)) => q.clone(),
        (None, None) => match &limits.default_request {
            Some(d) => pick(d),
            // Counted as nothing, which no total of requests ever sees (`Quota::validate`).
            None => K8sQuantity("0".into()),
        },
    };
    let request = (value(&request)?, request);
    let limit = match (lim_set, &limits.default_limit) {
        (Some(q), _) => (value(&q)?, q),
        // No limit at all: counted as its request, which no total of limits ever sees (a plan
        // without default limits has none, see `Quota::validate`).
        (None, None) => request.clone(),
        (None, Some(default_limit)) => {
            let d = pick(default_limit);
            let dv = value(&d)?;
            if request.0 > dv {
                request.clone()
            } else {
                (dv, d)
            }
        }
    };
    Ok(Effective { request, limit })
}

fn container_amounts(c: &Container, limits: &Limits) -> Result<(Amount, Amount), Error> {
    let cpu = effective(c.resources.as_ref(), "cpu", limits)?;
    let mem = effective(c.resources.as_ref(), "memory", limits)?;
    Ok((
        Amount {
            cpu: cpu.request.0,
            memory: mem.request.0,
        },
        Amount {
            cpu: cpu.limit.0,
            memory: mem.limit.0,
        },
    ))
}

/// A pod's effective `(requests, limits)` as the host schedules and counts them: the sum over
/// its containers, with the plan's defaults for containers that set none; init containers by
/// Kubernetes' rule, the larger of that sum and each init container in turn (plus the sidecars,
/// `restartPolicy: Always`, started before it, which also run beside the containers); plus the
/// pod's overhead, if any.
pub fn effective_resources(spec: &PodSpec, limits: &Limits) -> Result<(Amount, Amount), Error> {
    let mut req = Amount::default();
    let mut lim = Amount::default();
    for c in &spec.containers {
        let (r, l) = container_amounts(c, limits)?;
        req = req.plus(r);
        lim = lim.plus(l);
    }
    let (mut side_req, mut side_lim) = (Amount::default(), Amount::default());
    let (mut init_req, mut init_lim) = (Amount::default(), Amount::default());
    for c in spec.init_containers.iter().flatten() {
        let (r, l) = container_amounts(c, limits)?;
        if c.restart_policy.as_deref() == Some("Always") {
            req = req.plus(r);
            lim = lim.plus(l);
            side_req = side_req.plus(r);
            side_lim = side_lim.plus(l);
            init_req = init_req.max(side_req);
            init_lim = init_lim.max(side_lim);
        } else {
            init_req = init_req.max(r.plus(side_req));
            init_lim = init_lim.max(l.plus(side_lim));
        }
    }
    req = req.max(init_req);
    lim = lim.max(init_lim);
    if let Some(o) = &spec.overhead {
        let get = |k: &str, f: fn(&str) -> Result<u64, Error>| o.get(k).map_or(Ok(0), |q| f(&q.0));
        let over = Amount {
            cpu: get("cpu", millis)?,
            memory: get("memory", units)?,
        };
        req = req.plus(over);
        lim = lim.plus(over);
    }
    Ok((req, lim))
}

/// Writes the plan's defaults into every container (and init container) that lacks a CPU or
/// memory request or limit, exactly as [`effective_resources`] counted them: the host pod then
/// carries what the quota counted, and the host's LimitRange has nothing left to fill in.
/// Containers whose quantities do not parse are left as they are (the apiserver rejected them).
pub fn fill_defaults(spec: &mut PodSpec, limits: &Limits) {
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        for resource in ["cpu", "memory"] {
            let Ok(e) = effective(c.resources.as_ref(), resource, limits) else {
                continue;
            };
            let requested = c.resources.as_ref().is_some_and(|r| {
                let has = |m: &Option<BTreeMap<String, K8sQuantity>>| {
                    m.as_ref().is_some_and(|m| m.contains_key(resource))
                };
                has(&r.requests) || has(&r.limits)
            });
            if requested || limits.default_request.is_some() {
                let r = c.resources.get_or_insert_with(Default::default);
                r.requests
                    .get_or_insert_with(Default::default)
                    .entry(resource.to_owned())
                    .or_insert(e.request.1);
            }
            let limited = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some_and(|l| l.contains_key(resource));
            if limited || limits.default_limit.is_none() {
                continue;
            }
            let r = c.resources.get_or_insert_with(Default::default);
            r.limits
                .get_or_insert_with(Default::default)
                .entry(resource.to_owned())
                .or_insert(e.limit.1);
        }
    }
}

/// A tenant object that has its host object already: `(kind, namespace, name)` (namespace
/// empty for namespaces), e.g. `("Pod", "apps", "web-0")`.
pub type Placed = (String, String, String);

/// The tenant's objects, as the syncer's caches hold them.
#[derive(Debug, Clone, Default)]
pub struct Objects<'a> {
    pub namespaces: Vec<&'a Namespace>,
    pub pods: Vec<&'a Pod>,
    pub services: Vec<&'a Service>,
    pub claims: Vec<&'a PersistentVolumeClaim>,
    /// Those of them on the host already. They hold their share whatever their place in
    /// line: what an object took it holds until it goes. Without this, an object created in
    /// the same second as others (timestamps have seconds only) but listed later could sort
    /// before one already running and claim its place; the host's own quota would then refuse
    /// it.
    pub placed: BTreeSet<Placed>,
}

/// `(namespace, name)` of a namespaced object.
pub type Key = (String, String);

/// Every judged object's refusals (empty: admitted). Objects not judged (terminating, finished
/// pods, the tenant apiserver's own Service) are absent: they take nothing and need nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdicts {
    pub namespaces: BTreeMap<String, Vec<Refusal>>,
    pub pods: BTreeMap<Key, Vec<Refusal>>,
    pub services: BTreeMap<Key, Vec<Refusal>>,
    pub claims: BTreeMap<Key, Vec<Refusal>>,
}

/// Namespaces every cluster has from the start; the tenant cannot delete them, so they are
/// always admitted and never counted.
pub const BUILT_IN_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The rule every quota refusal names.
pub const RULE: &str = "plan: quota";

/// The key of an object in [`Verdicts`]: its namespace and name.
pub fn key<K: kube_core::Resource>(o: &K) -> Key {
    (
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

fn count_refusal(what: &str, field: &str, hard: Option<u64>) -> Refusal {
    Refusal::new(
        format!("quota.{field}"),
        RULE,
        format!(
            "the tenant holds {} {what} already, the plan's limit; this one waits until one goes",
            hard.unwrap_or_default()
        ),
    )
}

/// Whether a pod takes quota: every pod but finished ones (`Succeeded`, `Failed`), which the
/// syncer never puts on the host again. A pod kept off the host for another reason
/// (`PolicyRefused`) still holds its place: the tenant writes pod status too, so no status
/// can be trusted to say a pod will never run.
fn pod_counts(p: &Pod) -> bool {
    !p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
}

fn terminating<K: kube_core::Resource>(o: &K) -> bool {
    o.meta().deletion_timestamp.is_some()
}

impl Counted for Namespace {
    const KIND: Kind = Kind::Namespace;

    fn counts(&self) -> bool {
        !terminating(self)
    }

    fn takes(&self, _: &Quota) -> Result<Usage, Refusal> {
        let built_in = BUILT_IN_NAMESPACES.contains(&self.name_any().as_str());
        Ok(Usage {
            namespaces: u64::from(!built_in),
            ..Usage::default()
        })
    }
}

impl Counted for Pod {
    const KIND: Kind = Kind::Pod;

    fn counts(&self) -> bool {
        !terminating(self) && pod_counts(self)
    }

    fn takes(&self, quota: &Quota) -> Result<Usage, Refusal> {
        let (req, lim) = match &self.spec {
            Some(spec) => effective_resources(spec, &quota.limits),
            None => effective_resources(&PodSpec::default(), &quota.limits),
        }
        .map_err(|e| Refusal::new("spec.containers[*].resources", RULE, e.to_string()))?;
        Ok(Usage {
            pods: 1,
            requests_cpu: req.cpu,
            requests_memory: req.memory,
            limits_cpu: lim.cpu,
            limits_memory: lim.memory,
            ..Usage::default()
        })
    }
}

impl Counted for Service {
    const KIND: Kind = Kind::Service;

    fn counts(&self) -> bool {
        !terminating(self) && !crate::services::is_local_service(self)
    }

    fn takes(&self, _: &Quota) -> Result<Usage, Refusal> {
        Ok(Usage {
            services: 1,
            ..Usage::default()
        })
    }
}

impl Counted for PersistentVolumeClaim {
    const KIND: Kind = Kind::Claim;

    fn counts(&self) -> bool {
        !terminating(self)
    }

    fn takes(&self, _: &Quota) -> Result<Usage, Refusal> {
        let storage = self
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map_or(Ok(0), |q| units(&q.0))
            .map_err(|e| Refusal::new("spec.resources.requests.storage", RULE, e.to_string()))?;
        Ok(Usage {
            persistent_volume_claims: 1,
            requests_storage: storage,
            ..Usage::default()
        })
    }
}

fn show_cpu(m: u64) -> String {
    if m.is_multiple_of(1000) {
        format!("{}", m / 1000)
    } else {
        format!("{m}m")
    }
}

fn show_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (u, n) in UNITS {
        if b >= n && b.is_multiple_of(n) {
            return format!("{}{u}", b / n);
        }
    }
    b.to_string()
}

/// Every tenant object's verdict, and what the admitted ones hold: the [`Ledger`] fed all of
/// `objects` at once. Objects on the host (`placed`) hold their share; every other object
/// waits in line, in creation order (then namespace, name), and is admitted iff it fits what
/// the holders and the objects admitted before it left. Refused objects take nothing.
/// Terminating objects and finished pods take nothing and get no verdict. Namespaces are
/// judged first: an object in a refused namespace is refused too (it has nowhere to go on the
/// host) and takes nothing. Refusals name `quota.<resource>` and say what the plan allows,
/// never what is left (so the message, and the pod condition carrying it, stays the same while
/// the object waits).
pub fn admitted(objects: &Objects<'_>, quota: &Quota) -> (Verdicts, Usage) {
    let mut l = Ledger::new(quota);
    for (kind, ns, name) in &objects.placed {
        if let Some(kind) = Kind::of(kind) {
            l.place(kind, (ns.clone(), name.clone()), true);
        }
    }
    for n in &objects.namespaces {
        l.tenant(*n, true);
    }
    for p in &objects.pods {
        l.tenant(*p, true);
    }
    for s in &objects.services {
        l.tenant(*s, true);
    }
    for c in &objects.claims {
        l.tenant(*c, true);
    }
    (l.verdicts(), l.used())
}

/// A tenant's objects on the host, as listed by its label `vcp.dev/tenant=<key>` (from any
/// namespace: [`host_usage`] sorts out what is not the syncer's).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostObjects<'a> {
    pub namespaces: &'a [Namespace],
    pub pods: &'a [Pod],
    pub services: &'a [Service],
    pub claims: &'a [PersistentVolumeClaim],
}

/// What tenant `key` holds on the host, counted exactly as [`admitted`] counts what it admits:
/// pods that finished or are terminating, the tenant apiserver's own `default/kubernetes`
/// Service, terminating claims and the four built-in namespaces take nothing; CPU and memory
/// by [`effective_resources`] with the plan's container defaults (`limits`; host pods carry
/// them already, the syncer writes them in). Only objects the syncer made for the tenant
/// count: they carry its markers ([`naming::tenant_ref`]) and sit where the syncer puts them
/// (a namespace at the host name of its tenant name, an object in the host namespace of its
/// tenant namespace, under its own name); control-plane objects (no markers), another
/// tenant's, and anything placed by hand elsewhere do not.
///
/// The host is the truth for billing: an object counts from the moment its host copy exists
/// until that copy is gone, and a pod's overhead is what the host's RuntimeClass set.
pub fn host_usage(key: &naming::TenantKey, host: &HostObjects<'_>, limits: &Limits) -> Usage {
    fn views<K: kube_core::Resource + Clone>(key: &naming::TenantKey, objects: &[K]) -> Vec<K> {
        objects.iter().filter_map(|h| tenant_view(key, h)).collect()
    }
    let namespaces = views(key, host.namespaces);
    let pods = views(key, host.pods);
    let services = views(key, host.services);
    let claims = views(key, host.claims);
    let objects = Objects {
        namespaces: namespaces.iter().collect(),
        pods: pods.iter().collect(),
        services: services.iter().collect(),
        claims: claims.iter().collect(),
        placed: BTreeSet::new(),
    };
    // Without limits every object is admitted, so the usage is the sum of what each takes.
    let unlimited = Quota {
        limits: limits.clone(),
        ..Quota::default()
    };
    admitted(&objects, &unlimited).1
}

/// Host object `h` under its tenant name and namespace, if it is tenant `key`'s and sits
/// where the syncer would have put its tenant object.
fn tenant_view<K: kube_core::Resource + Clone>(key: &naming::TenantKey, h: &K) -> Option<K> {
    let m = h.meta();
    let none = BTreeMap::new();
    let r = naming::tenant_ref(
        key,
        m.labels.as_ref().unwrap_or(&none),
        m.annotations.as_ref().unwrap_or(&none),
    )?;
    let in_place = match (&m.namespace, &r.namespace) {
        // A namespace: named for its tenant name.
        (None, None) => m.name.as_deref() == Some(&naming::host_namespace(key, &r.name)),
        // A namespaced object: same name, in the host namespace of its tenant namespace.
        (Some(host_ns), Some(ns)) => {
            *host_ns == naming::host_namespace(key, ns) && m.name.as_deref() == Some(&r.name)
        }
        _ => false,
    };
    if !in_place {
        return None;
    }
    let mut t = h.clone();
    let tm = t.meta_mut();
    tm.name = Some(r.name);
    tm.namespace = r.namespace;
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vcp_fixtures::{
        arb_claim, arb_namespaces, arb_pod, arb_services, at, dedup, obj, plain, pod,
    };

    #[test]
    fn usage_beyond_a_smaller_quota_is_named_and_unlimited_resources_never_are() {
        let hard = Hard {
            pods: Some(10),
            services: Some(2),
            ..Hard::default()
        };
        let used = Usage {
            pods: 10,
            services: 3,
            namespaces: 500,
            ..Usage::default()
        };
        assert_eq!(hard.exceeded_by(&used), vec![("services", 3, 2)]);
        assert!(Hard::default().exceeded_by(&used).is_empty());
    }

    #[test]
    fn quantities_parse_exactly_for_every_suffix() {
        let cases: [(&str, u64, u64); 22] = [
            // (text, millis, units)
            ("0", 0, 0),
            ("1", 1_000, 1),
            ("500m", 500, 1),
            ("0.5", 500, 1),
            ("1.5", 1_500, 2),
            (".25", 250, 1),
            ("2k", 2_000_000, 2_000),
            ("1M", 1_000_000_000, 1_000_000),
            ("1G", 1_000_000_000_000, 1_000_000_000),
            ("1T", 1_000_000_000_000_000, 1_000_000_000_000),
            ("1Ki", 1_024_000, 1_024),
            ("128Mi", 134_217_728_000, 134_217_728),
            ("1Gi", 1_073_741_824_000, 1_073_741_824),
            ("1Ti", 1_099_511_627_776_000, 1_099_511_627_776),
            ("1.5Gi", 1_610_612_736_000, 1_610_612_736),
            ("0.5Ki", 512_000, 512),
            ("100u", 1, 1),
            ("1n", 1, 1),
            ("1e3", 1_000_000, 1_000),
            ("1E-3", 1, 1),
            ("+2", 2_000, 2),
            ("1.0001m", 2, 1),
        ];
        for (s, m, u) in cases {
            assert_eq!(millis(s), Ok(m), "{s} in millis");
            assert_eq!(units(s), Ok(u), "{s} in units");
        }
        assert_eq!(units("1P"), Ok(1_000_000_000_000_000));
        assert_eq!(units("1Pi"), Ok(1 << 50));
        assert_eq!(units("1Ei"), Ok(1 << 60));
    }

    #[test]
    fn garbage_is_not_a_quantity() {
        for s in [
            "",
            "m",
            "-1",
            "1.2.3",
            "1 Gi",
            "1gi",
            "1Gb",
            "abc",
            "1e",
            "1e+3",
            "1e99",
            "0x10",
            "1.5.Gi",
            ".",
            "99999999999999999999999999999999999Ei",
        ] {
            let err = parse_quantity(s).unwrap_err();
            assert!(
                err.to_string().contains("is not a Kubernetes quantity"),
                "{s}: {err}"
            );
        }
    }

    fn ok(m: &BTreeMap<Key, Vec<Refusal>>, ns: &str, n: &str) -> bool {
        m[&(ns.to_owned(), n.to_owned())].is_empty()
    }

    fn quota(y: &str) -> Quota {
        super::super::TenantPolicy::from_yaml(y).unwrap().quota
    }

    #[test]
    fn the_default_quota_is_finite_and_a_quota_section_replaces_it() {
        let d = super::super::TenantPolicy::default().quota;
        assert_eq!(d, Quota::plan_default());
        let h = d.hard();
        for r in RESOURCES {
            assert!(h.get(r).is_some(), "{r} is unlimited by default");
        }
        assert_eq!(h.requests_cpu, Some(20_000));
        assert_eq!(h.requests_memory, Some(64 << 30));
        // A hundred pods that set no resources fit it: the count binds first.
        let pods: Vec<Pod> = (0..101)
            .map(|i| plain("a", &format!("p{i:03}"), &at(i)))
            .collect();
        let (v, used) = admitted(
            &Objects {
                pods: pods.iter().collect(),
                ..Default::default()
            },
            &d,
        );
        assert_eq!(used.pods, 100);
        assert_eq!(v.pods[&("a".into(), "p100".into())][0].field, "quota.pods");
        let q = quota("quota: {pods: 3}");
        assert_eq!(q.hard().pods, Some(3));
        assert_eq!(q.hard().requests_cpu, None, "not listed: unlimited");
        assert_eq!(q.limits, Limits::default());
    }

    #[test]
    fn containers_without_resources_get_the_plan_defaults() {
        let l = Limits::default();
        let spec = plain("a", "p", &at(0)).spec.unwrap();
        let (req, lim) = effective_resources(&spec, &l).unwrap();
        assert_eq!(
            req,
            Amount {
                cpu: 100,
                memory: 128 << 20
            }
        );
        assert_eq!(
            lim,
            Amount {
                cpu: 1000,
                memory: 512 << 20
            }
        );
        // A limit alone is the request too (the apiserver's defaulting); a request above the
        // default limit raises the limit with it.
        let p = pod(
            "a",
            "p",
            &at(0),
            serde_json::json!([
                {"name": "a", "resources": {"limits": {"cpu": "2"}}},
                {"name": "b", "resources": {"requests": {"memory": "1Gi"}}},
            ]),
        );
        let mut spec = p.spec.unwrap();
        let (req, lim) = effective_resources(&spec, &l).unwrap();
        assert_eq!(
            req,
            Amount {
                cpu: 2100,
                memory: (128 << 20) + (1 << 30)
            }
        );
        assert_eq!(
            lim,
            Amount {
                cpu: 3000,
                memory: (512 << 20) + (1 << 30)
            }
        );
        fill_defaults(&mut spec, &l);
        let r = |i: usize| spec.containers[i].resources.clone().unwrap();
        assert_eq!(r(0).requests.unwrap()["cpu"].0, "2");
        assert_eq!(r(0).requests.unwrap()["memory"].0, "128Mi");
        assert_eq!(r(1).limits.unwrap()["memory"].0, "1Gi");
        assert_eq!(r(1).limits.unwrap()["cpu"].0, "1");
        assert_eq!(
            effective_resources(&spec, &l).unwrap(),
            (req, lim),
            "the host pod counts what the tenant pod counted"
        );
    }

    #[test]
    fn init_containers_count_by_the_kubernetes_max_rule_and_overhead_is_added() {
        let l = Limits::default();
        let mut p = pod(
            "a",
            "p",
            &at(0),
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
            ]),
        );
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(serde_json::from_value(serde_json::json!([
            {"name": "big", "resources": {"requests": {"cpu": "3", "memory": "100Mi"}, "limits": {"cpu": "3", "memory": "100Mi"}}},
            {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}}},
        ])).unwrap());
        let (req, _) = effective_resources(spec, &l).unwrap();
        assert_eq!(req.cpu, 3000, "the big init container alone");
        assert_eq!(
            req.memory,
            (1 << 30) + (64 << 20),
            "containers plus the sidecar"
        );
        spec.overhead = Some(BTreeMap::from([(
            "cpu".to_owned(),
            K8sQuantity("250m".into()),
        )]));
        assert_eq!(effective_resources(spec, &l).unwrap().0.cpu, 3250);
    }

    #[test]
    fn pods_are_admitted_in_creation_order_while_the_quota_lasts() {
        let q = quota("quota: {pods: 3, requests_cpu: '1'}");
        let big = pod(
            "b",
            "big",
            &at(1),
            serde_json::json!([{"name": "c", "resources": {"requests": {"cpu": "900m"}}}]),
        );
        let mut done = plain("a", "done", &at(0));
        done.status =
            Some(serde_json::from_value(serde_json::json!({"phase": "Succeeded"})).unwrap());
        let pods = [
            plain("a", "p3", &at(4)),
            plain("a", "p1", &at(2)),
            big,
            plain("a", "p2", &at(3)),
            done,
        ];
        let objects = Objects {
            pods: pods.iter().collect(),
            ..Default::default()
        };
        let (v, used) = admitted(&objects, &q);
        assert!(ok(&v.pods, "b", "big") && ok(&v.pods, "a", "p1"));
        assert!(!ok(&v.pods, "a", "p2"), "900m + 100m taken");
        assert_eq!(
            v.pods[&("a".into(), "p2".into())][0].field,
            "quota.requests_cpu"
        );
        assert!(!ok(&v.pods, "a", "p3"));
        assert!(!v.pods.contains_key(&("a".into(), "done".into())));
        assert_eq!((used.pods, used.requests_cpu), (2, 1000));
        // The big one goes: the next two in line fit.
        let rest: Vec<&Pod> = pods.iter().filter(|p| p.name_any() != "big").collect();
        let (v, used) = admitted(
            &Objects {
                pods: rest,
                ..Default::default()
            },
            &q,
        );
        assert!(ok(&v.pods, "a", "p2") && ok(&v.pods, "a", "p3"));
        assert_eq!(used.pods, 3);
        // A fourth is over the count.
        let mut more: Vec<Pod> = pods.to_vec();
        more.retain(|p| p.name_any() != "big");
        more.push(plain("a", "p4", &at(5)));
        let (v, _) = admitted(
            &Objects {
                pods: more.iter().collect(),
                ..Default::default()
            },
            &q,
        );
        let r = &v.pods[&("a".into(), "p4".into())][0];
        assert_eq!(r.field, "quota.pods");
        assert!(r.message.contains("3 pods"), "{}", r.message);
    }

    #[test]
    fn pods_on_the_host_keep_their_place() {
        let q = quota("quota: {pods: 1}");
        let (a, b) = (plain("a", "a", &at(0)), plain("a", "b", &at(0)));
        let mut objects = Objects {
            pods: vec![&a, &b],
            ..Default::default()
        };
        let (v, _) = admitted(&objects, &q);
        assert!(ok(&v.pods, "a", "a") && !ok(&v.pods, "a", "b"));
        // b was seen first (a arrived in the cache later, in the same second) and runs.
        objects
            .placed
            .insert(("Pod".into(), "a".into(), "b".into()));
        let (v, _) = admitted(&objects, &q);
        assert!(!ok(&v.pods, "a", "a") && ok(&v.pods, "a", "b"));
    }

    #[test]
    fn terminating_pods_take_nothing() {
        let q = quota("quota: {pods: 1}");
        let mut old = plain("a", "old", &at(0));
        old.metadata.deletion_timestamp = old.metadata.creation_timestamp.clone();
        let new = plain("a", "new", &at(1));
        let (v, used) = admitted(
            &Objects {
                pods: vec![&old, &new],
                ..Default::default()
            },
            &q,
        );
        assert!(ok(&v.pods, "a", "new"));
        assert_eq!(used.pods, 1);
    }

    #[test]
    fn services_claims_and_namespaces_are_counted_and_objects_in_refused_namespaces_wait() {
        let q = quota(
            "quota: {services: 1, persistent_volume_claims: 2, requests_storage: 3Gi, namespaces: 1}",
        );
        let ns: Vec<Namespace> = vec![
            obj(None, "default", &at(0), serde_json::json!({})),
            obj(None, "kube-system", &at(0), serde_json::json!({})),
            obj(None, "apps", &at(1), serde_json::json!({})),
            obj(None, "more", &at(2), serde_json::json!({})),
        ];
        let svc: Vec<Service> = vec![
            obj(Some("default"), "kubernetes", &at(0), serde_json::json!({})),
            obj(Some("apps"), "web", &at(3), serde_json::json!({})),
            obj(Some("apps"), "db", &at(4), serde_json::json!({})),
            obj(Some("more"), "x", &at(2), serde_json::json!({})),
        ];
        let claim = |ns: &str, n: &str, i: u32, size: &str| -> PersistentVolumeClaim {
            obj(
                Some(ns),
                n,
                &at(i),
                serde_json::json!({"resources": {"requests": {"storage": size}}}),
            )
        };
        let claims = [
            claim("apps", "a", 3, "2Gi"),
            claim("apps", "b", 4, "2Gi"),
            claim("apps", "c", 5, "1Gi"),
            claim("apps", "d", 6, "1Gi"),
        ];
        let objects = Objects {
            namespaces: ns.iter().collect(),
            services: svc.iter().collect(),
            claims: claims.iter().collect(),
            ..Default::default()
        };
        let (v, used) = admitted(&objects, &q);
        assert!(v.namespaces["default"].is_empty() && v.namespaces["kube-system"].is_empty());
        assert!(v.namespaces["apps"].is_empty());
        assert_eq!(v.namespaces["more"][0].field, "quota.namespaces");
        assert!(
            !v.services
                .contains_key(&("default".into(), "kubernetes".into()))
        );
        assert_eq!(
            v.services[&("more".into(), "x".into())][0].field,
            "metadata.namespace",
            "waits for its namespace, takes nothing"
        );
        assert!(ok(&v.services, "apps", "web"));
        assert_eq!(
            v.services[&("apps".into(), "db".into())][0].field,
            "quota.services"
        );
        assert!(ok(&v.claims, "apps", "a"));
        assert_eq!(
            v.claims[&("apps".into(), "b".into())][0].field,
            "quota.requests_storage"
        );
        assert!(ok(&v.claims, "apps", "c"));
        assert_eq!(
            v.claims[&("apps".into(), "d".into())][0].field,
            "quota.persistent_volume_claims"
        );
        assert_eq!(
            used,
            Usage {
                services: 1,
                persistent_volume_claims: 2,
                requests_storage: 3 << 30,
                namespaces: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn limit_defaults_and_quantities_are_validated() {
        let err = |y: &str| {
            super::super::TenantPolicy::from_yaml(y)
                .unwrap_err()
                .to_string()
        };
        assert!(err("quota: {requests_cpu: lots}").contains("quota.requests_cpu"));
        assert!(err("quota: {requests_memory: 1GB}").contains("not a Kubernetes quantity"));
        assert!(err("quota: {pod: 1}").contains("unknown field"));
        assert!(
            err("quota: {limits: {default_request: {cpu: 2, memory: 1Mi}}}")
                .contains("default_request.cpu")
        );
        super::super::TenantPolicy::from_yaml("quota: {limits: {default_request: {cpu: 1, memory: 1Mi}, default_limit: {cpu: 1, memory: 1Mi}}}").unwrap();
        // No default limit: only where no total of limits would have to count the unlimited.
        assert!(
            err("quota: {limits_cpu: 4, limits: {default_limit: null}}").contains(
                "quota.limits.default_limit: may be null only when limits_cpu and limits_memory are unset"
            )
        );
        assert!(
            err("quota: {limits_memory: 4Gi, limits: {default_limit: null}}")
                .contains("default_limit")
        );
        let p = super::super::TenantPolicy::from_yaml(
            "quota: {pods: 10, limits: {default_limit: null}}",
        )
        .unwrap();
        assert_eq!(p.quota.limits.default_limit, None);
        assert_eq!(
            p.quota.limits.default_request,
            Limits::default().default_request
        );
        // No default requests: only without totals of requests and without a default limit.
        let refused = "quota.limits.default_request: may be null only when requests_cpu and requests_memory are unset and default_limit is null";
        assert!(
            err("quota: {requests_cpu: 4, limits: {default_request: null, default_limit: null}}")
                .contains(refused)
        );
        assert!(
            err("quota: {limits: {default_request: null}}").contains(refused),
            "the default limit is still set"
        );
        let p = super::super::TenantPolicy::from_yaml(
            "quota: {pods: 10, limits: {default_request: null, default_limit: null}}",
        )
        .unwrap();
        assert_eq!(p.quota.limits.default_request, None);
    }

    #[test]
    fn without_any_defaults_a_container_runs_exactly_as_it_asked() {
        let l = Limits {
            default_request: None,
            default_limit: None,
        };
        let p = pod(
            "a",
            "p",
            &at(0),
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "20m"}}},
                {"name": "b"},
                {"name": "c", "resources": {"limits": {"memory": "1Gi"}}},
            ]),
        );
        let mut spec = p.spec.unwrap();
        let counted = effective_resources(&spec, &l).unwrap();
        assert_eq!(
            counted.0,
            Amount {
                cpu: 20,
                memory: 1 << 30
            }
        );
        fill_defaults(&mut spec, &l);
        let r = |i: usize| spec.containers[i].resources.clone();
        let a = r(0).unwrap();
        assert_eq!(
            a.requests.unwrap().keys().collect::<Vec<_>>(),
            ["cpu"],
            "no memory request added"
        );
        assert_eq!(a.limits, None);
        assert_eq!(r(1), None, "BestEffort stays BestEffort");
        assert_eq!(
            r(2).unwrap().requests.unwrap()["memory"].0,
            "1Gi",
            "a limit alone is the request"
        );
        assert_eq!(effective_resources(&spec, &l).unwrap(), counted);
    }

    #[test]
    fn without_default_limits_a_container_keeps_exactly_the_limits_it_set() {
        let l = Limits {
            default_limit: None,
            ..Limits::default()
        };
        let p = pod(
            "a",
            "p",
            &at(0),
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}},
                {"name": "b"},
                {"name": "c", "resources": {"limits": {"memory": "1Gi"}}},
            ]),
        );
        let mut spec = p.spec.unwrap();
        let counted = effective_resources(&spec, &l).unwrap();
        assert_eq!(
            counted.0,
            Amount {
                cpu: 200 + 100 + 100,
                memory: (64 << 20) + (128 << 20) + (1 << 30)
            }
        );
        fill_defaults(&mut spec, &l);
        let r = |i: usize| spec.containers[i].resources.clone().unwrap();
        assert_eq!(r(0).limits, None, "what it asked for, no more");
        assert_eq!(r(0).requests.unwrap()["cpu"].0, "200m");
        assert_eq!(
            r(1).requests.unwrap()["memory"].0,
            "128Mi",
            "requests still default"
        );
        assert_eq!(r(1).limits, None);
        assert_eq!(r(2).limits.unwrap().keys().collect::<Vec<_>>(), ["memory"]);
        assert_eq!(
            r(2).requests.unwrap()["memory"].0,
            "1Gi",
            "a limit alone is the request"
        );
        assert_eq!(effective_resources(&spec, &l).unwrap(), counted);
    }

    proptest! {
        #[test]
        fn the_admitted_set_never_exceeds_the_quota_beyond_the_host_and_ignores_input_order(
            pods in proptest::collection::vec(arb_pod(), 0..30),
            claims in proptest::collection::vec(arb_claim(), 0..12),
            services in arb_services(),
            namespaces in arb_namespaces(&["a", "default"]),
            limits in (1u64..8, 0u64..4000, 0u64..4, 0u64..5, 0u64..60, 0u64..4),
            seed in any::<u64>(),
        ) {
            let (pods_n, cpu, svc_n, claim_n, storage, ns_n) = limits;
            let q = Quota {
                pods: Some(pods_n),
                requests_cpu: Some(Quantity(format!("{cpu}m"))),
                requests_memory: Some("2Gi".into()),
                limits_cpu: Some("6".into()),
                limits_memory: None,
                services: Some(svc_n),
                persistent_volume_claims: Some(claim_n),
                requests_storage: Some(Quantity(format!("{storage}Gi"))),
                namespaces: Some(ns_n),
                limits: Limits::default(),
            };
            let pods = dedup(pods);
            let claims = dedup(claims);
            let placed: BTreeSet<Placed> = pods
                .iter()
                .step_by(3)
                .map(|p| ("Pod".to_owned(), key(p).0, key(p).1))
                .chain(services.iter().step_by(2).map(|s| ("Service".to_owned(), key(s).0, key(s).1)))
                .collect();
            let objects = Objects {
                namespaces: namespaces.iter().collect(),
                pods: pods.iter().collect(),
                services: services.iter().collect(),
                claims: claims.iter().collect(),
                placed: placed.clone(),
            };
            let (v, used) = admitted(&objects, &q);
            let hard = q.hard();
            // What is on the host holds its share, even past the quota (a quota lowered after
            // it was placed); nothing else may take the tenant past it.
            let on_host = |kind: &str, o: &Key| placed.contains(&(kind.to_owned(), o.0.clone(), o.1.clone()));
            let mut held = Usage::default();
            for p in pods.iter().filter(|p| p.counts() && on_host("Pod", &key(*p))) {
                held = held.plus(&p.takes(&q).unwrap_or_default());
            }
            for s in services.iter().filter(|s| s.counts() && on_host("Service", &key(*s))) {
                held = held.plus(&s.takes(&q).unwrap_or_default());
            }
            for r in RESOURCES {
                if let Some(h) = hard.get(r) {
                    let most = h.max(held.get(r).unwrap());
                    prop_assert!(used.get(r).unwrap() <= most, "{} used {:?} of {} ({} on the host)", r, used.get(r), h, most);
                }
            }
            // Recount from the verdicts alone.
            let admitted_pods = pods.iter().filter(|p| v.pods.get(&key(*p)).is_some_and(Vec::is_empty)).count() as u64;
            prop_assert_eq!(admitted_pods, used.pods);
            // Any permutation of the input gives the same verdicts.
            let mut rng = seed;
            let mut shuffle = |n: usize| -> Vec<usize> {
                let mut idx: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    idx.swap(i, (rng >> 33) as usize % (i + 1));
                }
                idx
            };
            let shuffled = Objects {
                namespaces: shuffle(namespaces.len()).into_iter().map(|i| &namespaces[i]).collect(),
                pods: shuffle(pods.len()).into_iter().map(|i| &pods[i]).collect(),
                services: shuffle(services.len()).into_iter().map(|i| &services[i]).collect(),
                claims: shuffle(claims.len()).into_iter().map(|i| &claims[i]).collect(),
                placed,
            };
            let (v2, used2) = admitted(&shuffled, &q);
            prop_assert_eq!(v, v2);
            prop_assert_eq!(used, used2);
        }
    }
}
