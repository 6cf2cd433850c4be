//! A key under the subnets prefix: parsing never panics, and a parsed key
//! round-trips (IPv4, dual-stack and IPv6-only keys alike).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_formats::key::parse_key;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(k) = parse_key(s) else {
        return;
    };
    assert!(
        k.v4.is_some() || k.v6.is_some(),
        "{s}: a key names a subnet"
    );
    assert_eq!(parse_key(&k.key()).expect("round trip"), k, "{s}");
});
