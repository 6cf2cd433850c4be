//! Resolving the programs' calls to kernel functions (kfuncs: conntrack's
//! `bpf_skb_ct_lookup`, `bpf_ct_release`, `bpf_ct_change_timeout`,
//! `bpf_ct_change_status`) and the `nf_conn` field offsets the programs
//! read, against the running kernel's BTF: vmlinux's where conntrack is
//! built in, the `nf_conntrack` module's where it is a module (Debian,
//! Ubuntu, RHEL, Amazon Linux, Bottlerocket, Flatcar).
//!
//! The eBPF object calls the kfuncs as external functions: each call is an
//! instruction with a relocation against an undefined symbol. Before
//! loading, each such call is rewritten as the kernel expects a kfunc
//! call: `src_reg` = `BPF_PSEUDO_KFUNC_CALL`, `imm` = the function's BTF id,
//! `off` = where its BTF is: 0 for vmlinux, else the index in the
//! program's `fd_array` of the module's BTF (1: the loader puts it there,
//! see `programs.rs`). A module's ids are those of its *split* BTF, which
//! continue after vmlinux's. The verifier then checks every argument
//! against the kernel's prototype, and the loaded program holds a
//! reference on the module (it cannot be unloaded while the program
//! lives).

use std::{collections::HashMap, os::fd::OwnedFd, path::Path};

use anyhow::{Context as _, Result, bail};

use crate::dataplane::programs::btf::Btf;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget};

/// The module conntrack is, where it is not built in.
pub(crate) const MODULE: &str = "nf_conntrack";
/// The kfuncs the programs call.
pub(crate) const KFUNCS: [&str; 4] = [
    "bpf_skb_ct_lookup",
    "bpf_ct_release",
    "bpf_ct_change_timeout",
    "bpf_ct_change_status",
];

const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const BPF_JMP_CALL: u8 = 0x85;
/// `r0 = 0` (BPF_ALU64 | BPF_MOV | BPF_K).
const MOV_R0_0: [u8; 8] = [0xb7, 0, 0, 0, 0, 0, 0, 0];

/// An eBPF object in memory aligned for ELF parsing.
pub(crate) struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    fn copy(bytes: &[u8]) -> Self {
        let mut a = Self {
            words: vec![0u64; bytes.len().div_ceil(8)],
            len: bytes.len(),
        };
        a.bytes_mut().copy_from_slice(bytes);
        a
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialized bytes, and u8 has
        // no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

/// Where the conntrack kfuncs are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KfuncSource {
    /// The kernel's own BTF: conntrack is built in.
    Vmlinux,
    /// The BTF of module `name` (the kernel's id of it, as `bpftool btf`
    /// lists it): conntrack is a module.
    Module { name: String, btf_id: u32 },
}

impl std::fmt::Display for KfuncSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KfuncSource::Vmlinux => write!(f, "vmlinux's BTF (conntrack built in)"),
            KfuncSource::Module { name, btf_id } => {
                write!(f, "the {name} module's BTF (BTF id {btf_id})")
            }
        }
    }
}

/// What the kernel's BTF says the programs need.
#[derive(Clone, Debug)]
pub(crate) struct KernelBtf {
    /// BTF ids of the kfuncs, by name.
    pub(crate) kfuncs: HashMap<String, u32>,
    /// Byte offsets in `struct nf_conn` of what the conntrack gate reads.
    pub(crate) nf_conn: NfConnOffsets,
    /// Where the kfuncs are.
    pub(crate) source: KfuncSource,
}

/// Where the conntrack gate's fields lie in this kernel's `struct nf_conn`
/// (the programs get them as constants of the loaded object).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NfConnOffsets {
    /// `status` (8 bytes).
    pub(crate) status: u32,
    /// `timeout` (4 bytes, jiffies).
    pub(crate) timeout: u32,
    /// `proto.tcp.state` (1 byte).
    pub(crate) tcp_state: u32,
    /// `proto.tcp.seen[0].flags` and `proto.tcp.seen[1].flags` (1 byte each).
    pub(crate) tcp_flags: [u32; 2],
}

impl NfConnOffsets {
    fn read(btf: &Btf<'_>) -> Result<Self> {
        let at = |path: &[&str], size: u32| -> Result<u32> {
            let (off, ty) = btf.member_path("nf_conn", path).with_context(|| {
                format!(
                    "the kernel's BTF has no struct nf_conn with a field {}",
                    path.join(".")
                )
            })?;
            let got = btf.size_of(ty).unwrap_or(0);
            if got != size {
                bail!(
                    "nf_conn.{} has {got} bytes in this kernel, not {size}",
                    path.join(".")
                );
            }
            Ok(off)
        };
        let (seen, seen_ty) = btf
            .member_path("nf_conn", &["proto", "tcp", "seen"])
            .context("the kernel's BTF has no nf_conn.proto.tcp.seen")?;
        let (elem, n) = btf
            .array(seen_ty)
            .context("nf_conn.proto.tcp.seen is not an array")?;
        let (flags, flags_ty) = btf
            .member_in(elem, "flags")
            .context("struct ip_ct_tcp_state has no flags")?;
        let elem_size = btf.size_of(elem).context("the size of ip_ct_tcp_state")?;
        if n != 2 || btf.size_of(flags_ty) != Some(1) {
            bail!("nf_conn.proto.tcp.seen is not two states with a one-byte flags field");
        }
        Ok(Self {
            status: at(&["status"], 8)?,
            timeout: at(&["timeout"], 4)?,
            tcp_state: at(&["proto", "tcp", "state"], 1)?,
            tcp_flags: [seen + flags, seen + elem_size + flags],
        })
    }
}

impl KernelBtf {
    /// Finds the conntrack kfuncs: in vmlinux's BTF, else in the
    /// `nf_conntrack` module's (loaded first if it is not, as conntrack's
    /// first use would). Fails, saying why, where they cannot be had.
    pub(crate) fn read() -> Result<Self> {
        Self::read_at(Path::new("/sys"))
    }

    /// [`KernelBtf::read`] with sysfs at `sys` (a test's own tree).
    fn read_at(sys: &Path) -> Result<Self> {
        let path = sys.join("kernel/btf/vmlinux");
        let raw = std::fs::read(&path)
            .with_context(|| format!("reading the kernel's BTF ({})", path.display()))?;
        let vmlinux = Btf::parse(&raw)?;
        if KFUNCS.iter().all(|f| vmlinux.func(f).is_some()) {
            return Self::from_btf(&vmlinux, KfuncSource::Vmlinux);
        }
        // Conntrack is a module (or absent).
        load_module(sys)?;
        let path = sys.join("kernel/btf").join(MODULE);
        let module_raw = std::fs::read(&path).map_err(|e| {
            anyhow::anyhow!(
                "the {MODULE} module is loaded but its BTF cannot be read ({}: {e}): the kernel was built without CONFIG_DEBUG_INFO_BTF_MODULES",
                path.display()
            )
        })?;
        let module = Btf::parse_split(&module_raw, &vmlinux)
            .with_context(|| format!("parsing {}", path.display()))?;
        let mut k = Self::from_btf(
            &module,
            KfuncSource::Module {
                name: MODULE.to_string(),
                btf_id: 0,
            },
        )?;
        let btf_id = crate::sys::bpf::kernel_btf(MODULE)
            .context("looking for the module's BTF among the kernel's")?
            .with_context(|| format!("the kernel lists no BTF object named {MODULE}"))?
            .id;
        k.source = KfuncSource::Module {
            name: MODULE.to_string(),
            btf_id,
        };
        Ok(k)
    }

    fn from_btf(btf: &Btf<'_>, source: KfuncSource) -> Result<Self> {
        let mut kfuncs = HashMap::new();
        for f in KFUNCS {
            let id = btf.func(f).with_context(|| {
                let whose = match &source {
                    KfuncSource::Vmlinux => "vmlinux's BTF".to_string(),
                    KfuncSource::Module { name, .. } => format!("the {name} module's BTF"),
                };
                format!("the kernel has no kfunc {f} in {whose} (Linux 6.0 or later has them)")
            })?;
            kfuncs.insert(f.to_string(), id);
        }
        Ok(Self {
            kfuncs,
            nf_conn: NfConnOffsets::read(btf)?,
            source,
        })
    }

    /// The BTF object a program's `fd_array` must hold at index 1 for
    /// these kfuncs: None for vmlinux, the module's, opened now.
    pub(crate) fn open_module(&self) -> Result<Option<OwnedFd>> {
        match &self.source {
            KfuncSource::Vmlinux => Ok(None),
            KfuncSource::Module { name, .. } => {
                let o = crate::sys::bpf::kernel_btf(name)
                    .context("opening the module's BTF")?
                    .with_context(|| {
                        format!("the {name} module's BTF is gone (was it unloaded?)")
                    })?;
                Ok(Some(o.fd))
            }
        }
    }
}

/// Loads conntrack's module, as the kernel does on conntrack's first use:
/// a ctnetlink request makes the kernel load `nf_conntrack_netlink`, and
/// with it `nf_conntrack` (this works from a container, where no modprobe
/// is; a host's modprobe is tried after). Fails, saying why, where the
/// module cannot be had.
fn load_module(sys: &Path) -> Result<()> {
    let loaded = || sys.join("module").join(MODULE).exists();
    if loaded() {
        return Ok(());
    }
    crate::dataplane::conntrack::poke_ctnetlink();
    if !loaded() && Path::new("/sbin/modprobe").exists() {
        let _ = std::process::Command::new("/sbin/modprobe")
            .arg(MODULE)
            .output();
    }
    if !loaded() {
        bail!(
            "conntrack is neither built into the kernel nor a module it loads ({MODULE}): the kernel was built without CONFIG_NF_CONNTRACK, or its modules are not installed"
        );
    }
    Ok(())
}

/// `object` with every call to a kfunc rewritten: as a kfunc call of the
/// running kernel, or, without `btf` (a kernel without the conntrack
/// kfuncs), as `r0 = 0` (the lookup finds nothing, so the conntrack gate
/// lets no flow bypass the stack).
pub(crate) fn resolve(object: &[u8], btf: Option<&KernelBtf>) -> Result<Aligned> {
    let file = object::File::parse(object).context("parsing the eBPF object")?;
    let mut out = Aligned::copy(object);
    let mut patched = 0;
    for section in file.sections() {
        let Some((sec_off, _)) = section.file_range() else {
            continue;
        };
        for (off, rel) in section.relocations() {
            let RelocationTarget::Symbol(idx) = rel.target() else {
                continue;
            };
            let sym = file.symbol_by_index(idx)?;
            let name = sym.name()?;
            if !KFUNCS.contains(&name) {
                continue;
            }
            let at = (sec_off + off) as usize;
            let insn = out
                .bytes_mut()
                .get_mut(at..at + 8)
                .with_context(|| format!("a relocation of {name} outside its section"))?;
            if insn[0] != BPF_JMP_CALL {
                bail!("the relocation of {name} is not on a call instruction");
            }
            match btf.and_then(|b| Some((b.kfuncs.get(name)?, &b.source))) {
                Some((id, source)) => {
                    // The module's BTF is the program's fd_array[1].
                    let off: i16 = match source {
                        KfuncSource::Vmlinux => 0,
                        KfuncSource::Module { .. } => 1,
                    };
                    insn[1] = BPF_PSEUDO_KFUNC_CALL << 4;
                    insn[2..4].copy_from_slice(&off.to_le_bytes());
                    insn[4..8].copy_from_slice(&(*id as i32).to_le_bytes());
                }
                None => insn.copy_from_slice(&MOV_R0_0),
            }
            patched += 1;
        }
    }
    tracing::debug!(calls = patched, "resolved the kfunc calls");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

    /// A sysfs of a kernel whose vmlinux BTF has no conntrack kfuncs (an
    /// empty BTF: a header and one empty string), with conntrack's module
    /// loaded or not, with its BTF or not.
    fn fake_sys(module_loaded: bool, module_btf: bool) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "weft-sys-{}-{module_loaded}-{module_btf}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("kernel/btf")).unwrap();
        let mut btf = vec![0x9f, 0xeb, 1, 0];
        for v in [24u32, 0, 0, 0, 1] {
            btf.extend(v.to_le_bytes());
        }
        btf.push(0);
        std::fs::write(root.join("kernel/btf/vmlinux"), &btf).unwrap();
        if module_loaded {
            std::fs::create_dir_all(root.join("module").join(MODULE)).unwrap();
        }
        if module_btf {
            std::fs::write(root.join("kernel/btf").join(MODULE), &btf).unwrap();
        }
        root
    }

    #[test]
    fn a_kernel_without_module_btf_or_conntrack_is_told_apart() {
        let no_btf = fake_sys(true, false);
        let e = format!("{:#}", KernelBtf::read_at(&no_btf).unwrap_err());
        assert!(
            e.contains("module is loaded but its BTF cannot be read")
                && e.contains("CONFIG_DEBUG_INFO_BTF_MODULES"),
            "{e}"
        );
        let none = fake_sys(false, false);
        let e = format!("{:#}", KernelBtf::read_at(&none).unwrap_err());
        assert!(
            e.contains("neither built into the kernel nor a module"),
            "{e}"
        );
        // The module's BTF without the kfuncs (a kernel before 6.0).
        let old = fake_sys(true, true);
        let e = format!("{:#}", KernelBtf::read_at(&old).unwrap_err());
        assert!(e.contains("has no kfunc bpf_skb_ct_lookup"), "{e}");
        for d in [no_btf, none, old] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// The kernel this runs on has the conntrack kfuncs, in vmlinux or in
    /// the module (the tests need them, and so does `--host-routing
    /// auto`).
    #[test]
    fn reads_this_kernels_btf() {
        let k = KernelBtf::read().unwrap();
        let module = std::path::Path::new("/sys/kernel/btf")
            .join(MODULE)
            .exists();
        assert_eq!(
            matches!(k.source, KfuncSource::Module { .. }),
            module,
            "{:?}",
            k.source
        );
        if let KfuncSource::Module { .. } = k.source {
            // Split BTF: the module's ids continue after vmlinux's.
            let raw = std::fs::read(VMLINUX).unwrap();
            let n = Btf::parse(&raw).unwrap();
            assert!(
                k.kfuncs
                    .values()
                    .all(|id| n.func("bpf_skb_ct_lookup").is_none() && *id > 1000)
            );
            assert!(k.open_module().unwrap().is_some());
        }
        assert_eq!(k.kfuncs.len(), KFUNCS.len());
        assert!(k.kfuncs.values().all(|id| *id > 0));
        let o = k.nf_conn;
        assert!(o.status > 0 && o.status.is_multiple_of(8), "{o:?}");
        assert!(o.timeout > 0 && o.timeout.is_multiple_of(4), "{o:?}");
        // proto.tcp: seen[0] (20 bytes: four u32s, td_scale, flags), seen[1],
        // then state.
        assert_eq!(o.tcp_flags[1] - o.tcp_flags[0], 20, "{o:?}");
        assert_eq!(o.tcp_state, o.tcp_flags[1] + 3, "{o:?}");
    }
}
