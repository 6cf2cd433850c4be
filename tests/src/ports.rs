//! Loopback ports for the processes a test starts (etcd, agents' health
//! servers).
//!
//! A port is found by binding port 0 and letting go of it, so the process
//! it is meant for can bind it a moment later. Until then the kernel may
//! hand the same port to the next caller: with 50 agents starting at once
//! on a busy machine, two of them were given one port and the second could
//! not serve. Every port handed out here is remembered for the life of the
//! test process and never handed out again.

use std::{
    collections::HashSet,
    net::{Ipv4Addr, TcpListener},
    sync::Mutex,
};

/// A loopback TCP port free now and not handed out before by this process.
pub fn loopback() -> std::io::Result<u16> {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    // Held together, the listeners make the kernel pick a new port each
    // time; they are let go once one port is new to this process.
    let mut held = Vec::new();
    for _ in 0..64 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = l.local_addr()?.port();
        if given.insert(port) {
            return Ok(port);
        }
        held.push(l);
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "64 loopback ports in a row were handed out before",
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn never_the_same_port_twice() {
        let ports: Vec<u16> = (0..2000).map(|_| super::loopback().unwrap()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
