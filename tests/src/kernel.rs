//! What the running kernel can do, asked by the tests themselves, each in
//! a way of its own (a valid program that uses the feature, a device of
//! the kind), so that a test compares the agent's probes with the kernel,
//! not with themselves.
//!
//! Where the kernel is known (the VM runner's Debian kernels), the runner
//! says what each check must find (`WEFT_TEST_KERNEL_EXPECT`,
//! `name=value` by commas), and a check that finds otherwise fails the
//! test: a kernel that lost a feature must not turn a test of that feature
//! into a test of its absence.

/// What the runner says check `name` must find here, if it says.
pub fn expected(name: &str) -> Option<String> {
    std::env::var("WEFT_TEST_KERNEL_EXPECT")
        .ok()?
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.trim() == name)
        .map(|(_, v)| v.trim().to_string())
}

/// `found` (in the words of [`expected`]), checked against what the
/// runner expects of this kernel.
pub fn expect(name: &str, found: &str) {
    if let Some(want) = expected(name) {
        assert_eq!(
            found, want,
            "this kernel was expected to have {name}={want} (WEFT_TEST_KERNEL_EXPECT), the tests' own check found {found}"
        );
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// Whether an XDP program may call `bpf_xdp_adjust_meta`: a four-
/// instruction program that calls it as decapsulation does (`r1` the
/// context, `r2 = -4`) is loaded; the kernel refuses the whole program
/// where it does not let XDP call the helper.
pub fn xdp_adjust_meta() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        // r2 = -4; call bpf_xdp_adjust_meta (54); r0 = XDP_PASS; exit.
        let insns: [[u8; 8]; 4] = [
            [0xb7, 0x02, 0, 0, 0xfc, 0xff, 0xff, 0xff],
            [0x85, 0, 0, 0, 54, 0, 0, 0],
            [0xb7, 0x00, 0, 0, 2, 0, 0, 0],
            [0x95, 0, 0, 0, 0, 0, 0, 0],
        ];
        let has = load(6, &insns);
        expect("xdp_adjust_meta", yes_no(has));
        has
    })
}

/// Whether the kernel has the netkit driver (`CONFIG_NETKIT`, which is
/// never a module): its transmit function among the kernel's symbols.
/// (Debian bookworm's `ip` predates netkit, so it cannot make one.)
pub fn netkit_devices() -> bool {
    let has = std::fs::read_to_string("/proc/kallsyms")
        .map(|s| {
            s.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("netkit_xmit"))
        })
        .unwrap_or(false);
    expect("netkit", yes_no(has));
    has
}

/// Loads a GPL program of type `ty` (`enum bpf_prog_type`); whether the
/// kernel took it.
fn load(ty: u32, insns: &[[u8; 8]]) -> bool {
    let license = c"GPL";
    // union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license.
    let mut attr = [0u64; 16];
    attr[0] = u64::from(ty) | (insns.len() as u64) << 32;
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    // SAFETY: a zeroed bpf_attr with valid pointers to the instructions and
    // the license, both alive for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            5, // BPF_PROG_LOAD
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: the kernel just returned this descriptor to us.
    unsafe { libc::close(fd as i32) };
    true
}
