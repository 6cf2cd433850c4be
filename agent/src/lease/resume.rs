//! What a restarted agent resumes from instead of a full list: every lease
//! it knew, the revision they are at, the etcd cluster they came from, and
//! the key it held, kept in `<state-dir>/leases.json` (written every 30 s
//! while something changed, and at a stop).
//!
//! The file is the agent's own, but it is read as untrusted as etcd is:
//! every lease in it goes through the same parse as a listing's, and it is
//! used only where etcd still holds its revision and is the cluster it
//! names (see [`super::watch`]); anything else (no file, a torn or foreign
//! one, another cluster, a compacted revision) means a list, as at a first
//! start. Nothing in it decides what subnet this node holds: the key it
//! names is adopted only as etcd holds it, unchanged (see
//! [`super::holder`]), or acquired the fenced way.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{
    acquire::HeldLease,
    cache::{Lease, Snapshot, parse_lease},
    store::KeyValue,
};

/// The key this node held at its last stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeptHeld {
    pub(crate) key: String,
    /// Its etcd lease (0: a reservation).
    pub(crate) lease_id: i64,
    pub(crate) create_revision: i64,
}

impl KeptHeld {
    pub(crate) fn of(h: &HeldLease) -> Self {
        Self {
            key: h.key.clone(),
            lease_id: h.lease_id,
            create_revision: h.create_revision,
        }
    }
}

/// What a restart finds kept.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) leases: Snapshot,
    pub(crate) held: Option<KeptHeld>,
}

/// The file's name in the state directory.
pub(crate) const FILE: &str = "leases.json";

/// The format's version: a file of another is not read.
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct File {
    format: u32,
    prefix: String,
    cluster: u64,
    revision: i64,
    held: Option<KeptHeld>,
    leases: Vec<KeptLease>,
}

#[derive(Serialize, Deserialize)]
struct KeptLease {
    key: String,
    value: String,
    lease: i64,
    create_revision: i64,
    mod_revision: i64,
}

/// Where the leases are kept.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Writes the leases known at `revision` (atomically: a temporary file,
/// then a rename).
pub(crate) fn save<'a>(
    file: &Path,
    prefix: &str,
    cluster: u64,
    revision: i64,
    held: Option<&HeldLease>,
    leases: impl Iterator<Item = &'a Lease>,
) -> std::io::Result<()> {
    let kept = File {
        format: FORMAT,
        prefix: prefix.to_string(),
        cluster,
        revision,
        held: held.map(KeptHeld::of),
        leases: leases
            .map(|l| KeptLease {
                key: l.key.clone(),
                value: l.attrs.to_json(),
                lease: l.lease_id,
                create_revision: l.create_revision,
                mod_revision: l.mod_revision,
            })
            .collect(),
    };
    let tmp = file.with_extension("json.tmp");
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer(&mut f, &kept)?;
        f.flush()?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// The leases kept under `prefix`, if the file holds a usable set; why
/// not otherwise (None: no file).
pub(crate) fn load(file: &Path, prefix: &str) -> Result<Option<Kept>, String> {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading {}: {e}", file.display())),
    };
    let kept: File = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not a set of kept leases: {e}", file.display()))?;
    if kept.format != FORMAT {
        return Err(format!(
            "{} has format {} (this agent reads {FORMAT})",
            file.display(),
            kept.format
        ));
    }
    if kept.prefix != prefix {
        return Err(format!(
            "{} holds the leases of {} (this agent follows {prefix})",
            file.display(),
            kept.prefix
        ));
    }
    if kept.revision <= 0 {
        return Err(format!("{} names no revision", file.display()));
    }
    let mut leases = Vec::with_capacity(kept.leases.len());
    for l in kept.leases {
        let kv = KeyValue {
            key: l.key,
            value: l.value.into_bytes(),
            create_revision: l.create_revision,
            mod_revision: l.mod_revision,
            version: 1,
            lease: l.lease,
        };
        match parse_lease(prefix, &kv) {
            Ok(lease) if lease.mod_revision <= kept.revision => leases.push(lease),
            Ok(_) => {
                return Err(format!(
                    "{}: {} is newer than the file",
                    file.display(),
                    kv.key
                ));
            }
            Err(why) => return Err(format!("{}: {}: {why}", file.display(), kv.key)),
        }
    }
    Ok(Some(Kept {
        leases: Snapshot {
            revision: kept.revision,
            cluster: kept.cluster,
            leases,
            skipped: Default::default(),
        },
        held: kept.held,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u8, rev: i64) -> Lease {
        let kv = KeyValue {
            key: format!("/p/subnets/10.5.{n}.0-24"),
            value: format!(r#"{{"PublicIP":"198.18.0.{n}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:00:0{n}"}}}}"#).into_bytes(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 7,
        };
        parse_lease("/p/subnets/", &kv).unwrap()
    }

    #[test]
    fn kept_leases_come_back_as_they_were_and_anything_odd_is_refused() {
        let dir = std::env::temp_dir().join(format!("weft-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = path(&dir);
        assert_eq!(load(&f, "/p/subnets/"), Ok(None));
        let leases = [lease(1, 3), lease(2, 5)];
        save(&f, "/p/subnets/", 0xabc, 9, None, leases.iter()).unwrap();
        let k = load(&f, "/p/subnets/").unwrap().unwrap();
        assert_eq!(k.held, None);
        let s = k.leases;
        assert_eq!((s.revision, s.cluster), (9, 0xabc));
        assert_eq!(s.leases.len(), 2);
        assert!(s.leases.iter().all(|l| leases.contains(l)));

        assert!(load(&f, "/q/subnets/").unwrap_err().contains("/q/subnets/"));
        std::fs::write(&f, b"{\"format\":1,\"prefix\":").unwrap();
        assert!(load(&f, "/p/subnets/").is_err(), "a torn file");
        save(&f, "/p/subnets/", 1, 4, None, leases.iter()).unwrap();
        assert!(
            load(&f, "/p/subnets/").unwrap_err().contains("newer"),
            "a lease newer than the revision named"
        );
        let text = std::fs::read_to_string(&f)
            .unwrap()
            .replace("198.18.0.1", "banana");
        std::fs::write(&f, text).unwrap();
        assert!(
            load(&f, "/p/subnets/").is_err(),
            "a lease that does not parse"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
