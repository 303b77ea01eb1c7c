//! Encryption at rest of a tenant's etcd: its data keys in the inventory, sealed with the
//! inventory key ([`store`]), and what a pass does with them on the host and in the tenant
//! ([`host`]).
//!
//! inventory rows (sealed) -> opened with `--inventory-key` ([`crate::pki::seal`]) -> the
//! configuration for the rotation's phase ([`crate::render::encryption`], pure) -> host Secret
//! `encryption-config` + the apiserver's rollout digest -> in a rotation's `serve` phase, every
//! object of the plan's resources rewritten in the tenant apiserver -> the old key retired.
//!
//! A tenant's first key is made before its etcd exists. A tenant from before encryption at
//! rest (its etcd exists, it has no key) gets its first key through an encryption-key
//! rotation that vcp starts itself, so that every replica reads the key before any writes
//! with it, and its plaintext objects are rewritten encrypted.

pub mod host;
pub mod store;
