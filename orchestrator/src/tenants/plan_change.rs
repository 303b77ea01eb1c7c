//! What a plan change (`PATCH /v1/tenants/{name}` with `plan`) does, decided from the two
//! plans and the tenant's last usage sample, with no I/O: nothing, a change in place (the next
//! pass renders the control plane and the syncer's policy from the new plan, and grows its own
//! etcd to more members: [`crate::lifecycle::members`]), a move of the
//! tenant's data to another store ([`crate::snapshots::moves`]), or a refusal that says why.

use crate::render::Plan;
use vcp_policy::quota::Usage;

/// What a plan change does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The same plan.
    Unchanged,
    /// Sizes, policy, tuning: rendered by the next pass.
    InPlace,
    /// Another store (a dedicated etcd, a shared datastore, another datastore): the data move.
    Move,
}

/// Why a plan change is refused (409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the tenant's usage does not fit plan {plan:?}: {}", over.join(", "))]
    Usage { plan: String, over: Vec<String> },
    #[error(
        "plan {plan:?} runs {to} etcd members where the tenant's runs {from}: removing members from a tenant's own etcd is not supported"
    )]
    Members { plan: String, from: u8, to: u8 },
}

/// The change from plan `from` to plan `to_name` (`to`), for a tenant whose last usage sample
/// is `used` (none yet: nothing to check against).
pub fn classify(
    from_name: &str,
    from: &Plan,
    to_name: &str,
    to: &Plan,
    used: Option<&Usage>,
) -> Result<Change, Refusal> {
    if from_name == to_name {
        return Ok(Change::Unchanged);
    }
    if let Some(used) = used {
        // The syncer enforces the plan's quota as the plan states it.
        let over: Vec<String> = to
            .policy
            .quota
            .hard()
            .exceeded_by(used)
            .into_iter()
            .map(|(r, used, limit)| format!("{r} {used} > {limit}"))
            .collect();
        if !over.is_empty() {
            return Err(Refusal::Usage {
                plan: to_name.to_owned(),
                over,
            });
        }
    }
    if from.datastore != to.datastore {
        return Ok(Change::Move);
    }
    // More members are added one at a time while etcd serves ([`crate::lifecycle::members`]);
    // fewer would need them removed the same way, which vcp does not do.
    if from.datastore.is_none() && to.etcd_replicas < from.etcd_replicas {
        return Err(Refusal::Members {
            plan: to_name.to_owned(),
            from: from.etcd_replicas,
            to: to.etcd_replicas,
        });
    }
    Ok(Change::InPlace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::parse_plans;

    fn plans() -> std::collections::BTreeMap<String, Plan> {
        parse_plans(
            "small: {policy: {quota: {pods: 2, services: 1}}}\n\
             big: {apiserver_replicas: 2}\n\
             shared: {datastore: ds}\n\
             other-shared: {datastore: ds2}\n\
             three: {etcd_replicas: 3}\n",
        )
        .unwrap()
    }

    fn classify_names(from: &str, to: &str, used: Option<&Usage>) -> Result<Change, Refusal> {
        let p = plans();
        classify(from, &p[from], to, &p[to], used)
    }

    #[test]
    fn plan_changes_are_in_place_moves_or_refused_with_the_reason() {
        assert_eq!(classify_names("big", "big", None), Ok(Change::Unchanged));
        assert_eq!(classify_names("small", "big", None), Ok(Change::InPlace));
        assert_eq!(classify_names("big", "shared", None), Ok(Change::Move));
        assert_eq!(classify_names("shared", "big", None), Ok(Change::Move));
        assert_eq!(
            classify_names("shared", "other-shared", None),
            Ok(Change::Move)
        );
        assert_eq!(classify_names("big", "three", None), Ok(Change::InPlace));
        let e = classify_names("three", "big", None).unwrap_err();
        assert!(matches!(e, Refusal::Members { from: 3, to: 1, .. }), "{e}");
        // A datastore's members are the datastore's, whatever the tenant's plan says.
        assert_eq!(classify_names("three", "shared", None), Ok(Change::Move));
        // Usage that fits the smaller plan moves; usage that does not is named.
        let fits = Usage {
            pods: 2,
            services: 1,
            ..Usage::default()
        };
        assert_eq!(
            classify_names("big", "small", Some(&fits)),
            Ok(Change::InPlace)
        );
        let over = Usage {
            pods: 3,
            services: 1,
            ..Usage::default()
        };
        let e = classify_names("big", "small", Some(&over)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the tenant's usage does not fit plan \"small\": pods 3 > 2"
        );
    }
}
