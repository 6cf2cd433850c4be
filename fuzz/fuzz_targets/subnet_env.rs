//! A subnet.env left on disk (maybe stale, maybe edited): reading it never
//! panics, and a subnet Weft would write reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft::lease::{SubnetEnv, parse_subnet_env};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(subnet) = parse_subnet_env(text) else {
        return;
    };
    if subnet.prefix_len() > 30 {
        return;
    }
    let env = SubnetEnv {
        network: subnet,
        subnet,
        mtu: 1450,
        ipmasq: false,
    };
    assert_eq!(parse_subnet_env(&env.render()), Ok(subnet));
});
