//! Rotations of a tenant's certificate authorities and service-account keys.
//!
//! Data flow: `POST /v1/tenants/{name}/rotations` ([`api`]) records a rotation ([`store`]) and
//! makes the tenant due. The reconcile pass walks it through its phases, which
//! [`crate::pki::rotation`] says (pure, and shared with the pass's certificates and with
//! kubeconfig signing), and applies each phase's Secrets and rollouts on the host ([`host`]).
//! `vcp tenant rotate` and `vcp tenant rotations` are in [`cli`].

pub mod api;
pub mod cli;
pub mod host;
pub mod store;
