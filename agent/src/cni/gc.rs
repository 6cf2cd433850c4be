//! GC (CNI 1.1): the runtime names every attachment of the network that is
//! still valid (`cni.dev/valid-attachments`); whatever the plugin holds for
//! another one is released, as DEL would have released it had the runtime
//! called it: the endpoint record and what it programmed, a standalone
//! attachment's delegate (the bridge's veth and host-local's addresses), a
//! netkit pair, and host-local addresses of the network that no valid
//! attachment owns (an ADD that died before it registered, a DEL that
//! never came).
//!
//! libcni 1.2 calls GC with the network's config and no `CNI_CONTAINERID`,
//! `CNI_NETNS` or `CNI_IFNAME`. A config without the list is refused:
//! taking "no list" for "nothing is valid" would release every pod.

use std::{
    collections::HashSet,
    net::IpAddr,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::{
    Env,
    config::NetConf,
    delegate,
    error::{CniError, Code},
    fastpath, netkit, notify,
    record::{self, Record},
};

/// The config key libcni puts the valid attachments under.
const VALID: &str = "cni.dev/valid-attachments";

/// host-local's data directory when the config names none.
const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks";

/// The attachments the runtime says are valid: (container id, ifname).
fn valid_attachments(stdin: &[u8]) -> Result<HashSet<(String, String)>, CniError> {
    let v: Value = serde_json::from_slice(stdin).unwrap_or(Value::Null);
    let list = v.get(VALID).and_then(Value::as_array).ok_or_else(|| {
        CniError::new(
            Code::InvalidConfig,
            format!(
                "GC needs {VALID:?}, the list of the attachments still valid (nothing was released)"
            ),
        )
    })?;
    list.iter()
        .map(|a| {
            let id = a["containerID"].as_str();
            let ifname = a["ifname"].as_str();
            match (id, ifname) {
                (Some(id), Some(ifname)) => Ok((id.to_string(), ifname.to_string())),
                _ => Err(CniError::new(
                    Code::InvalidConfig,
                    format!("{VALID:?}: {a} has no containerID and ifname (nothing was released)"),
                )),
            }
        })
        .collect()
}

pub(super) fn gc(conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    let valid = valid_attachments(stdin)?;
    let is_valid = |r: &Record| valid.contains(&(r.container_id.clone(), r.ifname.clone()));
    let stale: Vec<Record> = record::records(&conf.state_dir)
        .into_iter()
        .filter(|r| r.network == conf.name && !is_valid(r))
        .collect();
    let mut first_error = None;
    for rec in &stale {
        if let Err(e) = release(conf, env, rec) {
            first_error.get_or_insert(e);
        }
    }
    let data_dir = conf
        .data_dir()
        .map_or_else(|| PathBuf::from(HOST_LOCAL_DIR), PathBuf::from)
        .join(&conf.name);
    if let Err(e) = release_addresses(&data_dir, &valid) {
        first_error.get_or_insert(e);
    }
    if !stale.is_empty() {
        notify::agent(&conf.state_dir);
    }
    first_error.map_or(Ok(()), Err)
}

/// What DEL does for `rec`, with its own container id, netns and ifname.
fn release(conf: &NetConf, env: &Env, rec: &Record) -> Result<(), CniError> {
    let theirs = Env {
        command: "DEL".into(),
        container_id: rec.container_id.clone(),
        netns: rec.netns.clone(),
        ifname: rec.ifname.clone(),
        path: env.path.clone(),
        pod: rec.pod.clone(),
    };
    let owner = rec.owner();
    match (&rec.delegate, rec.netkit) {
        (Some(ipam), true) => netkit::del(
            ipam,
            &conf.state_dir,
            &conf.bridge,
            &rec.ips(),
            &theirs,
            &owner,
        )?,
        (Some(d), false) => drop(delegate::exec(d, "DEL", &theirs, None)?),
        // Chained: the plugins before Weft's hold the rest.
        (None, _) => {}
    }
    fastpath::unprogram(&conf.state_dir, rec);
    record::remove(&conf.state_dir, &owner)
}

/// host-local's reservations under `dir` (one file per address, holding
/// `<container id>\r\n<ifname>`, or only the id as older host-local wrote
/// them) whose owner is not valid: removed under host-local's own lock, as
/// its release does.
fn release_addresses(dir: &Path, valid: &HashSet<(String, String)>) -> Result<(), CniError> {
    let io = |what: &str, e: std::io::Error| {
        CniError::new(Code::Io, format!("{what} {}", dir.display())).with_details(e.to_string())
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("reading", e)),
    };
    let lock = std::fs::File::open(dir.join("lock"))
        .or_else(|_| std::fs::File::open(dir))
        .map_err(|e| io("opening the lock of", e))?;
    // SAFETY: flock on a descriptor this function owns; no memory involved.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io("locking", std::io::Error::last_os_error()));
    }
    let ids: HashSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
    for e in entries.flatten() {
        let name = e.file_name();
        if name
            .to_str()
            .and_then(|n| n.parse::<IpAddr>().ok())
            .is_none()
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let mut parts = text.split("\r\n").map(str::trim);
        let id = parts.next().unwrap_or("");
        let owned = match parts.next().filter(|i| !i.is_empty()) {
            Some(ifname) => valid.contains(&(id.to_string(), ifname.to_string())),
            None => ids.contains(id),
        };
        if !owned {
            match std::fs::remove_file(e.path()) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(io("releasing an address in", err)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_required_and_read_as_libcni_writes_it() {
        let ok = valid_attachments(
            br#"{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert!(ok.contains(&("a".into(), "eth0".into())));
        assert!(
            valid_attachments(br#"{"cni.dev/valid-attachments":[]}"#)
                .unwrap()
                .is_empty()
        );
        for bad in [
            &br#"{}"#[..],
            br#"{"cni.dev/valid-attachments":{}}"#,
            br#"{"cni.dev/valid-attachments":[{"containerID":"a"}]}"#,
        ] {
            assert!(valid_attachments(bad).is_err());
        }
    }

    #[test]
    fn only_addresses_of_attachments_not_named_are_released() {
        let dir = std::env::temp_dir().join(format!("weft-gc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let files = [
            ("10.244.1.2", "keep\r\neth0"),
            ("10.244.1.3", "gone\r\neth0"),
            ("10.244.1.4", "keep\r\neth1"),
            ("10.244.1.5", "keep"),
            ("10.244.1.6", "old"),
            ("last_reserved_ip.0", "10.244.1.6"),
            ("lock", ""),
        ];
        for (n, c) in files {
            std::fs::write(dir.join(n), c).unwrap();
        }
        let valid = HashSet::from([("keep".to_string(), "eth0".to_string())]);
        release_addresses(&dir, &valid).unwrap();
        let left: HashSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let want: HashSet<String> = ["10.244.1.2", "10.244.1.5", "last_reserved_ip.0", "lock"]
            .map(String::from)
            .into();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
