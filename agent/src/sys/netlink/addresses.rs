//! The addresses on devices: read, and made exactly what the dataplane
//! wants.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use rtnetlink::packet_route::{
    AddressFamily,
    address::{AddressAttribute, AddressMessage},
};

use crate::sys::netlink::Netlink;

impl Netlink {
    /// The addresses on device `index`, with their prefix lengths: the
    /// IPv4 ones and the IPv6 ones of global scope (not the kernel's
    /// link-local ones).
    async fn all_addresses(&self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .context("listing addresses")?;
        Ok(msgs
            .iter()
            .filter_map(|m| {
                m.attributes
                    .iter()
                    .find_map(|a| match (m.header.family, a) {
                        (AddressFamily::Inet, AddressAttribute::Local(ip @ IpAddr::V4(_))) => {
                            Some((*ip, m.header.prefix_len))
                        }
                        (AddressFamily::Inet6, AddressAttribute::Address(ip @ IpAddr::V6(v6)))
                            if v6.segments()[0] & 0xffc0 != 0xfe80 =>
                        {
                            Some((*ip, m.header.prefix_len))
                        }
                        _ => None,
                    })
            })
            .collect())
    }

    /// The IPv4 addresses on device `index`, with their prefix lengths.
    pub(crate) async fn addresses(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
        Ok(self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter_map(|(a, len)| match a {
                IpAddr::V4(a) => Some((a, len)),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    /// The addresses of one family on device `index` (IPv6: of global
    /// scope), with their prefix lengths.
    pub(crate) async fn family_addresses(&self, index: u32, v6: bool) -> Result<Vec<(IpAddr, u8)>> {
        Ok(self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter(|(a, _)| a.is_ipv6() == v6)
            .collect())
    }

    /// The IPv6 addresses of global scope on device `index`, with their
    /// prefix lengths.
    pub(crate) async fn addresses6(&self, index: u32) -> Result<Vec<(Ipv6Addr, u8)>> {
        Ok(self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter_map(|(a, len)| match a {
                IpAddr::V6(a) => Some((a, len)),
                IpAddr::V4(_) => None,
            })
            .collect())
    }

    /// Makes `addr/prefix_len` the only address of its family on device
    /// `index` (IPv6: the only one of global scope; flannel gives
    /// `flannel-v6.<VNI>` its subnet's first address, /128).
    pub(crate) async fn ensure_only_address(
        &self,
        index: u32,
        addr: impl Into<IpAddr>,
        prefix_len: u8,
    ) -> Result<()> {
        let addr = addr.into();
        let current: Vec<(IpAddr, u8)> = self
            .all_addresses(index)
            .await?
            .into_iter()
            .filter(|(a, _)| a.is_ipv4() == addr.is_ipv4())
            .collect();
        if !current.contains(&(addr, prefix_len)) {
            self.handle
                .address()
                .add(index, addr, prefix_len)
                .replace()
                .execute()
                .await
                .with_context(|| format!("adding {addr}/{prefix_len}"))?;
        }
        for (other, len) in current {
            if (other, len) != (addr, prefix_len) {
                self.del_address(index, other, len).await?;
            }
        }
        Ok(())
    }

    async fn del_address(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(addr)
            .set_prefix_length_filter(prefix_len)
            .execute()
            .try_collect()
            .await?;
        for m in msgs {
            self.handle
                .address()
                .del(m)
                .execute()
                .await
                .with_context(|| format!("removing {addr}/{prefix_len}"))?;
        }
        Ok(())
    }
}
