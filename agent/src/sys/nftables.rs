//! nftables over netlink: the few things Weft asks of netfilter, each
//! written as one transaction (a netlink batch), so there is never a moment
//! with half of them.
//!
//! - Weft's own table `ip weft` ([`TableSpec`]), replaced whole: created if
//!   absent, deleted, created again with its chains and rules, in one batch.
//! - Rules inside a chain Weft does not own (iptables' `FORWARD` chain,
//!   whose policy may be DROP): found by their comment, deleted and
//!   appended again, in one batch.

use anyhow::{Context as _, Result};

use crate::sys::nfnetlink::{
    Attr, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REQUEST, Socket, is_enoent,
    message, parse_attrs,
};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
/// `NFNL_BATCH_GENID`: the batch applies only at this ruleset generation.
const NFNL_BATCH_GENID: u16 = 1;
/// The kernel's answer to a batch whose generation is no longer current.
const ERESTART: i32 = 85;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// The nftables family of a table: `ip` (IPv4) or `ip6`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Ip,
    Ip6,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Ip => NFPROTO_IPV4,
            Family::Ip6 => NFPROTO_IPV6,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }
}
pub(crate) const NF_INET_FORWARD: u32 = 2;
pub(crate) const NF_INET_POST_ROUTING: u32 = 4;
const NF_ACCEPT: u32 = 1;
const NFT_RETURN: u32 = (-5i32) as u32;
const NFT_REG_1: u32 = 1;
const NFT_REG_VERDICT: u32 = 0;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_META_MARK: u32 = 3;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const NFT_RT_TCPMSS: u32 = 3;
const NFT_BYTEORDER_HTON: u32 = 1;
const TCPOPT_MAXSEG: u8 = 2;
const NFT_EXTHDR_OP_TCPOPT: u32 = 1;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
pub(crate) const MASQ_RANDOM_FULLY: u32 = 0x10;
/// The comment type in a rule's user data (what iptables shows as
/// `-m comment --comment`).
const UDATA_RULE_COMMENT: u8 = 0;

/// One expression of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Expr {
    /// `ip saddr` (offset 12) or `ip daddr` (16) matches `net`, or for
    /// IPv6 `ip6 saddr` (8) or `ip6 daddr` (24) (`negate`: does not match).
    Addr {
        offset: u32,
        net: ipnet::IpNet,
        negate: bool,
    },
    /// `meta mark & mask == mask`.
    MarkAll(u32),
    /// Loads the conntrack state (which makes the kernel track connections
    /// in this network namespace).
    CtState,
    Counter,
    Masquerade {
        flags: u32,
    },
    /// `meta l4proto tcp tcp flags & (syn | rst) == syn`: a TCP SYN (IPv4).
    TcpSyn,
    /// `tcp option maxseg size set rt mtu`: the SYN's MSS lowered to what
    /// the route to its destination carries (never raised).
    ClampMssToRoute,
    Accept,
    Return,
}

impl Expr {
    pub(crate) fn saddr(net: impl Into<ipnet::IpNet>, negate: bool) -> Self {
        let net = net.into();
        Expr::Addr {
            offset: if net.addr().is_ipv4() { 12 } else { 8 },
            net,
            negate,
        }
    }

    pub(crate) fn daddr(net: impl Into<ipnet::IpNet>, negate: bool) -> Self {
        let net = net.into();
        Expr::Addr {
            offset: if net.addr().is_ipv4() { 16 } else { 24 },
            net,
            negate,
        }
    }

    fn attrs(&self) -> Vec<Attr> {
        let elem = |name: &str, data: Vec<Attr>| {
            Attr::Nested(
                1, // NFTA_LIST_ELEM
                vec![Attr::Str(1, name.into()), Attr::Nested(2, data)],
            )
        };
        // Register 1 = `len` bytes of the packet at `offset` from `base`.
        let payload = |base: u32, offset: u32, len: u32| {
            elem(
                "payload",
                vec![
                    Attr::U32(1, NFT_REG_1), // DREG
                    Attr::U32(2, base),      // BASE
                    Attr::U32(3, offset),    // OFFSET
                    Attr::U32(4, len),       // LEN
                ],
            )
        };
        // Register 1 &= `mask` (NFTA_BITWISE_MASK, XOR 0).
        let masked = |mask: Vec<u8>| {
            let len = mask.len();
            elem(
                "bitwise",
                vec![
                    Attr::U32(1, NFT_REG_1),  // SREG
                    Attr::U32(2, NFT_REG_1),  // DREG
                    Attr::U32(3, len as u32), // LEN
                    Attr::Nested(4, vec![Attr::Bytes(1, mask)]),
                    Attr::Nested(5, vec![Attr::Bytes(1, vec![0; len])]),
                ],
            )
        };
        // Register 1 == `v` (or != with `negate`): NFT_CMP_EQ / NEQ, and
        // NFTA_CMP_DATA{NFTA_DATA_VALUE}.
        let cmp = |negate: bool, v: Vec<u8>| {
            elem(
                "cmp",
                vec![
                    Attr::U32(1, NFT_REG_1),
                    Attr::U32(2, u32::from(negate)),
                    Attr::Nested(3, vec![Attr::Bytes(1, v)]),
                ],
            )
        };
        let verdict = |code: u32| {
            elem(
                "immediate",
                vec![
                    Attr::U32(1, NFT_REG_VERDICT), // NFTA_IMMEDIATE_DREG
                    Attr::Nested(
                        2,                                               // NFTA_IMMEDIATE_DATA
                        vec![Attr::Nested(2, vec![Attr::U32(1, code)])], // NFTA_DATA_VERDICT{NFTA_VERDICT_CODE}
                    ),
                ],
            )
        };
        match self {
            Expr::Addr {
                offset,
                net,
                negate,
            } => {
                let octets = |a: std::net::IpAddr| match a {
                    std::net::IpAddr::V4(a) => a.octets().to_vec(),
                    std::net::IpAddr::V6(a) => a.octets().to_vec(),
                };
                let mask = octets(net.netmask());
                vec![
                    payload(NFT_PAYLOAD_NETWORK_HEADER, *offset, mask.len() as u32),
                    masked(mask),
                    cmp(*negate, octets(net.network())),
                ]
            }
            Expr::MarkAll(mask) => vec![
                elem(
                    "meta",
                    vec![Attr::U32(1, NFT_REG_1), Attr::U32(2, NFT_META_MARK)],
                ),
                masked(mask.to_ne_bytes().to_vec()),
                cmp(false, mask.to_ne_bytes().to_vec()),
            ],
            // NFTA_CT_DREG = NFT_REG_1, NFTA_CT_KEY = NFT_CT_STATE
            Expr::CtState => vec![elem("ct", vec![Attr::U32(1, NFT_REG_1), Attr::U32(2, 0)])],
            Expr::Counter => vec![elem("counter", vec![])],
            Expr::TcpSyn => vec![
                // The protocol, then the flags.
                payload(NFT_PAYLOAD_NETWORK_HEADER, 9, 1),
                cmp(false, vec![libc::IPPROTO_TCP as u8]),
                payload(NFT_PAYLOAD_TRANSPORT_HEADER, 13, 1),
                masked(vec![TCP_SYN | TCP_RST]),
                cmp(false, vec![TCP_SYN]),
            ],
            Expr::ClampMssToRoute => vec![
                // NFTA_RT_DREG, NFTA_RT_KEY
                elem(
                    "rt",
                    vec![Attr::U32(1, NFT_REG_1), Attr::U32(2, NFT_RT_TCPMSS)],
                ),
                // The route's MSS is in host order; the option, network.
                elem(
                    "byteorder",
                    vec![
                        Attr::U32(1, NFT_REG_1), // SREG
                        Attr::U32(2, NFT_REG_1), // DREG
                        Attr::U32(3, NFT_BYTEORDER_HTON),
                        Attr::U32(4, 2), // LEN
                        Attr::U32(5, 2), // SIZE
                    ],
                ),
                elem(
                    "exthdr",
                    vec![
                        Attr::U8(2, TCPOPT_MAXSEG),         // NFTA_EXTHDR_TYPE
                        Attr::U32(3, 2),                    // OFFSET: past kind and length
                        Attr::U32(4, 2),                    // LEN
                        Attr::U32(6, NFT_EXTHDR_OP_TCPOPT), // OP
                        Attr::U32(7, NFT_REG_1),            // SREG
                    ],
                ),
            ],
            Expr::Masquerade { flags } => vec![elem("masq", vec![Attr::U32(1, *flags)])],
            Expr::Accept => vec![verdict(NF_ACCEPT)],
            Expr::Return => vec![verdict(NFT_RETURN)],
        }
    }
}

/// A rule: its expressions and a comment (shown by `nft` and iptables).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) exprs: Vec<Expr>,
    pub(crate) comment: &'static str,
}

impl Rule {
    fn attrs(&self, table: &str, chain: &str) -> Vec<Attr> {
        let mut udata = vec![UDATA_RULE_COMMENT, (self.comment.len() + 1) as u8];
        udata.extend(self.comment.as_bytes());
        udata.push(0);
        vec![
            Attr::Str(1, table.into()), // NFTA_RULE_TABLE
            Attr::Str(2, chain.into()), // NFTA_RULE_CHAIN
            Attr::Nested(4, self.exprs.iter().flat_map(Expr::attrs).collect()),
            Attr::Bytes(7, udata), // NFTA_RULE_USERDATA
        ]
    }
}

/// A base chain of Weft's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChainSpec {
    pub(crate) name: &'static str,
    /// `filter` or `nat`.
    pub(crate) kind: &'static str,
    pub(crate) hook: u32,
    pub(crate) priority: i32,
    pub(crate) rules: Vec<Rule>,
}

/// Weft's table (one per family).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableSpec {
    pub(crate) family: Family,
    pub(crate) name: &'static str,
    pub(crate) chains: Vec<ChainSpec>,
}

/// A batch of nftables messages.
struct Batch {
    buf: Vec<u8>,
    seq: u32,
    acks: usize,
}

impl Batch {
    fn new() -> Self {
        Self::at(None)
    }

    /// A batch that the kernel applies only if the ruleset is still at
    /// generation `genid` (what the batch was computed from).
    fn at(genid: Option<u32>) -> Self {
        let mut b = Self {
            buf: Vec::new(),
            seq: 0,
            acks: 0,
        };
        let attrs: Vec<Attr> = genid
            .map(|g| Attr::U32(NFNL_BATCH_GENID, g))
            .into_iter()
            .collect();
        b.raw(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            &attrs,
        );
        b
    }

    fn raw(&mut self, ty: u16, flags: u16, family: u8, res_id: u16, attrs: &[Attr]) {
        self.seq += 1;
        if flags & NLM_F_ACK != 0 {
            self.acks += 1;
        }
        message(&mut self.buf, self.seq, ty, flags, family, res_id, attrs);
    }

    fn msg(&mut self, family: Family, msg: u16, flags: u16, attrs: &[Attr]) {
        self.raw(
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            family.nfproto(),
            0,
            attrs,
        );
    }

    fn commit(mut self) -> Result<()> {
        self.raw(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            0,
            NFNL_SUBSYS_NFTABLES,
            &[],
        );
        let sock = Socket::open()?;
        sock.send(&self.buf)?;
        sock.acks(self.acks)
    }
}

/// Replaces Weft's table `spec.name` with `spec`, atomically.
pub(crate) fn apply_table(spec: &TableSpec) -> Result<()> {
    let table = || Attr::Str(1, spec.name.into());
    let f = spec.family;
    let mut b = Batch::new();
    b.msg(f, NFT_MSG_NEWTABLE, NLM_F_CREATE, &[table()]);
    b.msg(f, NFT_MSG_DELTABLE, 0, &[table()]);
    b.msg(f, NFT_MSG_NEWTABLE, NLM_F_CREATE, &[table()]);
    for c in &spec.chains {
        b.msg(
            f,
            NFT_MSG_NEWCHAIN,
            NLM_F_CREATE,
            &[
                Attr::Str(1, spec.name.into()), // NFTA_CHAIN_TABLE
                Attr::Str(3, c.name.into()),    // NFTA_CHAIN_NAME
                Attr::Nested(
                    4, // NFTA_CHAIN_HOOK
                    vec![Attr::U32(1, c.hook), Attr::U32(2, c.priority as u32)],
                ),
                Attr::U32(5, NF_ACCEPT),     // NFTA_CHAIN_POLICY
                Attr::Str(7, c.kind.into()), // NFTA_CHAIN_TYPE
            ],
        );
        for r in &c.rules {
            b.msg(
                f,
                NFT_MSG_NEWRULE,
                NLM_F_CREATE | NLM_F_APPEND,
                &r.attrs(spec.name, c.name),
            );
        }
    }
    b.commit()
        .with_context(|| format!("writing the nftables table {} {}", f.name(), spec.name))
}

/// Removes the table `name`; returns whether there was one.
pub(crate) fn remove_table(family: Family, name: &str) -> Result<bool> {
    let mut b = Batch::new();
    b.msg(family, NFT_MSG_DELTABLE, 0, &[Attr::Str(1, name.into())]);
    match b.commit() {
        Ok(()) => Ok(true),
        Err(e) if is_enoent(&e) => Ok(false),
        Err(e) => {
            Err(e).with_context(|| format!("removing the nftables table {} {name}", family.name()))
        }
    }
}

/// Sends one nftables get request (outside a batch) and returns the
/// messages the kernel answers with.
fn query(family: Family, msg: u16, flags: u16, attrs: &[Attr]) -> Result<Vec<Vec<u8>>> {
    let sock = Socket::open()?;
    let mut b = Batch {
        buf: Vec::new(),
        seq: 0,
        acks: 0,
    };
    b.raw(
        (NFNL_SUBSYS_NFTABLES << 8) | msg,
        flags,
        family.nfproto(),
        0,
        attrs,
    );
    sock.send(&b.buf)?;
    sock.dump()
}

/// Whether the table `name` exists.
pub(crate) fn has_table(family: Family, name: &str) -> Result<bool> {
    match query(
        family,
        NFT_MSG_GETTABLE,
        NLM_F_REQUEST | NLM_F_ACK,
        &[Attr::Str(1, name.into())],
    ) {
        Ok(msgs) => Ok(!msgs.is_empty()),
        Err(e) if is_enoent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether a chain `chain` exists in table `table`.
pub(crate) fn has_chain(family: Family, table: &str, chain: &str) -> Result<bool> {
    match query(
        family,
        NFT_MSG_GETCHAIN,
        NLM_F_REQUEST | NLM_F_ACK,
        &[Attr::Str(1, table.into()), Attr::Str(3, chain.into())],
    ) {
        Ok(msgs) => Ok(!msgs.is_empty()),
        Err(e) if is_enoent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The ruleset's generation (it changes with every committed batch, ours
/// or another tool's).
fn generation() -> Result<u32> {
    let msgs = query(Family::Ip, NFT_MSG_GETGEN, NLM_F_REQUEST, &[])?;
    msgs.iter()
        .filter(|m| m.len() >= 20 && u16::from_ne_bytes([m[4], m[5]]) & 0xff == NFT_MSG_NEWGEN)
        .flat_map(|m| parse_attrs(&m[20..]))
        .find(|(t, v)| *t == 1 && v.len() == 4) // NFTA_GEN_ID
        .map(|(_, v)| u32::from_be_bytes(v.try_into().expect("4 bytes")))
        .context("the kernel gave no ruleset generation")
}

/// Whether a batch failed because the ruleset changed under it.
fn is_restart(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|n| n == ERESTART || n == libc::EAGAIN || n == libc::EBUSY)
    })
}

/// In the chain `table`/`chain` owned by someone else, replaces the rules
/// whose comment is `comment` with `rules`, appended at the end, in one
/// batch. Returns how many old rules were removed. The rules are found
/// (by handle) and replaced at one ruleset generation: if another tool
/// (iptables-nft) commits in between, the kernel refuses the batch and it
/// is computed again, a few times.
pub(crate) fn replace_rules_in(
    family: Family,
    table: &str,
    chain: &str,
    comment: &str,
    rules: &[Rule],
) -> Result<usize> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let genid = generation().ok();
        let handles = handles_with_comment(family, table, chain, comment)?;
        let mut b = Batch::at(genid);
        for h in &handles {
            b.msg(
                family,
                NFT_MSG_DELRULE,
                0,
                &[
                    Attr::Str(1, table.into()),
                    Attr::Str(2, chain.into()),
                    Attr::Bytes(3, h.to_be_bytes().to_vec()), // NFTA_RULE_HANDLE
                ],
            );
        }
        // Appended: rules the chain's owner put before them keep deciding
        // first (an explicit drop stays a drop); only the policy comes after.
        for r in rules {
            b.msg(
                family,
                NFT_MSG_NEWRULE,
                NLM_F_CREATE | NLM_F_APPEND,
                &r.attrs(table, chain),
            );
        }
        match b.commit() {
            Ok(()) => return Ok(handles.len()),
            // A rule vanished or the ruleset moved meanwhile: again.
            Err(e) if attempt < 5 && (is_restart(&e) || is_enoent(&e)) => {
                tracing::debug!(error = %format!("{e:#}"), attempt, "the ruleset changed under Weft's FORWARD rules; computing them again");
                std::thread::sleep(std::time::Duration::from_millis(10 * attempt));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "replacing Weft's rules in chain {chain} of table {} {table}",
                        family.name()
                    )
                });
            }
        }
    }
}

/// Handles of the rules of `table`/`chain` whose comment is `comment`.
pub(crate) fn handles_with_comment(
    family: Family,
    table: &str,
    chain: &str,
    comment: &str,
) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for m in query(
        family,
        NFT_MSG_GETRULE,
        NLM_F_REQUEST | NLM_F_DUMP,
        &[Attr::Str(1, table.into()), Attr::Str(2, chain.into())],
    )? {
        let attrs = parse_attrs(m.get(20..).unwrap_or_default());
        let same = |t: u16, want: &str| {
            attrs
                .iter()
                .find(|(ty, _)| *ty == t)
                .is_some_and(|(_, v)| v.strip_suffix(&[0]).unwrap_or(v) == want.as_bytes())
        };
        if !same(1, table) || !same(2, chain) {
            continue;
        }
        let mine = attrs
            .iter()
            .find(|(t, _)| *t == 7)
            .is_some_and(|(_, u)| udata_comment(u) == Some(comment.as_bytes()));
        if let Some((_, h)) = attrs.iter().find(|(t, _)| *t == 3)
            && mine
            && h.len() == 8
        {
            out.push(u64::from_be_bytes(h[..8].try_into().expect("8 bytes")));
        }
    }
    Ok(out)
}

fn udata_comment(u: &[u8]) -> Option<&[u8]> {
    let mut o = 0;
    while o + 2 <= u.len() {
        let (ty, len) = (u[o], u[o + 1] as usize);
        let v = u.get(o + 2..o + 2 + len)?;
        if ty == UDATA_RULE_COMMENT {
            return Some(v.strip_suffix(&[0]).unwrap_or(v));
        }
        o += 2 + len;
    }
    None
}
