//! Resolving the programs' calls to kernel functions (kfuncs: conntrack's
//! `bpf_skb_ct_lookup`, `bpf_ct_release`, `bpf_ct_change_timeout`,
//! `bpf_ct_change_status`) and the `nf_conn` field offsets the programs
//! read, against the running kernel's BTF.
//!
//! The eBPF object calls the kfuncs as external functions: each call is an
//! instruction with a relocation against an undefined symbol. The loader
//! (aya 0.14) does not resolve those, so before loading, each such call is
//! rewritten as the kernel expects a kfunc call: `src_reg` =
//! `BPF_PSEUDO_KFUNC_CALL`, `imm` = the function's BTF id in vmlinux. The
//! verifier then checks every argument against the kernel's prototype.

use std::collections::HashMap;

use anyhow::{Context as _, Result, bail};

use super::btf::Btf;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget};

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

/// What the kernel's BTF says the programs need.
#[derive(Clone, Debug)]
pub(crate) struct KernelBtf {
    /// BTF ids of the kfuncs, by name.
    pub(crate) kfuncs: HashMap<String, u32>,
    /// Byte offsets in `struct nf_conn` of what the conntrack gate reads.
    pub(crate) nf_conn: NfConnOffsets,
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
    /// Reads `/sys/kernel/btf/vmlinux`. Fails (with why) when the kernel
    /// has no conntrack kfuncs.
    pub(crate) fn read() -> Result<Self> {
        let raw = std::fs::read("/sys/kernel/btf/vmlinux")
            .context("reading the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
        let btf = Btf::parse(&raw)?;
        let mut kfuncs = HashMap::new();
        for f in KFUNCS {
            let id = btf.func(f).with_context(|| {
                format!("the kernel has no kfunc {f} (conntrack built into the kernel, Linux 6.0 or later)")
            })?;
            kfuncs.insert(f.to_string(), id);
        }
        Ok(Self {
            kfuncs,
            nf_conn: NfConnOffsets::read(&btf)?,
        })
    }
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
            match btf.and_then(|b| b.kfuncs.get(name)) {
                Some(id) => {
                    insn[1] = BPF_PSEUDO_KFUNC_CALL << 4;
                    insn[2..4].copy_from_slice(&0i16.to_le_bytes());
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

    /// The kernel this runs on has the conntrack kfuncs (the tests need
    /// them, and so does `--host-routing auto`).
    #[test]
    fn reads_this_kernels_btf() {
        let k = KernelBtf::read().unwrap();
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
