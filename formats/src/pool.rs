//! An address pool of one family: the subnets a network config hands out
//! (`SubnetLen`-sized, `SubnetMin` to `SubnetMax`), parsed with flannel's
//! defaults and rules, and which of them the keys under the prefix leave
//! free. One generic type for IPv4 and IPv6 ([`Pool<Ipv4Net>`],
//! [`Pool<Ipv6Net>`]); the arithmetic is on `u128` subnet indices, bounded
//! whatever etcd holds.

use std::collections::HashSet;
use std::{
    fmt::{Debug, Display},
    hash::Hash,
    net::{Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::{Map, Value};

use super::json::{ConfigError, err, get_str, get_u64};

/// An IP network type a pool can be made of: [`Ipv4Net`] or [`Ipv6Net`].
pub trait Net: Copy + Eq + Hash + Ord + Debug + Display + FromStr + Send + Sync + 'static {
    type Addr: Copy + Eq + Ord + Debug + Display + FromStr + Send + Sync + 'static;
    /// Address bits (32, 128).
    const BITS: u8;
    /// What the config calls this family's fields, and its limits.
    const FIELDS: Fields;

    fn bits(addr: Self::Addr) -> u128;
    fn from_bits(bits: u128) -> Self::Addr;
    /// The network of `prefix_len` bits at `addr` (host bits cleared).
    fn make(addr: u128, prefix_len: u8) -> Self;
    fn addr(&self) -> Self::Addr;
    fn prefix_len(&self) -> u8;
    fn trunc(&self) -> Self;

    /// The first address, as bits.
    fn first(&self) -> u128 {
        Self::bits(self.addr()) & !host_mask(Self::BITS, self.prefix_len())
    }

    /// The last address, as bits.
    fn last(&self) -> u128 {
        self.first() | host_mask(Self::BITS, self.prefix_len())
    }

    /// The one overlap rule: two networks overlap when either contains the
    /// other (networks are aligned: they nest or are apart).
    fn overlaps(&self, other: &Self) -> bool {
        self.first() <= other.last() && other.first() <= self.last()
    }
}

/// The host bits of a `prefix_len` network in a `bits`-bit address.
fn host_mask(bits: u8, prefix_len: u8) -> u128 {
    let host = u32::from(bits.saturating_sub(prefix_len));
    if host >= 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    }
}

/// A family's field names in the config and its limits.
pub struct Fields {
    pub network: &'static str,
    pub subnet_len: &'static str,
    pub subnet_min: &'static str,
    pub subnet_max: &'static str,
    /// How `network` is said to be missing.
    pub missing: &'static str,
    /// An example network, in the parse error.
    pub example: &'static str,
    /// `IPv4`, `IPv6`: what an address of the family is called.
    pub family: &'static str,
    /// The default subnet length, for networks this large or larger.
    pub default_len: u8,
    /// The longest subnet length allowed.
    pub max_len: u8,
}

impl Net for Ipv4Net {
    type Addr = Ipv4Addr;
    const BITS: u8 = 32;
    const FIELDS: Fields = Fields {
        network: "Network",
        subnet_len: "SubnetLen",
        subnet_min: "SubnetMin",
        subnet_max: "SubnetMax",
        missing: "is missing (e.g. \"10.244.0.0/16\")",
        example: "an IPv4 network in CIDR form (like 10.244.0.0/16)",
        family: "IPv4",
        default_len: 24,
        max_len: 30,
    };

    fn bits(addr: Ipv4Addr) -> u128 {
        u128::from(u32::from(addr))
    }
    fn from_bits(bits: u128) -> Ipv4Addr {
        Ipv4Addr::from(bits as u32)
    }
    fn make(addr: u128, prefix_len: u8) -> Self {
        Ipv4Net::new(Self::from_bits(addr), prefix_len.min(32))
            .expect("at most 32")
            .trunc()
    }
    fn addr(&self) -> Ipv4Addr {
        Ipv4Net::addr(self)
    }
    fn prefix_len(&self) -> u8 {
        Ipv4Net::prefix_len(self)
    }
    fn trunc(&self) -> Self {
        Ipv4Net::trunc(self)
    }
}

impl Net for Ipv6Net {
    type Addr = Ipv6Addr;
    const BITS: u8 = 128;
    const FIELDS: Fields = Fields {
        network: "IPv6Network",
        subnet_len: "IPv6SubnetLen",
        subnet_min: "IPv6SubnetMin",
        subnet_max: "IPv6SubnetMax",
        missing: "is missing while EnableIPv6 is true (e.g. \"fd00:10:244::/56\")",
        example: "an IPv6 network in CIDR form (like fd00:10:244::/56)",
        family: "IPv6",
        default_len: 64,
        max_len: 126,
    };

    fn bits(addr: Ipv6Addr) -> u128 {
        u128::from(addr)
    }
    fn from_bits(bits: u128) -> Ipv6Addr {
        Ipv6Addr::from(bits)
    }
    fn make(addr: u128, prefix_len: u8) -> Self {
        Ipv6Net::new(Self::from_bits(addr), prefix_len.min(128))
            .expect("at most 128")
            .trunc()
    }
    fn addr(&self) -> Ipv6Addr {
        Ipv6Net::addr(self)
    }
    fn prefix_len(&self) -> u8 {
        Ipv6Net::prefix_len(self)
    }
    fn trunc(&self) -> Self {
        Ipv6Net::trunc(self)
    }
}

/// One family's half of a network config: the network, the subnet length,
/// the first and the last subnet handed out (each aligned to the length).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool<N: Net> {
    pub network: N,
    pub subnet_len: u8,
    /// First subnet handed out (aligned to `subnet_len`).
    pub subnet_min: N::Addr,
    /// Last subnet handed out (aligned to `subnet_len`).
    pub subnet_max: N::Addr,
}

/// The IPv4 half: `Network`, `SubnetLen`, `SubnetMin`, `SubnetMax`.
pub type Ipv4Pool = Pool<Ipv4Net>;
/// The IPv6 half: `IPv6Network`, `IPv6SubnetLen`, `IPv6SubnetMin`,
/// `IPv6SubnetMax`.
pub type Ipv6Pool = Pool<Ipv6Net>;

impl<N: Net> Pool<N> {
    /// Reads this family's fields, with flannel's defaults: a subnet length
    /// of /24 (IPv6: /64) for networks of /22 (/62) or larger, else two
    /// bits below the network; the second subnet to the last.
    pub fn from_object(obj: &Map<String, Value>) -> Result<Self, ConfigError> {
        let f = &N::FIELDS;
        let s = get_str(obj, f.network)?.ok_or_else(|| err(f.network, f.missing))?;
        let network: N = s
            .parse()
            .map_err(|_| err(f.network, format!("{s:?} is not {}", f.example)))?;
        if network.trunc() != network {
            return Err(err(
                f.network,
                format!(
                    "{network} has host bits set; the network address is {}",
                    network.trunc()
                ),
            ));
        }
        let plen = network.prefix_len();
        let subnet_len = match get_u64(obj, f.subnet_len)? {
            Some(0) | None => {
                if plen > f.max_len - 2 {
                    return Err(err(
                        f.network,
                        format!(
                            "{network} is too small; the smallest useful network is a /{}",
                            f.max_len - 2
                        ),
                    ));
                } else if plen <= f.default_len - 2 {
                    f.default_len
                } else {
                    plen + 2
                }
            }
            Some(l) => {
                if l > u64::from(f.max_len) {
                    return Err(err(
                        f.subnet_len,
                        format!("{l} must be at most {}", f.max_len),
                    ));
                }
                let l = l as u8;
                if l < plen + 2 {
                    return Err(err(
                        f.subnet_len,
                        format!("/{l} leaves {network} room for fewer than four subnets"),
                    ));
                }
                l
            }
        };
        let size = 1u128 << (N::BITS - subnet_len);
        let bound = |field: &'static str, default: u128| -> Result<N::Addr, ConfigError> {
            let ip = match get_str(obj, field)? {
                None => return Ok(N::from_bits(default)),
                Some(s) => s
                    .parse::<N::Addr>()
                    .map_err(|_| err(field, format!("{s:?} is not an {} address", f.family)))?,
            };
            if !network.overlaps(&N::make(N::bits(ip), N::BITS)) {
                return Err(err(field, format!("{ip} is not inside {network}")));
            }
            if N::bits(ip) % size != 0 {
                return Err(err(
                    field,
                    format!("{ip} is not on a /{subnet_len} boundary"),
                ));
            }
            Ok(ip)
        };
        let subnet_min = bound(f.subnet_min, network.first() + size)?;
        let subnet_max = bound(f.subnet_max, network.last() - size + 1)?;
        if N::bits(subnet_min) > N::bits(subnet_max) {
            return Err(err(
                f.subnet_min,
                format!("{subnet_min} is above {} {subnet_max}", f.subnet_max),
            ));
        }
        Ok(Self {
            network,
            subnet_len,
            subnet_min,
            subnet_max,
        })
    }

    fn size(&self) -> u128 {
        1u128 << (N::BITS - self.subnet_len)
    }

    /// How many subnets lie between the first and the last (at most
    /// `u64::MAX`).
    pub fn subnet_count(&self) -> u64 {
        let n = (N::bits(self.subnet_max) - N::bits(self.subnet_min)) / self.size() + 1;
        n.min(u128::from(u64::MAX)) as u64
    }

    /// The subnets that may be handed out, in order.
    pub fn subnets(&self) -> impl Iterator<Item = N> + '_ {
        (0..self.subnet_count()).map(move |i| self.nth(i).expect("i is below the count"))
    }

    /// The `i`th subnet that may be handed out.
    pub fn nth(&self, i: u64) -> Option<N> {
        (i < self.subnet_count()).then(|| {
            N::make(
                N::bits(self.subnet_min) + u128::from(i) * self.size(),
                self.subnet_len,
            )
        })
    }

    /// Where `subnet` is in [`Self::subnets`], if it is one of them.
    pub fn index(&self, subnet: &N) -> Option<u64> {
        self.is_assignable(subnet).then(|| {
            let i = (N::bits(subnet.addr()) - N::bits(self.subnet_min)) / self.size();
            i.min(u128::from(u64::MAX)) as u64
        })
    }

    /// Whether `subnet` is one this pool can hand out.
    pub fn is_assignable(&self, subnet: &N) -> bool {
        let a = N::bits(subnet.addr());
        subnet.prefix_len() == self.subnet_len
            && subnet.trunc() == *subnet
            && a >= N::bits(self.subnet_min)
            && a <= N::bits(self.subnet_max)
    }

    /// The pool's subnets `key` takes, as an index range, whatever etcd
    /// holds: a subnet of the configured length takes itself; one of
    /// another length inside the network (a node with an older SubnetLen)
    /// takes every subnet it overlaps. A key no config of this network could
    /// have handed out (the network itself, or anything wider than a
    /// quarter of it: a config leaves room for four subnets at least)
    /// takes nothing; nor does one outside the pool.
    pub fn taken_by(&self, key: &N) -> Option<(u64, u64)> {
        if key.prefix_len() < self.network.prefix_len() + 2 || !self.network.overlaps(key) {
            return None;
        }
        let (min, max) = (N::bits(self.subnet_min), N::bits(self.subnet_max));
        let (first, last) = (key.first().max(min), key.last().min(max));
        if first > last {
            return None;
        }
        let size = self.size();
        let to_index = |bits: u128| ((bits - min) / size).min(u128::from(u64::MAX)) as u64;
        Some((to_index(first), to_index(last)))
    }

    /// Which subnets the keys `keys` take.
    pub fn taken<'a>(&self, keys: impl Iterator<Item = &'a N>) -> Taken {
        let mut t = Taken::default();
        for k in keys {
            match self.taken_by(k) {
                Some((a, b)) if a == b => {
                    t.exact.insert(a);
                }
                Some(r) => t.ranges.push(r),
                None => {}
            }
        }
        // Disjoint, sorted ranges: lookups by binary search.
        t.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(t.ranges.len());
        for (a, b) in t.ranges.drain(..) {
            match merged.last_mut() {
                Some((_, end)) if a <= end.saturating_add(1) => *end = (*end).max(b),
                _ => merged.push((a, b)),
            }
        }
        t.ranges = merged;
        t
    }
}

/// The subnets of a pool that keys take, by index: single subnets, and
/// ranges (keys of other lengths).
#[derive(Debug, Default)]
pub struct Taken {
    exact: HashSet<u64>,
    /// Disjoint, sorted.
    ranges: Vec<(u64, u64)>,
}

impl Taken {
    /// The range holding `i`, if one does.
    fn range_of(&self, i: u64) -> Option<(u64, u64)> {
        let at = self.ranges.partition_point(|(a, _)| *a <= i);
        at.checked_sub(1)
            .map(|k| self.ranges[k])
            .filter(|(_, b)| i <= *b)
    }

    pub fn is_free(&self, i: u64) -> bool {
        !self.exact.contains(&i) && self.range_of(i).is_none()
    }

    /// The first free index at or after `i`, below `count`. Each step
    /// passes a taken subnet or jumps over a range, so this costs at most
    /// as many steps as there are keys, however large the pool.
    pub fn next_free(&self, mut i: u64, count: u64) -> Option<u64> {
        while i < count {
            if let Some((_, end)) = self.range_of(i) {
                i = end.checked_add(1)?;
            } else if self.exact.contains(&i) {
                i += 1;
            } else {
                return Some(i);
            }
        }
        None
    }
}

/// The first `max` indices below `count` free in every one of `taken` (one
/// per family of a lease: a dual-stack lease takes the same index in
/// both). Bounded by the keys, not by the size of the pools.
pub fn free_in_all(taken: &[&Taken], count: u64, max: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let mut i = 0;
    'search: while out.len() < max {
        for t in taken {
            match t.next_free(i, count) {
                None => break 'search,
                Some(j) if j > i => {
                    i = j;
                    continue 'search;
                }
                Some(_) => {}
            }
        }
        out.push(i);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool4(json: &str) -> Ipv4Pool {
        let v: Value = serde_json::from_str(json).unwrap();
        Pool::from_object(v.as_object().unwrap()).unwrap()
    }

    fn pool6(json: &str) -> Ipv6Pool {
        let v: Value = serde_json::from_str(json).unwrap();
        Pool::from_object(v.as_object().unwrap()).unwrap()
    }

    #[test]
    fn both_families_count_and_index_alike() {
        let p4 = pool4(r#"{"Network":"10.244.0.0/16"}"#);
        assert_eq!(p4.subnet_len, 24);
        assert_eq!(p4.subnet_count(), 255);
        assert_eq!(p4.nth(0), Some("10.244.1.0/24".parse().unwrap()));
        assert_eq!(p4.nth(254), Some("10.244.255.0/24".parse().unwrap()));
        assert_eq!(p4.nth(255), None);
        assert_eq!(p4.index(&"10.244.7.0/24".parse().unwrap()), Some(6));
        assert_eq!(p4.index(&"10.244.7.0/25".parse().unwrap()), None);
        let p6 = pool6(r#"{"IPv6Network":"fd00:10:244::/56"}"#);
        assert_eq!(p6.subnet_len, 64);
        assert_eq!(p6.subnet_count(), 255);
        assert_eq!(p6.nth(6), Some("fd00:10:244:7::/64".parse().unwrap()));
        assert_eq!(p6.index(&"fd00:10:244:7::/64".parse().unwrap()), Some(6));
        // A huge IPv6 pool: counts saturate, arithmetic does not overflow.
        let big = pool6(r#"{"IPv6Network":"fd00::/8","IPv6SubnetLen":126}"#);
        assert_eq!(big.subnet_count(), u64::MAX);
        assert!(big.nth(u64::MAX - 1).is_some());
    }

    #[test]
    fn the_one_overlap_rule() {
        let a: Ipv4Net = "10.0.0.0/16".parse().unwrap();
        let b: Ipv4Net = "10.0.7.0/24".parse().unwrap();
        let c: Ipv4Net = "10.1.0.0/24".parse().unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&a) && a.overlaps(&a));
        assert!(!a.overlaps(&c) && !c.overlaps(&a));
        let all: Ipv6Net = "::/0".parse().unwrap();
        let one: Ipv6Net = "fd00::1/128".parse().unwrap();
        assert!(all.overlaps(&one) && one.overlaps(&all));
    }

    #[test]
    fn keys_take_what_a_config_could_have_handed_out() {
        let p = pool4(r#"{"Network":"10.244.0.0/16"}"#);
        let k = |s: &str| -> Ipv4Net { s.parse().unwrap() };
        assert_eq!(p.taken_by(&k("10.244.7.0/24")), Some((6, 6)));
        // An older SubnetLen: every subnet it overlaps.
        assert_eq!(p.taken_by(&k("10.244.0.0/20")), Some((0, 14)));
        assert_eq!(p.taken_by(&k("10.244.7.128/25")), Some((6, 6)));
        // The network itself, wider than a quarter of it, or outside: none.
        assert_eq!(p.taken_by(&k("10.244.0.0/16")), None);
        assert_eq!(p.taken_by(&k("10.244.0.0/17")), None);
        assert_eq!(p.taken_by(&k("10.0.0.0/8")), None);
        assert_eq!(p.taken_by(&k("10.245.0.0/24")), None);
        // The first subnet of the network is not handed out.
        assert_eq!(p.taken_by(&k("10.244.0.0/24")), None);
        assert_eq!(p.taken_by(&k("10.244.0.0/18")), Some((0, 62)));
    }

    #[test]
    fn the_next_free_subnet_is_found_in_steps_bounded_by_the_keys() {
        let p = pool6(r#"{"IPv6Network":"fd00::/32"}"#);
        assert_eq!(p.subnet_count(), (1 << 32) - 1);
        let keys: Vec<Ipv6Net> = vec![
            // A quarter of the pool, the first subnet, and the last.
            "fd00::/34".parse().unwrap(),
            "fd00:0:0:1::/64".parse().unwrap(),
            "fd00:0:ffff:ffff::/64".parse().unwrap(),
        ];
        let t = p.taken(keys.iter());
        let count = p.subnet_count();
        let first = t.next_free(0, count).unwrap();
        assert_eq!(p.nth(first), Some("fd00:0:4000::/64".parse().unwrap()));
        assert!(!t.is_free(0) && t.is_free(first));
        assert_eq!(t.next_free(count - 1, count), None);
        // Free in both of two families: the same index in each.
        let other = p.taken(keys[1..].iter());
        assert_eq!(free_in_all(&[&other, &t], count, 2), vec![first, first + 1]);
        assert_eq!(free_in_all(&[&t], 3, 2), Vec::<u64>::new());
        // The network itself takes nothing: the pool stays open.
        let whole: Ipv6Net = "fd00::/32".parse().unwrap();
        let t = p.taken(std::iter::once(&whole));
        assert_eq!(t.next_free(0, count), Some(0));
    }
}
