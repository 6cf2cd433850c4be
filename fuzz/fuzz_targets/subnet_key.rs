//! A key under the subnets prefix: parsing never panics, and a parsed key
//! round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft::lease::{parse_key, to_key};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(k) = parse_key(s) else {
        return;
    };
    assert_eq!(parse_key(&to_key(&k.v4)).expect("round trip").v4, k.v4);
});
