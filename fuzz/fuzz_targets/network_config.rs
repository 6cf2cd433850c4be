//! The network config at `<prefix>/config`: parsing never panics, and an
//! accepted config only hands out aligned subnets inside its networks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_formats::{config::NetworkConfig, key::Subnets};

fuzz_target!(|data: &[u8]| {
    let Ok(c) = NetworkConfig::parse(data) else {
        return;
    };
    assert!(c.ipv4.is_some() || c.ipv6.is_some());
    if let Some(p) = &c.ipv4 {
        assert!(p.network.contains(&p.subnet_min) && p.network.contains(&p.subnet_max));
        assert!(p.subnet_count() >= 1);
        for s in p.subnets().take(3).chain(p.subnets().last()) {
            assert!(p.network.contains(&s), "{s} outside {}", p.network);
            assert!(p.is_assignable(&s), "{s}");
            assert_eq!(p.nth(p.index(&s).expect("an index")), Some(s));
        }
    }
    if let Some(p) = &c.ipv6 {
        assert!(p.network.contains(&p.subnet_min) && p.network.contains(&p.subnet_max));
        assert!(p.subnet_count() >= 1);
        for i in [0, 1, p.subnet_count() - 1] {
            let Some(s) = p.nth(i) else { continue };
            assert!(p.network.contains(&s), "{s} outside {}", p.network);
            assert!(p.is_assignable(&s), "{s}");
            assert_eq!(p.index(&s), Some(i));
        }
    }
    // The first lease the config hands out fits it as a whole.
    let first = Subnets {
        v4: c.ipv4.as_ref().and_then(|p| p.nth(0)),
        v6: c.ipv6.as_ref().and_then(|p| p.nth(0)),
    };
    assert!(c.is_assignable(&first), "{first}");
});
