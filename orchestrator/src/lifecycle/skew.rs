//! Version skew rules of a tenant control plane (pure).
//!
//! An upgrade request names a target minor; [`plan_hops`] turns it into the hops the tenant
//! goes through, one minor each, or refuses it with the [`SkewError`] naming the broken rule
//! (the API answers it as a 422 whose `rule` says which). Each hop then rolls the components
//! whose image or flags change, in [`rollout`] order, and every state on the way satisfies
//! [`check_state`]: the rules Kubernetes' version skew policy states for the control plane,
//! and etcd's own upgrade rule.
//!
//! - **No downgrade.** A minor never goes down, except by the automatic rollback of a failed
//!   hop, which is not planned here: it returns to the version the tenant ran.
//! - **One minor per hop.** 1.35 -> 1.37 is two hops; a request that skips a minor is refused
//!   unless it asks for the chain, and the chain goes only through minors in the catalog.
//! - **No expired target, preview only on request.** An expired minor is where tenants come
//!   from, never where they go.
//! - **kube-apiserver first.** kube-controller-manager is never newer than the apiserver and
//!   at most one minor older (Kubernetes' skew policy), so it rolls after it.
//! - **etcd one minor at a time, never down.** etcd upgrades one minor per step and cannot be
//!   downgraded in place; a catalog hop that would do either is refused.
//! - **CoreDNS and the syncer follow the apiserver.** Both are API clients: CoreDNS reads
//!   Services and EndpointSlices (stable APIs every catalog minor serves), and the syncer is
//!   built against the newest catalog minor and supports the two before it. They roll last,
//!   against an apiserver already on the new minor.

use crate::render::Component;
use crate::render::catalog::{Catalog, Class, Version, minor_number};

/// Why an upgrade request or a control-plane state breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkewError {
    #[error("the tenant already runs {0} (rule unchanged)")]
    Unchanged(String),
    #[error("{to} is older than {from}: a tenant is never downgraded (rule no-downgrade)")]
    Downgrade { from: String, to: String },
    #[error(
        "{from} -> {to} skips a minor: one minor per hop (rule one-minor-per-hop); ask for the chain through {via} (`chain`)"
    )]
    MinorSkip {
        from: String,
        to: String,
        via: String,
    },
    #[error(
        "{0} is not in the catalog: a chain goes through catalog minors only (rule chain-through-catalog)"
    )]
    MissingHop(String),
    #[error("{0} is expired: no tenant is upgraded to it (rule no-expired-target)")]
    ExpiredTarget(String),
    #[error("{0} is a preview: ask for it with `allow_preview` (rule preview-on-request)")]
    PreviewTarget(String),
    #[error(
        "kube-controller-manager {controller_manager} with kube-apiserver {apiserver}: it must not be newer and at most one minor older (rule apiserver-first)"
    )]
    ControllerManagerSkew {
        apiserver: String,
        controller_manager: String,
    },
    #[error(
        "etcd {from} -> {to}: etcd moves one minor at a time and never down (rule etcd-one-minor)"
    )]
    EtcdSkew { from: String, to: String },
    #[error("{component} image {image:?} has no version vcp can read (rule readable-images)")]
    Unreadable {
        component: &'static str,
        image: String,
    },
}

impl SkewError {
    /// The rule's name, as the API's problem reports it.
    pub fn rule(&self) -> &'static str {
        match self {
            SkewError::Unchanged(_) => "unchanged",
            SkewError::Downgrade { .. } => "no-downgrade",
            SkewError::MinorSkip { .. } => "one-minor-per-hop",
            SkewError::MissingHop(_) => "chain-through-catalog",
            SkewError::ExpiredTarget(_) => "no-expired-target",
            SkewError::PreviewTarget(_) => "preview-on-request",
            SkewError::ControllerManagerSkew { .. } => "apiserver-first",
            SkewError::EtcdSkew { .. } => "etcd-one-minor",
            SkewError::Unreadable { .. } => "readable-images",
        }
    }
}

/// What an upgrade request allows beyond the rules' defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allow {
    /// Go through the minors between, one hop each.
    pub chain: bool,
    /// The target may be a preview.
    pub preview: bool,
}

/// The hops from the minor `from` to the minor `to`, each one minor up, ending at `to`.
pub fn plan_hops<'c>(
    catalog: &'c Catalog,
    from: &str,
    to: &str,
    allow: Allow,
) -> Result<Vec<&'c Version>, SkewError> {
    let target = catalog
        .get(to)
        .ok_or_else(|| SkewError::MissingHop(to.to_owned()))?;
    let (Some(f), Some(t)) = (minor_number(from), minor_number(to)) else {
        return Err(SkewError::MissingHop(to.to_owned()));
    };
    match target.class {
        Class::Expired => return Err(SkewError::ExpiredTarget(to.to_owned())),
        Class::Preview if !allow.preview => return Err(SkewError::PreviewTarget(to.to_owned())),
        _ => {}
    }
    if t == f {
        return Err(SkewError::Unchanged(to.to_owned()));
    }
    if t < f {
        return Err(SkewError::Downgrade {
            from: from.to_owned(),
            to: to.to_owned(),
        });
    }
    let between: Vec<String> = (f + 1..t).map(|m| format!("1.{m}")).collect();
    if !between.is_empty() && !allow.chain {
        return Err(SkewError::MinorSkip {
            from: from.to_owned(),
            to: to.to_owned(),
            via: between.join(", "),
        });
    }
    let mut hops = Vec::new();
    for m in &between {
        let v = catalog
            .get(m)
            .ok_or_else(|| SkewError::MissingHop(m.clone()))?;
        // A chain may pass through a deprecated or even an expired minor (it does not stay
        // there), but not through a preview one unless the target itself is allowed to be.
        if v.class == Class::Preview && !allow.preview {
            return Err(SkewError::PreviewTarget(m.clone()));
        }
        hops.push(v);
    }
    hops.push(target);
    let mut prev = catalog
        .get(from)
        .ok_or_else(|| SkewError::MissingHop(from.to_owned()))?;
    for v in &hops {
        check_hop(prev, v)?;
        prev = v;
    }
    Ok(hops)
}

/// Components a hop from `from` to `to` rolls, in order: those whose image or flags change,
/// etcd first, then kube-apiserver, kube-controller-manager, CoreDNS, and the syncer last (it
/// is the same build for every minor, but it restarts against the new apiserver so that its
/// discovery and virtual nodes follow the new minor).
pub fn rollout(from: &Version, to: &Version) -> Vec<Component> {
    let image = |v: &Version, c: &str| v.images.get(c).cloned();
    let mut out = Vec::new();
    if image(from, "etcd") != image(to, "etcd") {
        out.push(Component::Etcd);
    }
    if image(from, "kube-apiserver") != image(to, "kube-apiserver")
        || from.apiserver_flags != to.apiserver_flags
    {
        out.push(Component::Apiserver);
    }
    if image(from, "kube-controller-manager") != image(to, "kube-controller-manager")
        || from.controller_manager_flags != to.controller_manager_flags
    {
        out.push(Component::ControllerManager);
    }
    if image(from, "coredns") != image(to, "coredns") {
        out.push(Component::Coredns);
    }
    if from.minor != to.minor {
        out.push(Component::Syncer);
    }
    out
}

/// The versions a control plane runs at one moment of a rollout: each component's version
/// as its image tag says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub etcd: (u32, u32),
    pub apiserver: u32,
    pub controller_manager: u32,
}

impl State {
    /// The state a catalog entry describes.
    pub fn of(v: &Version) -> Result<State, SkewError> {
        Ok(State {
            etcd: etcd_minor(v)?,
            apiserver: kube_minor(v, "kube-apiserver")?,
            controller_manager: kube_minor(v, "kube-controller-manager")?,
        })
    }

    /// This state after `c` moved to `to`'s version.
    pub fn with(&self, c: Component, to: &State) -> State {
        let mut s = self.clone();
        match c {
            Component::Etcd => s.etcd = to.etcd,
            Component::Apiserver => s.apiserver = to.apiserver,
            Component::ControllerManager => s.controller_manager = to.controller_manager,
            _ => {}
        }
        s
    }
}

/// Whether a moment of a rollout is allowed by the skew rules (`from` is where etcd was).
pub fn check_state(etcd_from: (u32, u32), s: &State) -> Result<(), SkewError> {
    if s.controller_manager > s.apiserver || s.apiserver - s.controller_manager > 1 {
        return Err(SkewError::ControllerManagerSkew {
            apiserver: format!("1.{}", s.apiserver),
            controller_manager: format!("1.{}", s.controller_manager),
        });
    }
    check_etcd(etcd_from, s.etcd)
}

fn check_etcd(from: (u32, u32), to: (u32, u32)) -> Result<(), SkewError> {
    let ok = to == from || (to.0 == from.0 && to.1 == from.1 + 1);
    ok.then_some(()).ok_or_else(|| SkewError::EtcdSkew {
        from: format!("{}.{}", from.0, from.1),
        to: format!("{}.{}", to.0, to.1),
    })
}

/// Whether one hop, rolled in [`rollout`] order, keeps every state on the way legal.
pub fn check_hop(from: &Version, to: &Version) -> Result<(), SkewError> {
    let (start, end) = (State::of(from)?, State::of(to)?);
    let mut s = start.clone();
    check_state(start.etcd, &s)?;
    for c in rollout(from, to) {
        s = s.with(c, &end);
        check_state(start.etcd, &s)?;
    }
    Ok(())
}

fn kube_minor(v: &Version, component: &'static str) -> Result<u32, SkewError> {
    let image = v.images.get(component).map(String::as_str).unwrap_or("");
    let tag = image.rsplit_once(':').map_or("", |(_, t)| t);
    tag.strip_prefix("v1.")
        .and_then(|r| r.split('.').next())
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| SkewError::Unreadable {
            component,
            image: image.to_owned(),
        })
}

fn etcd_minor(v: &Version) -> Result<(u32, u32), SkewError> {
    let image = v.images.get("etcd").map(String::as_str).unwrap_or("");
    let tag = image.rsplit_once(':').map_or("", |(_, t)| t);
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let mut parts = tag.split(['.', '-']).map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => Err(SkewError::Unreadable {
            component: "etcd",
            image: image.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn builtin() -> Catalog {
        Catalog::builtin()
    }

    fn minors(hops: &[&Version]) -> Vec<String> {
        hops.iter().map(|v| v.minor.clone()).collect()
    }

    #[test]
    fn one_minor_per_hop_and_chains_only_on_request() {
        let c = builtin();
        let none = Allow::default();
        let chain = Allow {
            chain: true,
            ..Allow::default()
        };
        assert_eq!(
            minors(&plan_hops(&c, "1.36", "1.37", none).unwrap()),
            ["1.37"]
        );
        assert_eq!(
            minors(&plan_hops(&c, "1.35", "1.36", none).unwrap()),
            ["1.36"]
        );
        let e = plan_hops(&c, "1.35", "1.37", none).unwrap_err();
        assert_eq!(e.rule(), "one-minor-per-hop");
        assert!(e.to_string().contains("through 1.36"), "{e}");
        assert_eq!(
            minors(&plan_hops(&c, "1.35", "1.37", chain).unwrap()),
            ["1.36", "1.37"]
        );
    }

    #[test]
    fn every_refusal_names_its_rule_in_its_message() {
        let e = [
            SkewError::Unchanged("1.37".into()),
            SkewError::Downgrade {
                from: "a".into(),
                to: "b".into(),
            },
            SkewError::MinorSkip {
                from: "a".into(),
                to: "b".into(),
                via: "c".into(),
            },
            SkewError::MissingHop("a".into()),
            SkewError::ExpiredTarget("a".into()),
            SkewError::PreviewTarget("a".into()),
            SkewError::ControllerManagerSkew {
                apiserver: "a".into(),
                controller_manager: "b".into(),
            },
            SkewError::EtcdSkew {
                from: "a".into(),
                to: "b".into(),
            },
            SkewError::Unreadable {
                component: "etcd",
                image: "x".into(),
            },
        ];
        for e in e {
            assert!(
                e.to_string().contains(&format!("(rule {})", e.rule())),
                "{e}"
            );
        }
    }

    #[test]
    fn refusals_name_their_rule() {
        let c = builtin();
        let chain = Allow {
            chain: true,
            ..Allow::default()
        };
        let rule = |from: &str, to: &str| plan_hops(&c, from, to, chain).unwrap_err().rule();
        assert_eq!(rule("1.37", "1.36"), "no-downgrade");
        assert_eq!(rule("1.37", "1.35"), "no-downgrade");
        assert_eq!(rule("1.37", "1.37"), "unchanged");
        assert_eq!(rule("1.36", "1.38"), "chain-through-catalog");
        let ok = include_str!("../../../templates/versions.yaml");
        let expired = Catalog::parse(&ok.replace("class: deprecated", "class: expired")).unwrap();
        assert_eq!(
            plan_hops(&expired, "1.36", "1.35", chain)
                .unwrap_err()
                .rule(),
            "no-expired-target"
        );
        // Leaving an expired minor is what it is for.
        assert!(plan_hops(&expired, "1.35", "1.36", chain).is_ok());
        let preview = Catalog::parse(
            &ok.replacen(
                "minor: \"1.37\"\n    kubernetes: v1.37.1\n    class: supported",
                "minor: \"1.37\"\n    kubernetes: v1.37.1\n    class: preview",
                1,
            )
            .replace("default: \"1.37\"", "default: \"1.36\""),
        )
        .unwrap();
        assert_eq!(
            plan_hops(&preview, "1.36", "1.37", chain)
                .unwrap_err()
                .rule(),
            "preview-on-request"
        );
        let both = Allow {
            chain: true,
            preview: true,
        };
        assert!(plan_hops(&preview, "1.36", "1.37", both).is_ok());
    }

    #[test]
    fn a_catalog_hop_that_moves_etcd_two_minors_or_down_is_refused() {
        let c = builtin();
        let mut to = c.get("1.37").unwrap().clone();
        let from = c.get("1.36").unwrap();
        to.images
            .insert("etcd".into(), "registry.k8s.io/etcd:3.8.0-0".into());
        assert_eq!(check_hop(from, &to).unwrap_err().rule(), "etcd-one-minor");
        to.images
            .insert("etcd".into(), "registry.k8s.io/etcd:3.5.21-0".into());
        assert_eq!(check_hop(from, &to).unwrap_err().rule(), "etcd-one-minor");
        to.images
            .insert("etcd".into(), "registry.k8s.io/etcd:3.7.0-0".into());
        assert!(check_hop(from, &to).is_ok());
        assert_eq!(rollout(from, &to)[0], Component::Etcd);
        to.images.insert("etcd".into(), "etcd".into());
        assert_eq!(check_hop(from, &to).unwrap_err().rule(), "readable-images");
    }

    #[test]
    fn the_apiserver_rolls_before_the_controller_manager() {
        let c = builtin();
        let (from, to) = (c.get("1.36").unwrap(), c.get("1.37").unwrap());
        assert_eq!(
            rollout(from, to),
            [
                Component::Apiserver,
                Component::ControllerManager,
                Component::Syncer
            ]
        );
        let start = State::of(from).unwrap();
        let end = State::of(to).unwrap();
        // The other order would pass through a controller-manager newer than its apiserver.
        let wrong = start.with(Component::ControllerManager, &end);
        assert_eq!(
            check_state(start.etcd, &wrong).unwrap_err().rule(),
            "apiserver-first"
        );
        // Nothing changes between identical entries.
        assert!(rollout(from, from).is_empty());
    }

    proptest! {
        /// Every state a planned rollout passes through is legal, for any adjacent minors
        /// and any etcd step the catalog may take.
        #[test]
        fn every_state_along_a_planned_hop_is_legal(m in 20u32..60, etcd_step in 0u32..2, dns in any::<bool>()) {
            let c = builtin();
            let base = c.get("1.37").unwrap();
            let entry = |minor: u32, etcd_minor: u32, coredns: &str| {
                let mut v = base.clone();
                v.minor = format!("1.{minor}");
                v.kubernetes = format!("v1.{minor}.0");
                v.images.insert("kube-apiserver".into(), format!("registry.k8s.io/kube-apiserver:v1.{minor}.0"));
                v.images.insert("kube-controller-manager".into(), format!("registry.k8s.io/kube-controller-manager:v1.{minor}.0"));
                v.images.insert("etcd".into(), format!("registry.k8s.io/etcd:3.{etcd_minor}.0-0"));
                v.images.insert("coredns".into(), coredns.to_owned());
                v
            };
            let from = entry(m, 6, "registry.k8s.io/coredns/coredns:v1.15.0");
            let to = entry(m + 1, 6 + etcd_step, if dns { "registry.k8s.io/coredns/coredns:v1.16.0" } else { "registry.k8s.io/coredns/coredns:v1.15.0" });
            prop_assert!(check_hop(&from, &to).is_ok());
            let order = rollout(&from, &to);
            let pos = |c: Component| order.iter().position(|x| *x == c);
            prop_assert!(pos(Component::Apiserver) < pos(Component::ControllerManager));
            prop_assert_eq!(order.last(), Some(&Component::Syncer));
            prop_assert_eq!(pos(Component::Etcd).is_some(), etcd_step == 1);
            prop_assert_eq!(pos(Component::Coredns).is_some(), dns);
        }
    }
}
