//! API tokens: admins create, list and revoke the tokens owners call the API with.
//!
//! Data flow: `POST /v1/tokens` ([`api`]) makes a token, which is shown once; [`store`] keeps
//! only its hash (the lookup on every request is [`crate::http::auth`]'s). `vcp serve` makes sure
//! the admin token it was given exists ([`store`]). `vcp token` is in [`cli`].

pub mod api;
pub mod cli;
pub mod store;
pub mod types;
