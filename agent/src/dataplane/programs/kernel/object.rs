//! What Weft's eBPF object asks of the kernel, read from the object itself
//! (not from a list kept by hand, which would drift from the code): the
//! helpers each program calls, by program type, and the maps it declares.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use anyhow::{Context as _, Result};
use aya_obj::{Object, ProgramSection};

use crate::sys::bpf::{MapCreate, ProgType};

/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;

/// The kernel interfaces the object uses.
#[derive(Clone, Debug, Default)]
pub(crate) struct Uses {
    /// Helper ids called, by program type, with the programs that call
    /// each.
    pub(crate) helpers: BTreeMap<(ProgType, u32), BTreeSet<String>>,
    /// One map of each type the object declares (its own sizes and flags),
    /// with the name of a map of that type.
    pub(crate) maps: BTreeMap<u32, (String, MapCreate)>,
    /// The programs, by name, and their types.
    pub(crate) programs: BTreeMap<String, ProgType>,
}

/// Reads `object` (an ELF whose kfunc calls were stubbed out, see
/// `kfuncs::resolve`: those are asked of the kernel separately).
pub(crate) fn uses(object: &[u8]) -> Result<Uses> {
    let mut obj = Object::parse(object).context("parsing the eBPF object")?;
    let text: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    obj.relocate_calls(&text)
        .context("linking the eBPF object's functions")?;
    let mut out = Uses::default();
    for (name, prog) in &obj.programs {
        let ty = match prog.section {
            ProgramSection::Xdp { .. } => ProgType::Xdp,
            ProgramSection::SchedClassifier => ProgType::SchedCls,
            ref other => anyhow::bail!("program {name} has a type Weft does not load: {other:?}"),
        };
        out.programs.insert(name.clone(), ty);
        let f = obj
            .functions
            .get(&prog.function_key())
            .with_context(|| format!("program {name} has no code"))?;
        for insn in &f.instructions {
            if insn.code == CALL && insn.src_reg() == 0 {
                out.helpers
                    .entry((ty, insn.imm as u32))
                    .or_default()
                    .insert(name.clone());
            }
        }
    }
    for (name, m) in &obj.maps {
        out.maps.entry(m.map_type()).or_insert_with(|| {
            (
                name.clone(),
                MapCreate {
                    ty: m.map_type(),
                    key_size: m.key_size(),
                    value_size: m.value_size(),
                    max_entries: m.max_entries(),
                    flags: m.map_flags(),
                },
            )
        });
    }
    Ok(out)
}

/// The name of helper `id` (`enum bpf_func_id`), for the ones Weft's
/// programs call; others by number.
pub(crate) fn helper_name(id: u32) -> String {
    let name = match id {
        1 => "bpf_map_lookup_elem",
        2 => "bpf_map_update_elem",
        3 => "bpf_map_delete_elem",
        5 => "bpf_ktime_get_ns",
        7 => "bpf_get_prandom_u32",
        8 => "bpf_get_smp_processor_id",
        9 => "bpf_skb_store_bytes",
        10 => "bpf_l3_csum_replace",
        11 => "bpf_l4_csum_replace",
        14 => "bpf_get_current_pid_tgid",
        20 => "bpf_skb_get_tunnel_key",
        21 => "bpf_skb_set_tunnel_key",
        23 => "bpf_redirect",
        25 => "bpf_perf_event_output",
        26 => "bpf_skb_load_bytes",
        28 => "bpf_csum_diff",
        32 => "bpf_skb_change_type",
        34 => "bpf_get_hash_recalc",
        38 => "bpf_skb_change_tail",
        39 => "bpf_skb_pull_data",
        43 => "bpf_skb_change_head",
        44 => "bpf_xdp_adjust_head",
        50 => "bpf_skb_adjust_room",
        51 => "bpf_redirect_map",
        54 => "bpf_xdp_adjust_meta",
        65 => "bpf_xdp_adjust_tail",
        69 => "bpf_fib_lookup",
        118 => "bpf_jiffies64",
        130 => "bpf_ringbuf_output",
        131 => "bpf_ringbuf_reserve",
        132 => "bpf_ringbuf_submit",
        133 => "bpf_ringbuf_discard",
        152 => "bpf_redirect_neigh",
        155 => "bpf_redirect_peer",
        _ => return format!("helper #{id}"),
    };
    name.to_string()
}

/// The name of map type `ty` (`enum bpf_map_type`).
pub(crate) fn map_type_name(ty: u32) -> String {
    let name = match ty {
        1 => "hash",
        2 => "array",
        3 => "prog array",
        4 => "perf event array",
        5 => "per-CPU hash",
        6 => "per-CPU array",
        9 => "LRU hash",
        10 => "LRU per-CPU hash",
        11 => "LPM trie",
        27 => "ring buffer",
        _ => return format!("map type #{ty}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> Uses {
        let stubbed = crate::dataplane::programs::kfuncs::resolve(
            crate::dataplane::programs::object::OBJECT,
            None,
        )
        .expect("the object's kfunc calls stubbed");
        uses(stubbed.bytes()).expect("the object read")
    }

    #[test]
    fn finds_the_programs_and_what_they_call() {
        let u = ours();
        assert_eq!(u.programs.len(), 9, "{:?}", u.programs);
        assert_eq!(u.programs["weft_decap"], ProgType::Xdp);
        assert_eq!(u.programs["weft_encap"], ProgType::SchedCls);
        // The XDP program moves the packet head and marks its frames.
        let xdp = |id| u.helpers.get(&(ProgType::Xdp, id));
        assert!(xdp(44).is_some_and(|p| p.contains("weft_decap")));
        assert!(xdp(54).is_some(), "bpf_xdp_adjust_meta behind XDP_META");
        // Encapsulation grows the room; host routing redirects into pods.
        let tc = |id| u.helpers.get(&(ProgType::SchedCls, id));
        assert!(tc(50).is_some_and(|p| p.contains("weft_encap")));
        assert!(tc(155).is_some_and(|p| p.contains("weft_deliver")));
        // Every helper called has a name here (a new one shows up in a
        // review of the kernel features it needs).
        for (_, id) in u.helpers.keys() {
            assert!(
                !helper_name(*id).starts_with("helper #"),
                "helper {id} has no name"
            );
        }
        for ty in u.maps.keys() {
            assert!(
                !map_type_name(*ty).starts_with("map type #"),
                "map type {ty}"
            );
        }
        // Hash, LPM trie, array, per-CPU array, ring buffer, LRU hash.
        for ty in [1, 2, 6, 9, 11, 27] {
            assert!(
                u.maps.contains_key(&ty),
                "map type {ty}: {:?}",
                u.maps.keys()
            );
        }
    }
}
