//! Adding members to a tenant's own etcd while it serves (a plan change from one member to
//! three; the rules are [`crate::lifecycle::members`]).
//!
//! Data flow: the etcd step of a tenant's pass ([`host`]) reads the StatefulSet `etcd` and the
//! next member's Jobs, applies what the rules say (a Job, or the StatefulSet in its growing
//! shape), and reports `EtcdReady` waiting until every member votes; then the plan's own
//! StatefulSet is rendered. The Jobs run `vcp tool etcd-member` ([`tool`]) with the
//! apiserver's etcd client certificate, through etcd's JSON gateway on the voting members.

pub mod host;
pub mod tool;
