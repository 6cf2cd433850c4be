//! The little of BTF, the kernel's type information, that the loader and
//! the kernel check read: functions by name, struct member offsets, enum
//! values. Parsed from `/sys/kernel/btf/vmlinux`, and from a module's
//! (`/sys/kernel/btf/<module>`), which is *split* BTF: its type ids
//! continue after vmlinux's last one and its string offsets after
//! vmlinux's strings, and its types refer to vmlinux's by their ids.

use anyhow::{Context as _, Result, bail};

/// The little of BTF this needs: function ids by name, struct member
/// offsets.
pub(crate) struct Btf<'a> {
    types: Vec<(u32, &'a [u8])>,
    strings: &'a [u8],
    /// vmlinux's BTF, for a module's (split) BTF.
    base: Option<&'a Btf<'a>>,
}

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

impl<'a> Btf<'a> {
    /// Parses vmlinux's BTF (or any BTF that stands alone).
    pub(crate) fn parse(raw: &'a [u8]) -> Result<Self> {
        Self::parse_on(raw, None)
    }

    /// Parses a module's BTF, split from vmlinux's `base`.
    pub(crate) fn parse_split(raw: &'a [u8], base: &'a Btf<'a>) -> Result<Self> {
        Self::parse_on(raw, Some(base))
    }

    /// The first type id of this BTF (1, or after the base's last).
    fn first_id(&self) -> u32 {
        self.base.map_or(1, |b| b.first_id() + b.types.len() as u32)
    }

    /// The length of the string sections before this BTF's own.
    fn string_base(&self) -> usize {
        self.base.map_or(0, |b| b.string_base() + b.strings.len())
    }

    fn parse_on(raw: &'a [u8], base: Option<&'a Btf<'a>>) -> Result<Self> {
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
        Ok(Self {
            types,
            strings,
            base,
        })
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let own = self.string_base();
        if (off as usize) < own {
            return self.base.map_or(&[][..], |b| b.name(off));
        }
        let s = self.strings.get(off as usize - own..).unwrap_or_default();
        &s[..s.iter().position(|b| *b == 0).unwrap_or(s.len())]
    }

    /// Type `id`'s info word and bytes, in this BTF or its base.
    fn get(&self, id: u32) -> Option<(u32, &'a [u8])> {
        let first = self.first_id();
        if id < first {
            return self.base?.get(id);
        }
        self.types.get((id - first) as usize).copied()
    }

    fn name_of(&self, t: &[u8]) -> &'a [u8] {
        self.name(u32::from_le_bytes(t[0..4].try_into().expect("4 bytes")))
    }

    /// The id of function `name` among this BTF's own types (a module's
    /// functions are in its own BTF, not in vmlinux's).
    pub(crate) fn func(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|(info, t)| {
                (info >> 24) & 0x1f == KIND_FUNC && self.name_of(t) == name.as_bytes()
            })
            .map(|i| i as u32 + self.first_id())
    }

    fn kind(info: u32) -> u32 {
        (info >> 24) & 0x1f
    }

    /// Type `id` (ids start at 1), with typedefs and qualifiers skipped.
    fn resolve(&self, mut id: u32) -> Option<(u32, &'a [u8])> {
        for _ in 0..32 {
            let (info, t) = self.get(id)?;
            match Self::kind(info) {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = u32::from_le_bytes(t[8..12].try_into().ok()?);
                }
                _ => return Some((id, t)),
            }
        }
        None
    }

    /// The size in bytes of type `id`.
    pub(crate) fn size_of(&self, id: u32) -> Option<u32> {
        let (id, t) = self.resolve(id)?;
        let info = self.get(id)?.0;
        match Self::kind(info) {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM => {
                Some(u32::from_le_bytes(t[8..12].try_into().ok()?))
            }
            KIND_ARRAY => {
                let (elem, n) = self.array(id)?;
                Some(self.size_of(elem)? * n)
            }
            _ => None,
        }
    }

    /// The element type and length of array type `id`.
    pub(crate) fn array(&self, id: u32) -> Option<(u32, u32)> {
        let (id, t) = self.resolve(id)?;
        let info = self.get(id)?.0;
        if Self::kind(info) != KIND_ARRAY {
            return None;
        }
        let elem = u32::from_le_bytes(t[12..16].try_into().ok()?);
        let n = u32::from_le_bytes(t[20..24].try_into().ok()?);
        Some((elem, n))
    }

    /// The byte offset and type of `member` in struct or union type `id`.
    pub(crate) fn member_in(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        let (id, t) = self.resolve(id)?;
        let info = self.get(id)?.0;
        if !matches!(Self::kind(info), KIND_STRUCT | KIND_UNION) {
            return None;
        }
        let bitfields = info & (1 << 31) != 0;
        for m in t[12..].chunks_exact(12) {
            if self.name(u32::from_le_bytes(m[0..4].try_into().ok()?)) == member.as_bytes() {
                let ty = u32::from_le_bytes(m[4..8].try_into().ok()?);
                let off = u32::from_le_bytes(m[8..12].try_into().ok()?);
                let bits = if bitfields { off & 0xff_ffff } else { off };
                return (bits % 8 == 0).then_some((bits / 8, ty));
            }
        }
        None
    }

    /// The byte offset and type of `path` (members, outermost first) in
    /// struct `ty`.
    pub(crate) fn member_path(&self, ty: &str, path: &[&str]) -> Option<(u32, u32)> {
        let root = self.struct_named(ty)?;
        let (mut off, mut id) = (0, root);
        for m in path {
            let (o, t) = self.member_in(id, m)?;
            off += o;
            id = t;
        }
        Some((off, id))
    }

    /// The id of the struct named `name`, here or in the base.
    fn struct_named(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|(info, t)| {
                Self::kind(*info) == KIND_STRUCT && self.name_of(t) == name.as_bytes()
            })
            .map(|i| i as u32 + self.first_id())
            .or_else(|| self.base?.struct_named(name))
    }

    /// Whether an enum of this BTF has an enumerator named `name` (what a
    /// kernel knows of a uapi enum, e.g. `BPF_TCX_INGRESS`).
    pub(crate) fn has_enumerator(&self, name: &str) -> bool {
        self.types.iter().any(|(info, t)| {
            let vlen = (info & 0xffff) as usize;
            let width = match Self::kind(*info) {
                KIND_ENUM => 8,
                KIND_ENUM64 => 12,
                _ => return false,
            };
            (0..vlen).any(|i| {
                t.get(12 + i * width..12 + i * width + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .is_some_and(|off| self.name(off) == name.as_bytes())
            })
        })
    }
}
