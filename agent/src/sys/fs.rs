//! Filesystems, mounts and the kernel's name: `statfs(2)`, `mount(2)` of a
//! bpffs, `uname(2)`, and which mount namespace a process is in.

use std::{
    ffi::CString,
    io,
    os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Whether `path` lies on a bpf filesystem.
pub(crate) fn is_bpffs(path: &Path) -> Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statfs is plain old data; all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a valid, writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

/// Mounts a bpf filesystem at `path`.
pub(crate) fn mount_bpffs(path: &Path) -> Result<()> {
    let target = CString::new(path.as_os_str().as_bytes())?;
    let fstype = CString::new("bpf")?;
    // SAFETY: plain mount(2) with valid C strings.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EPERM) {
            bail!(
                "mounting a bpf filesystem at {} was refused: the agent needs root (or CAP_SYS_ADMIN), or mount one there first (`mount -t bpf bpf {}`)",
                path.display(),
                path.display()
            );
        }
        return Err(err)
            .with_context(|| format!("mounting a bpf filesystem at {}", path.display()));
    }
    Ok(())
}

/// The running kernel's release (`uname -r`), if uname answers.
pub(crate) fn kernel_release() -> Option<String> {
    // SAFETY: utsname is plain old data; all zeroes is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: uname NUL-terminates release, within the array.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    Some(release.to_string_lossy().into_owned())
}

/// The mount namespace process `pid` is in (its inode number), if its
/// `/proc` entry can be read.
pub(crate) fn mount_namespace(pid: u32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|m| m.ino())
}

/// A process whose mounts are the host's: PID 1, or where PID 1 keeps its
/// namespaces to itself (some inits do), kthreadd (PID 2): kernel threads
/// live in the initial mount namespace. None inside a PID namespace of its
/// own (a container without the host's PIDs), where neither is to be seen.
pub(crate) fn host_pid() -> Option<u32> {
    if mount_namespace(1).is_some() {
        return Some(1);
    }
    let comm = std::fs::read_to_string("/proc/2/comm").ok()?;
    (comm.trim() == "kthreadd" && mount_namespace(2).is_some()).then_some(2)
}

/// The filesystem `path` is on, as process `pid` sees it (through
/// `/proc/<pid>/root`): its device number, which names one instance of a
/// filesystem (one bpffs mount, and every bind of it).
pub(crate) fn filesystem_seen_by(pid: u32, path: &Path) -> Option<u64> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    std::fs::metadata(Path::new(&format!("/proc/{pid}/root")).join(relative))
        .ok()
        .map(|m| m.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_and_namespaces_answer() {
        let release = kernel_release().unwrap();
        assert!(
            release.starts_with(|c: char| c.is_ascii_digit()),
            "{release}"
        );
        let me = mount_namespace(std::process::id()).unwrap();
        assert_eq!(
            std::fs::read_link("/proc/self/ns/mnt").unwrap(),
            Path::new(&format!("mnt:[{me}]"))
        );
        assert_eq!(mount_namespace(u32::MAX), None);
        // The tests run on the host, in its mount namespace.
        let host = host_pid().unwrap();
        assert_eq!(mount_namespace(host), Some(me));
        assert_eq!(
            filesystem_seen_by(host, Path::new("/proc")),
            filesystem_seen_by(std::process::id(), Path::new("/proc"))
        );
        assert_ne!(
            filesystem_seen_by(host, Path::new("/proc")),
            filesystem_seen_by(host, Path::new("/"))
        );
        assert!(!is_bpffs(Path::new("/proc")).unwrap());
        assert!(is_bpffs(Path::new("/nonexistent/weft")).is_err());
    }
}
