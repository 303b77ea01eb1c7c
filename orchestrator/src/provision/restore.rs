//! The restore pass: while a tenant is being restored from a snapshot, its pass stops the
//! control plane, runs the restore Jobs ([`crate::snapshots::jobs`]) and starts it again, as
//! [`crate::snapshots::restore_step`] says, instead of the bring-up.

use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::lifecycle::steps;
use crate::provision::outcome::Outcome;
use crate::provision::{Pass, outcome};
use crate::snapshots::store::{NewRestore, RestoreRow};
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{ConditionReason, ConditionStatus, ConditionType, Phase};

impl Provisioner {
    /// A pass while a restore has members left to restore: the control plane stays stopped.
    pub(crate) async fn restore_pass(
        &self,
        t: &Tenant,
        r: &RestoreRow,
        now: OffsetDateTime,
    ) -> Pass {
        use ConditionReason as R;
        use ConditionStatus as S;
        let prev = &t.conditions.0;
        let mut v = steps::Verdict {
            phase: Phase::Restoring,
            conditions: prev.clone(),
            requeue_after: steps::REQUEUE_WAITING,
        };
        let mut error = None;
        let version = self.version_of(t);
        let result = match self.job_input(t, version.as_ref()) {
            None => Ok((
                Some(NewRestore::Failed(format!(
                    "version {} or plan {} is not configured",
                    t.version, t.plan
                ))),
                String::new(),
            )),
            Some(input) => self.restore_members(t, &input, r).await,
        };
        let restore = match result {
            Ok((done, msg)) => {
                let (reason, message) = match &done {
                    Some(NewRestore::Failed(why)) => (R::Failed, why.as_str()),
                    _ => (R::Waiting, msg.as_str()),
                };
                steps::set_condition(
                    &mut v,
                    ConditionType::Restored,
                    S::False,
                    reason,
                    message,
                    prev,
                    now,
                );
                match &done {
                    None => {}
                    Some(NewRestore::Failed(_)) => {
                        // Started again on the data it has; the next pass brings it up.
                        v.phase = Phase::Provisioning;
                        v.requeue_after = Duration::ZERO;
                    }
                    Some(_) => v.requeue_after = Duration::ZERO,
                }
                done.map(|d| (r.id, d))
            }
            Err(e) => {
                error = Some(e.variant());
                steps::set_condition(
                    &mut v,
                    ConditionType::Restored,
                    S::False,
                    R::Error,
                    &e.public(),
                    prev,
                    now,
                );
                v.requeue_after = steps::REQUEUE_ERROR;
                None
            }
        };
        Pass {
            outcome: Outcome {
                restore,
                ..outcome(v, t, t.endpoint.clone())
            },
            error,
            work: Vec::new(),
        }
    }
}
