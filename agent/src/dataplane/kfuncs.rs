//! Resolving the programs' calls to kernel functions (kfuncs: conntrack's
//! `bpf_skb_ct_lookup`, `bpf_ct_release`, `bpf_ct_change_timeout`) and the
//! field offsets they need, against the running kernel's BTF.
//!
//! The eBPF object calls the kfuncs as external functions: each call is an
//! instruction with a relocation against an undefined symbol. The loader
//! (aya 0.14) does not resolve those, so before loading, each such call is
//! rewritten as the kernel expects a kfunc call: `src_reg` =
//! `BPF_PSEUDO_KFUNC_CALL`, `imm` = the function's BTF id in vmlinux. The
//! verifier then checks every argument against the kernel's prototype.

use std::collections::HashMap;

use anyhow::{Context as _, Result, bail};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget};

/// The kfuncs the programs call.
pub(crate) const KFUNCS: [&str; 3] = [
    "bpf_skb_ct_lookup",
    "bpf_ct_release",
    "bpf_ct_change_timeout",
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
    /// Byte offset of `status` in `struct nf_conn`.
    pub(crate) nf_conn_status: u32,
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
        let nf_conn_status = btf
            .member_offset("nf_conn", "status")
            .context("the kernel's BTF has no struct nf_conn with a status field")?;
        Ok(Self {
            kfuncs,
            nf_conn_status,
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

/// The little of BTF this needs: function ids by name, struct member
/// offsets.
struct Btf<'a> {
    types: Vec<(u32, &'a [u8])>,
    strings: &'a [u8],
}

const KIND_STRUCT: u32 = 4;
const KIND_FUNC: u32 = 12;

impl<'a> Btf<'a> {
    fn parse(raw: &'a [u8]) -> Result<Self> {
        let u32_at = |b: &[u8], o: usize| -> Result<u32> {
            Ok(u32::from_le_bytes(
                b.get(o..o + 4)
                    .context("truncated BTF")?
                    .try_into()
                    .expect("4 bytes"),
            ))
        };
        if raw.get(0..2) != Some(&[0x9f, 0xeb]) {
            bail!("not little-endian BTF");
        }
        let hdr_len = u32_at(raw, 4)? as usize;
        let (type_off, type_len) = (u32_at(raw, 8)? as usize, u32_at(raw, 12)? as usize);
        let (str_off, str_len) = (u32_at(raw, 16)? as usize, u32_at(raw, 20)? as usize);
        let types_raw = raw
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .context("truncated BTF types")?;
        let strings = raw
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .context("truncated BTF strings")?;
        // Type ids start at 1; entry i is type i + 1.
        let mut types = Vec::new();
        let mut o = 0;
        while o < types_raw.len() {
            let info = u32_at(types_raw, o + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind {
                1 => 4,             // INT
                3 => 12,            // ARRAY
                4 | 5 => 12 * vlen, // STRUCT, UNION
                6 => 8 * vlen,      // ENUM
                13 => 8 * vlen,     // FUNC_PROTO
                14 => 4,            // VAR
                15 => 12 * vlen,    // DATASEC
                17 => 4,            // DECL_TAG
                19 => 12 * vlen,    // ENUM64
                _ => 0,
            };
            let end = o + 12 + extra;
            types.push((info, types_raw.get(o..end).context("truncated BTF type")?));
            o = end;
        }
        Ok(Self { types, strings })
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        &s[..s.iter().position(|b| *b == 0).unwrap_or(s.len())]
    }

    fn name_of(&self, t: &[u8]) -> &'a [u8] {
        self.name(u32::from_le_bytes(t[0..4].try_into().expect("4 bytes")))
    }

    fn func(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|(info, t)| {
                (info >> 24) & 0x1f == KIND_FUNC && self.name_of(t) == name.as_bytes()
            })
            .map(|i| i as u32 + 1)
    }

    fn member_offset(&self, ty: &str, member: &str) -> Option<u32> {
        let (info, t) = self.types.iter().find(|(info, t)| {
            (info >> 24) & 0x1f == KIND_STRUCT && self.name_of(t) == ty.as_bytes()
        })?;
        let bitfields = info & (1 << 31) != 0;
        for m in t[12..].chunks_exact(12) {
            if self.name(u32::from_le_bytes(m[0..4].try_into().ok()?)) == member.as_bytes() {
                let off = u32::from_le_bytes(m[8..12].try_into().ok()?);
                let bits = if bitfields { off & 0xff_ffff } else { off };
                return (bits % 8 == 0).then_some(bits / 8);
            }
        }
        None
    }
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
        assert!(k.nf_conn_status > 0 && k.nf_conn_status.is_multiple_of(8));
    }
}
