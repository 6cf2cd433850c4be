//! A lease value, as any client with write access to the prefix may write
//! it: parsing never panics, and what Weft writes back parses to the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_formats::attrs::LeaseAttrs;

fuzz_target!(|data: &[u8]| {
    let Ok(a) = LeaseAttrs::parse(data) else {
        return;
    };
    let _ = a.vxlan_data();
    let _ = a.vxlan_v6_data();
    let _ = a.node_addr();
    let json = a.to_json();
    let b = LeaseAttrs::parse(json.as_bytes()).expect("Weft's own JSON parses");
    assert_eq!(a, b, "{json}");
});
