//! The `bpf(2)` system call, for what aya 0.14 does not do: loading a
//! program with an `fd_array` (kfuncs of a kernel module), loading tiny
//! probe programs and reading the verifier's words, creating a map only to
//! see whether the kernel has its type, running a program once on a frame,
//! walking the kernel's BTF objects, netkit links, pins.
//!
//! Every `unsafe` the agent needs for `bpf(2)` is here. Callers pass and get
//! plain Rust values; each command fills a zeroed `union bpf_attr` at the
//! offsets of its uapi struct (the kernel refuses non-zero bytes it does
//! not know, so what is left out is what an older kernel lacks).

use std::{
    ffi::{CStr, CString},
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

/// `enum bpf_cmd` values used here.
const BPF_MAP_CREATE: i64 = 0;
const BPF_PROG_LOAD: i64 = 5;
const BPF_OBJ_PIN: i64 = 6;
const BPF_OBJ_GET: i64 = 7;
const BPF_PROG_TEST_RUN: i64 = 10;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
pub(crate) const BPF_PROG_QUERY: i64 = 16;
const BPF_BTF_GET_FD_BY_ID: i64 = 19;
const BPF_BTF_GET_NEXT_ID: i64 = 23;
pub(crate) const BPF_LINK_CREATE: i64 = 28;
pub(crate) const BPF_LINK_UPDATE: i64 = 29;

/// `enum bpf_prog_type` values Weft loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ProgType {
    /// `BPF_PROG_TYPE_SCHED_CLS` (TC, TCX and netkit programs).
    SchedCls,
    /// `BPF_PROG_TYPE_XDP`.
    Xdp,
}

impl ProgType {
    fn raw(self) -> u32 {
        match self {
            ProgType::SchedCls => 3,
            ProgType::Xdp => 6,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProgType::SchedCls => "TC",
            ProgType::Xdp => "XDP",
        }
    }
}

/// `union bpf_attr`, as a zeroed buffer the size every command here fits
/// in (128 bytes reach `prog_load`'s `fd_array`).
#[repr(C, align(8))]
pub(crate) struct Attr([u8; 128]);

impl Attr {
    pub(crate) fn new() -> Self {
        Self([0; 128])
    }

    pub(crate) fn put_u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    pub(crate) fn put_u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }

    pub(crate) fn u32_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }
}

/// Runs `bpf(cmd, attr)`.
pub(crate) fn bpf(cmd: i64, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a valid, writable buffer of the size passed; the
    // pointers inside it (set by the callers) point at memory that outlives
    // the call and is as large as the sizes beside them say.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<Attr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The descriptor the kernel just returned.
pub(crate) fn owned(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this new descriptor to us, and
    // nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// One eBPF instruction as the kernel reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Insn {
    pub(crate) code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    pub(crate) regs: u8,
    pub(crate) off: i16,
    pub(crate) imm: i32,
}

impl Insn {
    pub(crate) const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Self {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        }
    }
}

/// What `BPF_PROG_LOAD` gets.
pub(crate) struct ProgLoad<'a> {
    pub(crate) ty: ProgType,
    pub(crate) insns: &'a [Insn],
    /// Shown by `bpftool prog` (15 bytes kept).
    pub(crate) name: &'a str,
    /// The program's license (kfuncs and many helpers want one compatible
    /// with the GPL).
    pub(crate) license: &'a CStr,
    /// BTF objects the program's kfunc calls name by index (`off`); slot 0
    /// is never read (0 means vmlinux), so the first BTF goes at index 1.
    pub(crate) fd_array: &'a [i32],
}

impl<'a> ProgLoad<'a> {
    /// A probe: a GPL program of type `ty`.
    pub(crate) fn probe(ty: ProgType, insns: &'a [Insn], fd_array: &'a [i32]) -> Self {
        Self {
            ty,
            insns,
            name: "weft_probe",
            license: c"GPL",
            fd_array,
        }
    }
}

/// A refused load: the error and the verifier's last lines.
#[derive(Debug)]
pub(crate) struct LoadError {
    pub(crate) error: io::Error,
    pub(crate) log: String,
}

impl LoadError {
    /// The verifier's line that says why (the last non-empty one before
    /// its statistics), or the error's words.
    pub(crate) fn reason(&self) -> String {
        self.log
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| {
                !l.is_empty()
                    && !l.starts_with("verification time")
                    && !l.starts_with("processed ")
                    && !l.starts_with("stack depth")
            })
            .map_or_else(|| self.error.to_string(), str::to_string)
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.reason(), self.error)
    }
}

impl std::error::Error for LoadError {}

/// Loads a program. A small one (a probe) is loaded with the verifier's
/// log on; a large one without (its log would overflow any buffer), and
/// only if the kernel refuses it again with the log, for the reason.
pub(crate) fn prog_load(p: &ProgLoad<'_>) -> Result<OwnedFd, LoadError> {
    const SMALL: usize = 256;
    if p.insns.len() > SMALL
        && let Ok(fd) = prog_load_with_log(p, 0)
    {
        return Ok(fd);
    }
    prog_load_with_log(p, 1)
}

fn prog_load_with_log(p: &ProgLoad<'_>, log_level: u32) -> Result<OwnedFd, LoadError> {
    // The kernel keeps the log's tail when it is longer (Linux 6.4).
    let mut log = vec![0u8; if log_level > 0 { 1 << 20 } else { 0 }];
    let mut name = [0u8; 16];
    for (d, s) in name.iter_mut().zip(p.name.bytes().take(15)) {
        *d = s;
    }
    let mut a = Attr::new();
    a.put_u32(0, p.ty.raw())
        .put_u32(4, p.insns.len() as u32)
        .put_u64(8, p.insns.as_ptr() as u64)
        .put_u64(16, p.license.as_ptr() as u64);
    if log_level > 0 {
        a.put_u32(24, log_level)
            .put_u32(28, log.len() as u32)
            .put_u64(32, log.as_mut_ptr() as u64);
    }
    a.0[48..64].copy_from_slice(&name);
    if !p.fd_array.is_empty() {
        // `fd_array_cnt` (6.14) stays 0: with it every slot would have to
        // be a valid map or BTF descriptor, slot 0 included.
        a.put_u64(120, p.fd_array.as_ptr() as u64);
    }
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(owned(fd)),
        Err(error) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            Err(LoadError {
                error,
                log: String::from_utf8_lossy(&log[..end]).into_owned(),
            })
        }
    }
}

/// What `BPF_MAP_CREATE` gets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MapCreate {
    pub(crate) ty: u32,
    pub(crate) key_size: u32,
    pub(crate) value_size: u32,
    pub(crate) max_entries: u32,
    pub(crate) flags: u32,
}

/// Creates a map (unnamed, without BTF).
pub(crate) fn map_create(m: &MapCreate) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.put_u32(0, m.ty)
        .put_u32(4, m.key_size)
        .put_u32(8, m.value_size)
        .put_u32(12, m.max_entries)
        .put_u32(16, m.flags);
    bpf(BPF_MAP_CREATE, &mut a).map(owned)
}

/// Runs the program once on `data` (`BPF_PROG_TEST_RUN`): its return
/// value and the frame it left (room for `grow` more bytes than it got).
pub(crate) fn test_run(
    prog: BorrowedFd<'_>,
    data: &[u8],
    grow: usize,
) -> io::Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; data.len() + grow];
    let mut a = Attr::new();
    a.put_u32(0, prog.as_raw_fd() as u32)
        .put_u32(8, data.len() as u32)
        .put_u32(12, out.len() as u32)
        .put_u64(16, data.as_ptr() as u64)
        .put_u64(24, out.as_mut_ptr() as u64)
        .put_u32(32, 1);
    bpf(BPF_PROG_TEST_RUN, &mut a)?;
    out.truncate((a.u32_at(12) as usize).min(out.len()));
    Ok((a.u32_at(4), out))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// Pins `fd` (a program, map or link) at `path` on a bpf file system.
pub(crate) fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let p = c_path(path)?;
    let mut a = Attr::new();
    a.put_u64(0, p.as_ptr() as u64)
        .put_u32(8, fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut a).map(|_| ())
}

/// Opens what is pinned at `path`; None if nothing is.
pub(crate) fn open_pin(path: &Path) -> io::Result<Option<OwnedFd>> {
    let p = c_path(path)?;
    let mut a = Attr::new();
    a.put_u64(0, p.as_ptr() as u64);
    match bpf(BPF_OBJ_GET, &mut a) {
        Ok(fd) => Ok(Some(owned(fd))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A BTF object the kernel holds: vmlinux's, a module's, or a program's.
#[derive(Debug)]
pub(crate) struct BtfObject {
    pub(crate) id: u32,
    pub(crate) fd: OwnedFd,
}

/// The kernel's BTF object named `name` (a module's name, or "vmlinux"),
/// opened; None if the kernel holds none of that name (the module is not
/// loaded, or was built without BTF).
pub(crate) fn kernel_btf(name: &str) -> io::Result<Option<BtfObject>> {
    let mut id = 0u32;
    loop {
        let mut a = Attr::new();
        a.put_u32(0, id);
        match bpf(BPF_BTF_GET_NEXT_ID, &mut a) {
            Ok(_) => id = a.u32_at(4),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut a = Attr::new();
        a.put_u32(0, id);
        let fd = match bpf(BPF_BTF_GET_FD_BY_ID, &mut a) {
            Ok(fd) => owned(fd),
            // Gone between the two calls.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let (got, kernel) = btf_info(fd.as_fd())?;
        if kernel && got == name {
            return Ok(Some(BtfObject { id, fd }));
        }
    }
}

/// The name of the BTF object `fd` and whether it is the kernel's own.
fn btf_info(fd: BorrowedFd<'_>) -> io::Result<(String, bool)> {
    let mut name = [0u8; 64];
    // struct bpf_btf_info: btf, btf_size, id, name, name_len, kernel_btf.
    let mut info = [0u8; 32];
    info[16..24].copy_from_slice(&(name.as_mut_ptr() as u64).to_ne_bytes());
    info[24..28].copy_from_slice(&(name.len() as u32).to_ne_bytes());
    let mut a = Attr::new();
    a.put_u32(0, fd.as_raw_fd() as u32)
        .put_u32(4, info.len() as u32)
        .put_u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let kernel = u32::from_ne_bytes(info[28..32].try_into().expect("4 bytes")) != 0;
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Ok((String::from_utf8_lossy(&name[..end]).into_owned(), kernel))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT: Insn = Insn::new(0x95, 0, 0, 0, 0);
    const MOV_R0_2: Insn = Insn::new(0xb7, 0, 0, 0, 2);

    #[test]
    fn loads_and_runs_a_tiny_program() {
        let fd = prog_load(&ProgLoad::probe(ProgType::Xdp, &[MOV_R0_2, EXIT], &[]))
            .expect("a two-instruction XDP program loads");
        let (ret, frame) = test_run(fd.as_fd(), &[7u8; 64], 0).unwrap();
        assert_eq!((ret, frame), (2, vec![7u8; 64]));
    }

    #[test]
    fn a_refusal_carries_the_verifiers_words() {
        // r0 is never set.
        let e = prog_load(&ProgLoad::probe(ProgType::SchedCls, &[EXIT], &[])).expect_err("refused");
        assert!(e.reason().contains("R0 !read_ok"), "{e}");
    }

    #[test]
    fn finds_vmlinux_btf_and_not_a_module_that_does_not_exist() {
        let v = kernel_btf("vmlinux").unwrap().expect("vmlinux BTF");
        assert!(v.id > 0);
        assert!(kernel_btf("weft_no_such_module").unwrap().is_none());
    }
}
