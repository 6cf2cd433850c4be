//! The maps the programs share with the agent (pinned by name, so they
//! outlive an agent restart).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
};
use dataplane_common::{
    Counter, CtRequest, DataplaneConfig, Endpoint, MAX_ENDPOINTS, MAX_PEERS, PodIf, Reason, Vtep,
    Vtep6, VtepInfo,
};

/// Remote subnet (key data: IPv4 address, network order) -> remote VTEP.
/// Encapsulation looks up the inner destination; decapsulation looks up the
/// inner source to check it belongs to the VTEP that sent it.
#[map]
pub(crate) static WEFT_PEERS: LpmTrie<u32, Vtep> = LpmTrie::pinned(MAX_PEERS, 0);

/// Known remote VTEP addresses (network order), to tell an unknown sender
/// from a spoofed inner source.
#[map]
pub(crate) static WEFT_VTEPS: HashMap<u32, VtepInfo> = HashMap::pinned(MAX_PEERS, 0);

/// Pods on this node (IPv4 address, network order) that host routing
/// delivers to directly.
#[map]
pub(crate) static WEFT_ENDPOINTS: HashMap<u32, Endpoint> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// Remote IPv6 subnet (key data: the address's 16 bytes) -> remote VTEP,
/// used as `WEFT_PEERS` is.
#[map]
pub(crate) static WEFT_PEERS6: LpmTrie<[u8; 16], Vtep6> = LpmTrie::pinned(MAX_PEERS, 0);

/// Known remote IPv6 VTEP addresses.
#[map]
pub(crate) static WEFT_VTEPS6: HashMap<[u8; 16], VtepInfo> = HashMap::pinned(MAX_PEERS, 0);

/// Pods on this node by IPv6 address, for host routing.
#[map]
pub(crate) static WEFT_ENDPOINTS6: HashMap<[u8; 16], Endpoint> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// The host sides of pods' veths (ifindex) -> the pod's addresses: the
/// sources a packet from that veth may have on the fast path.
#[map]
pub(crate) static WEFT_POD_IFS: HashMap<u32, PodIf> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// Remote IPv4 VTEP (network order) -> the largest outer IPv4 packet
/// (header included) its path was measured to carry; no entry: not
/// measured (see `CONFIG_F_PATH_MTU`).
#[map]
pub(crate) static WEFT_PATH_MTU: HashMap<u32, u32> = HashMap::pinned(MAX_PEERS, 0);

/// This node's settings: one entry.
#[map]
pub(crate) static WEFT_CONFIG: Array<DataplaneConfig> = Array::pinned(1, 0);

/// Packets and bytes by outcome, per CPU.
#[map]
pub(crate) static WEFT_COUNTERS: PerCpuArray<Counter> = PerCpuArray::pinned(Reason::COUNT, 0);

/// Flows whose conntrack entry the agent is asked to make liberal (see
/// `ct.rs`), asked by a GSO packet (a bulk flow's): 1,600 requests of 40
/// bytes (and their headers) before the ring is full and further flows
/// wait their turn on the stack. The agent's realtime thread reads it.
#[map]
pub(crate) static WEFT_CT_REQUESTS: RingBuf = RingBuf::pinned(64 * 1024, 0);

/// The same for flows that earned the marking by lasting (a flood of short
/// connections asks here, never in `WEFT_CT_REQUESTS`); read by a normal
/// thread of the agent.
#[map]
pub(crate) static WEFT_CT_EARNED: RingBuf = RingBuf::pinned(64 * 1024, 0);

/// When each flow was last asked about (ns), so a flow is asked once, not
/// on every packet until the agent answers.
#[map]
pub(crate) static WEFT_CT_ASKED: LruHashMap<CtRequest, u64> = LruHashMap::pinned(4096, 0);

/// When (ns) a frame last went whole to the kernel's vxlan device on this
/// CPU (see `uplink/strip.rs`).
#[map]
pub(crate) static WEFT_WHOLE_RX: PerCpuArray<u64> = PerCpuArray::pinned(1, 0);

#[inline(always)]
pub(crate) fn count(reason: Reason, bytes: u32) {
    if let Some(c) = WEFT_COUNTERS.get_ptr_mut(reason as u32) {
        // SAFETY: a valid pointer into this CPU's slot of a per-CPU map;
        // nothing else writes it while this program runs on this CPU.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes as u64;
        }
    }
}

#[inline(always)]
pub(crate) fn config() -> Option<&'static DataplaneConfig> {
    WEFT_CONFIG.get(0).filter(|c| c.ready())
}
