//! Loading the object's programs into the kernel with `bpf(2)` itself:
//! aya 0.14 creates the maps (reusing pinned ones, with the load-time
//! constants in `.rodata`), aya-obj relocates the instructions against
//! those maps and links each program's functions, and the programs are
//! loaded here with an `fd_array`, which aya 0.14 cannot pass. That is
//! what lets a program call a kernel module's kfuncs (conntrack's, where
//! it is a module: `fd_array[1]` is the module's BTF, see `kfuncs.rs`);
//! every program takes this one path on every kernel, so the path the
//! module needs is the one tested everywhere.

use std::{
    collections::{BTreeMap, HashSet},
    ffi::CString,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd},
};

use anyhow::{Context as _, Result, anyhow};
use aya::{Ebpf, maps::Map};
use aya_obj::{Object, ProgramSection};

use crate::sys::bpf::{self, Insn, LoadError, ProgLoad, ProgType};

/// One program, loaded (or refused, in the verifier's words).
pub(crate) struct Loaded {
    pub(crate) ty: ProgType,
    pub(crate) fd: Result<OwnedFd, LoadError>,
}

/// Loads every program of `object` (the ELF whose kfunc calls were
/// resolved for this kernel, `kfuncs::resolve`) against the maps `ebpf`
/// created from it; `kfunc_btf` is the module BTF its kfunc calls name at
/// index 1, if they name one.
pub(crate) fn load_all(
    object: &[u8],
    ebpf: &Ebpf,
    kfunc_btf: Option<&OwnedFd>,
) -> Result<BTreeMap<String, Loaded>> {
    let mut obj = Object::parse(object).context("parsing the eBPF object")?;
    let text: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    let mut fds: Vec<(String, RawFd)> = Vec::new();
    for (name, map) in ebpf.maps() {
        let fd = map_fd(map).with_context(|| format!("map {name} has no descriptor"))?;
        fds.push((name.to_string(), fd));
    }
    let defs = obj.maps.clone();
    let maps = fds
        .iter()
        .map(|(name, fd)| {
            defs.get(name)
                .map(|def| (name.as_str(), *fd, def))
                .ok_or_else(|| anyhow!("map {name} is not in the object"))
        })
        .collect::<Result<Vec<_>>>()?;
    obj.relocate_maps(maps.into_iter(), &text)
        .context("relocating the programs' map references")?;
    obj.relocate_calls(&text)
        .context("linking the programs' functions")?;
    let fd_array: Vec<i32> = match kfunc_btf {
        Some(fd) => vec![0, fd.as_fd().as_raw_fd()],
        None => Vec::new(),
    };
    let mut out = BTreeMap::new();
    for (name, prog) in &obj.programs {
        let ty = match prog.section {
            ProgramSection::Xdp { .. } => ProgType::Xdp,
            ProgramSection::SchedClassifier => ProgType::SchedCls,
            ref other => anyhow::bail!("program {name} has a type Weft does not load: {other:?}"),
        };
        let f = obj
            .functions
            .get(&prog.function_key())
            .with_context(|| format!("program {name} has no code"))?;
        let insns: Vec<Insn> = f
            .instructions
            .iter()
            .map(|i| Insn::new(i.code, i.dst_reg(), i.src_reg(), i.off, i.imm))
            .collect();
        let license: CString = prog.license.clone();
        let fd = bpf::prog_load(&ProgLoad {
            ty,
            insns: &insns,
            name,
            license: &license,
            fd_array: &fd_array,
        });
        out.insert(name.clone(), Loaded { ty, fd });
    }
    Ok(out)
}

/// The descriptor of a map aya created.
fn map_fd(map: &Map) -> Option<RawFd> {
    let data = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::RingBuf(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::Stack(d)
        | Map::BloomFilter(d)
        | Map::Unsupported(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}
