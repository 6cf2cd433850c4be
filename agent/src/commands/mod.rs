//! The operator commands: `weft leases`, `status`, `counters`, `teardown`,
//! `install-cni`, `uninstall-cni`, `doctor`.

mod counters;
mod doctor;
mod install_cni;
mod leases;
mod status;
mod teardown;

pub(crate) use counters::counters;
pub(crate) use doctor::{DoctorArgs, doctor};
pub(crate) use install_cni::{install_cni, uninstall_cni};
pub(crate) use leases::leases;
pub(crate) use status::status;
pub(crate) use teardown::teardown;
