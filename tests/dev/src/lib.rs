//! `vcp-dev`: a complete Kubernetes host cluster on one machine, for vcp's development and tests.
//!
//! Data flow: [`bins`] finds the Kubernetes binaries that `tests/kube-bin/build.sh` compiled
//! from Go modules; [`pki`] generates the cluster's certificates and [`kubeconfig`] renders
//! kubeconfigs for them (both pure); [`process`] starts each component in its own process
//! group; [`cluster`] sequences etcd -> kube-apiserver -> controller-manager, scheduler, kwok
//! (simulated worker nodes) and the PV [`provisioner`], and records what runs in
//! `<state>/state.json`; [`postgres`] adds a throwaway PostgreSQL. [`platform`] puts vcp on
//! top: installed with its Helm chart ([`chart`]) or as a local `vcp serve`. The real [`node`]
//! runs containers from [`images`] written here; [`outside`] stands for the internet in its tests.
//!
//! As a library, [`DevCluster::start`] gives tests a cluster that is torn down on drop (and
//! dies with the test process even on SIGKILL); as a binary, `vcp-dev up|status|down` manages
//! one that outlives the command.

#![forbid(unsafe_code)]

pub mod bins;
pub mod chart;
pub mod cluster;
pub mod devnet;
mod error;
pub mod images;
pub mod kubeconfig;
pub mod kwok;
pub mod node;
pub mod outside;
pub mod pki;
pub mod platform;
pub mod postgres;
pub mod process;
pub mod provisioner;
pub mod s3;
pub mod tenant;
pub mod testing;

pub use cluster::{DevCluster, Options, State, Timings};
pub use error::{Error, Result};
pub use postgres::EphemeralPostgres;
pub use process::Supervision;
