//! Small helpers on IP networks that `ipnet` does not have.

use ipnet::Ipv4Net;

/// Whether two IPv4 networks share an address.
pub(crate) fn overlaps(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap() {
        let a: Ipv4Net = "10.244.0.0/16".parse().unwrap();
        let b: Ipv4Net = "10.244.4.0/24".parse().unwrap();
        let c: Ipv4Net = "10.245.4.0/24".parse().unwrap();
        assert!(overlaps(&a, &b) && overlaps(&b, &a));
        assert!(!overlaps(&a, &c));
        assert!(overlaps(&"0.0.0.0/0".parse().unwrap(), &c));
    }
}
