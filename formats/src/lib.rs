//! flannel's formats, as Weft reads and writes them: what other nodes put
//! into etcd (lease JSON with its backend data, subnet keys), the network
//! config, subnet.env on disk, MAC addresses and WireGuard keys.
//!
//! Everything here parses untrusted input, and nothing else is here: the
//! fuzz targets (`fuzz/`) build this crate alone, as aya-obj is built
//! apart from aya. The agent (`weft`) re-exports it where it always was
//! (`weft::lease`, `weft::mac`, `weft::wgkey`).

pub mod attrs;
pub mod config;
pub mod json;
pub mod key;
pub mod mac;
pub mod pool;
pub mod subnet_file;
pub mod wgkey;
pub mod wireguard;
#[cfg(test)]
mod wireguard_tests;
