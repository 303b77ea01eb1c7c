//! Upgrades of tenant control planes to another Kubernetes minor.
//!
//! The pure rules live here, free of clients and pools: [`skew`] plans the hops of one
//! tenant's upgrade and checks every state of its rollout against the version skew rules.
//! The API refuses a request those rules refuse, naming the rule.

pub mod skew;
