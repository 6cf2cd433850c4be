//! The network config at `<prefix>/config`: parsing never panics, and an
//! accepted config only hands out aligned subnets inside its network.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft::lease::NetworkConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(c) = NetworkConfig::parse(data) else {
        return;
    };
    assert!(c.network.contains(&c.subnet_min) && c.network.contains(&c.subnet_max));
    assert!(c.subnet_count() >= 1);
    for s in c.subnets().take(3).chain(c.subnets().last()) {
        assert!(c.network.contains(&s), "{s} outside {}", c.network);
        assert!(c.is_assignable(&s), "{s}");
    }
});
