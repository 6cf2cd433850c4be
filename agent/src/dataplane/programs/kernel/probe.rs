//! Probes: small programs and maps the kernel is asked to load, as
//! `bpftool feature probe` and Cilium's probes do, so what Weft uses is
//! found out on the running kernel rather than assumed from its version (a
//! distribution backports, a configuration or a hardening patch removes).

use std::os::fd::{AsFd as _, BorrowedFd};

use crate::sys::bpf::{self, Insn, MapCreate, ProgLoad, ProgType};

/// `r0 = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
const fn mov_imm(dst: u8, imm: i32) -> Insn {
    Insn::new(0xb7, dst, 0, 0, imm)
}

/// `dst = src` (BPF_ALU64 | BPF_MOV | BPF_X).
const fn mov_reg(dst: u8, src: u8) -> Insn {
    Insn::new(0xbf, dst, src, 0, 0)
}

/// `dst += imm` (BPF_ALU64 | BPF_ADD | BPF_K).
const fn add_imm(dst: u8, imm: i32) -> Insn {
    Insn::new(0x07, dst, 0, 0, imm)
}

/// `*(u64 *)(r10 + off) = imm` (BPF_ST | BPF_MEM | BPF_DW).
const fn st_dw(off: i16, imm: i32) -> Insn {
    Insn::new(0x7a, 10, 0, off, imm)
}

/// `*(u32 *)(r10 + off) = imm` (BPF_ST | BPF_MEM | BPF_W).
const fn st_w(off: i16, imm: i32) -> Insn {
    Insn::new(0x62, 10, 0, off, imm)
}

/// `dst = *(u32 *)(src + off)` (BPF_LDX | BPF_MEM | BPF_W).
const fn ldx_w(dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(0x61, dst, src, off, 0)
}

/// `if dst == imm goto +off` (BPF_JMP | BPF_JEQ | BPF_K).
const fn jeq_imm(dst: u8, imm: i32, off: i16) -> Insn {
    Insn::new(0x15, dst, 0, off, imm)
}

/// A call of helper `id`.
const fn call_helper(id: u32) -> Insn {
    Insn::new(0x85, 0, 0, 0, id as i32)
}

/// A call of the kfunc with BTF id `id` in the BTF at `fd_array[btf]` (0:
/// vmlinux).
const fn call_kfunc(id: u32, btf: i16) -> Insn {
    Insn::new(0x85, 0, 2, btf, id as i32)
}

const EXIT: Insn = Insn::new(0x95, 0, 0, 0, 0);

/// What a probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accepted,
    /// Refused, in the kernel's words.
    Refused(String),
}

impl Verdict {
    #[cfg(test)]
    pub(crate) fn accepted(&self) -> bool {
        matches!(self, Verdict::Accepted)
    }
}

/// Whether programs of type `ty` load at all (`r0 = 0; exit`).
pub(crate) fn program_type(ty: ProgType) -> Verdict {
    match bpf::prog_load(&ProgLoad::probe(ty, &[mov_imm(0, 0), EXIT], &[])) {
        Ok(_) => Verdict::Accepted,
        Err(e) => Verdict::Refused(e.to_string()),
    }
}

/// Whether programs of type `ty` may call helper `id`. The probe calls it
/// without arguments: a kernel that has the helper for this type refuses
/// the arguments, not the call, and that is a yes (bpftool and libbpf
/// read the verifier's log the same way).
pub(crate) fn helper(ty: ProgType, id: u32) -> Verdict {
    let insns = [call_helper(id), mov_imm(0, 0), EXIT];
    match bpf::prog_load(&ProgLoad::probe(ty, &insns, &[])) {
        Ok(_) => Verdict::Accepted,
        Err(e) => {
            let why = e.reason();
            let refused = [
                "unknown func",
                "invalid func",
                "cannot use helper",
                "helper call is not allowed",
            ]
            .iter()
            .any(|w| e.log.contains(w));
            // A log the kernel did not write (no log for this load):
            // EINVAL alone says the program was refused, not why.
            if refused || e.log.trim().is_empty() {
                Verdict::Refused(why)
            } else {
                Verdict::Accepted
            }
        }
    }
}

/// Whether the kernel creates a map like `m` (one entry where the type
/// allows it, so nothing large is allocated).
pub(crate) fn map(m: &MapCreate) -> Verdict {
    let mut m = *m;
    // A ring buffer's size is its capacity in bytes, a page multiple.
    if m.ty != 27 {
        m.max_entries = 1;
    }
    match bpf::map_create(&m) {
        Ok(_) => Verdict::Accepted,
        Err(e) => Verdict::Refused(e.to_string()),
    }
}

/// The conntrack kfuncs Weft calls, as one program asks them: the BTF ids
/// of `bpf_skb_ct_lookup` and `bpf_ct_release`, and the BTF object they are
/// in (None: vmlinux).
pub(crate) struct Kfuncs<'a> {
    pub(crate) lookup: u32,
    pub(crate) release: u32,
    pub(crate) module: Option<BorrowedFd<'a>>,
}

/// `-EINVAL`, as a program returns it.
const EINVAL: u32 = (-libc::EINVAL) as u32;
/// `-ENOENT`: the lookup ran and found nothing (the options were taken).
const ENOENT: u32 = (-libc::ENOENT) as u32;

/// Whether a TC program may call conntrack's lookup and release through
/// `k`, and whether a lookup with `opts_size` bytes of options runs (the
/// program is run once on a frame: the lookup's `error` is what it
/// returns; a size the kernel does not take is -EINVAL, a tuple it does not
/// hold -ENOENT).
pub(crate) fn conntrack(k: &Kfuncs<'_>, opts_size: u32) -> Verdict {
    let btf = i16::from(k.module.is_some());
    // fp-48: the IPv4 tuple (12 bytes, zeroed); fp-16: the options
    // (netns_id = -1, the current one; error; l4proto TCP).
    let insns = [
        mov_reg(6, 1),
        st_dw(-48, 0),
        st_dw(-40, 0),
        st_dw(-16, 0),
        st_w(-16, -1),
        st_dw(-8, 6),
        mov_reg(1, 6),
        mov_reg(2, 10),
        add_imm(2, -48),
        mov_imm(3, 12),
        mov_reg(4, 10),
        add_imm(4, -16),
        mov_imm(5, opts_size as i32),
        call_kfunc(k.lookup, btf),
        jeq_imm(0, 0, 2),
        mov_reg(1, 0),
        call_kfunc(k.release, btf),
        ldx_w(0, 10, -12),
        EXIT,
    ];
    let fd_array: Vec<i32> = match k.module {
        Some(fd) => vec![0, std::os::fd::AsRawFd::as_raw_fd(&fd)],
        None => vec![],
    };
    let prog = match bpf::prog_load(&ProgLoad::probe(ProgType::SchedCls, &insns, &fd_array)) {
        Ok(p) => p,
        Err(e) => return Verdict::Refused(e.reason()),
    };
    // An Ethernet frame of zeros: the program reads nothing of it.
    match bpf::test_run(prog.as_fd(), &[0u8; 64], 0).map(|(r, _)| r) {
        Ok(0) | Ok(ENOENT) => Verdict::Accepted,
        Ok(EINVAL) => Verdict::Refused(format!(
            "bpf_skb_ct_lookup refuses {opts_size} bytes of options (-EINVAL)"
        )),
        Ok(other) => Verdict::Refused(format!(
            "bpf_skb_ct_lookup with {opts_size} bytes of options returned error {}",
            other as i32
        )),
        Err(e) => Verdict::Refused(format!("running the probe: {e}")),
    }
}

/// Whether the kernel makes netkit devices: a pair is created in a
/// network namespace of the probe's own (a thread's, gone with it), so
/// nothing of the probe is ever seen on the node.
pub(crate) fn netkit() -> Verdict {
    let r = std::thread::scope(|s| {
        s.spawn(|| -> Result<(), String> {
            // SAFETY: unshare moves only this thread, which ends with the
            // probe (and the namespace with it).
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(format!(
                    "a network namespace for the probe: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let msg = rtnetlink::LinkNetkit::new(
                    "weftprobe0",
                    "weftprobe1",
                    rtnetlink::packet_route::link::NetkitMode::L3,
                )
                .build();
                handle.link().add(msg).execute().await.map_err(|e| match e {
                    rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::EOPNOTSUPP => {
                        "the kernel makes no netkit devices (CONFIG_NETKIT, Linux 6.7)".to_string()
                    }
                    e => format!("creating a netkit pair: {e}"),
                })
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the probe's thread panicked".into()))
    });
    match r {
        Ok(()) => Verdict::Accepted,
        Err(why) => Verdict::Refused(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tc_and_its_helpers_load_and_an_unknown_helper_is_refused() {
        assert!(program_type(ProgType::SchedCls).accepted());
        // bpf_skb_adjust_room (Linux 4.13).
        assert!(helper(ProgType::SchedCls, 50).accepted());
        // A helper id no kernel has.
        let v = helper(ProgType::SchedCls, 100_000);
        assert!(
            matches!(&v, Verdict::Refused(w) if w.contains("func")),
            "{v:?}"
        );
        // A TC-only helper in XDP (bpf_skb_change_head).
        assert!(!helper(ProgType::Xdp, 43).accepted());
    }

    #[test]
    fn a_hash_map_is_created_and_a_nonsense_type_is_not() {
        let m = MapCreate {
            ty: 1,
            key_size: 4,
            value_size: 4,
            max_entries: 100,
            flags: 0,
        };
        assert!(map(&m).accepted());
        assert!(!map(&MapCreate { ty: 9999, ..m }).accepted());
    }
}
