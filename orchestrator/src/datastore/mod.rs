//! Shared datastores: etcd clusters vcp runs for many tenants, each tenant under its own key
//! prefix with its own etcd user whose role reaches only that prefix.
//!
//! Data flow: `--datastores FILE` declares them and a plan names one (`datastore: NAME`; the
//! names and objects are pure, in [`crate::render::datastore`]). `vcp serve`'s datastore loop
//! reconciles each declared datastore on the host ([`host`]: namespace, CA and certificates,
//! members, then an `init` Job that turns etcd's authentication on) and records its phase
//! ([`store`]). A tenant on such a plan gets, in its pass: its apiserver's etcd client
//! certificate from the datastore's CA with its user as the common name, a `grant-<key>` Job
//! that creates that user and its role (recorded once it succeeded), and an apiserver that
//! dials the datastore's members with `--etcd-prefix=/vcp/<key>`; no etcd of its own. Its
//! teardown runs `revoke-<key>` (keys, user and role gone). The Jobs run `vcp tool datastore`
//! ([`tool`]) as root.

pub mod host;
pub mod store;
pub mod tool;

pub use crate::render::datastore::ROOT;
