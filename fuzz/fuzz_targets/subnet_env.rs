//! A subnet.env left on disk (maybe stale, maybe edited): reading it never
//! panics, and subnets Weft would write read back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_formats::subnet_file::{EnvFamily, SubnetEnv, parse_subnet_env};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = SubnetEnv::parse(text);
    let Ok(subnets) = parse_subnet_env(text) else {
        return;
    };
    if subnets.v4.is_some_and(|s| s.prefix_len() > 30)
        || subnets.v6.is_some_and(|s| s.prefix_len() > 126)
    {
        return;
    }
    let env = SubnetEnv {
        ipv4: subnets.v4.map(|s| EnvFamily {
            network: s,
            subnet: s,
        }),
        ipv6: subnets.v6.map(|s| EnvFamily {
            network: s,
            subnet: s,
        }),
        mtu: 1450,
        ipmasq: false,
    };
    assert_eq!(parse_subnet_env(&env.render()), Ok(subnets));
    assert_eq!(SubnetEnv::parse(&env.render()), Ok(env));
});
