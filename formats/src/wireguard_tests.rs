//! The wireguard backend's config as flannel's network config carries it
//! (read through the whole config, so a test file of its own: `config`
//! imports `wireguard`).

use crate::{config::NetworkConfig, json::ConfigError, wireguard::*};

fn wg(backend: &str) -> Result<WireguardConfig, ConfigError> {
    NetworkConfig::parse(format!(r#"{{"Network":"10.244.0.0/16","Backend":{backend}}}"#).as_bytes())
        .map(|c| c.wireguard.expect("a wireguard config"))
}

#[test]
fn flannels_defaults() {
    let c = wg(r#"{"Type":"wireguard"}"#).unwrap();
    assert_eq!(
        c,
        WireguardConfig {
            listen_port: 51820,
            listen_port_v6: 51821,
            psk: None,
            keepalive: 0,
            mode: WgMode::Separate,
        }
    );
}

#[test]
fn every_setting_read_and_checked() {
    let c = wg(r#"{"Type":"WireGuard","ListenPort":5000,"ListenPortV6":5001,"PSK":"x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g=","PersistentKeepaliveInterval":25,"Mode":"auto","MTU":1400}"#).unwrap();
    assert_eq!(c.listen_port, 5000);
    assert_eq!(c.listen_port_v6, 5001);
    assert_eq!(c.keepalive, 25);
    assert_eq!(c.mode, WgMode::Auto);
    assert!(c.psk.is_some());
    for (bad, field) in [
        (
            r#"{"Type":"wireguard","ListenPort":70000}"#,
            "Backend.ListenPort",
        ),
        (
            r#"{"Type":"wireguard","ListenPortV6":"x"}"#,
            "Backend.ListenPortV6",
        ),
        (r#"{"Type":"wireguard","PSK":"short"}"#, "Backend.PSK"),
        (r#"{"Type":"wireguard","Mode":"both"}"#, "Backend.Mode"),
        (
            r#"{"Type":"wireguard","PersistentKeepaliveInterval":70000}"#,
            "Backend.PersistentKeepaliveInterval",
        ),
        (r#"{"Type":"wireguard","MTU":100}"#, "Backend.MTU"),
    ] {
        assert_eq!(wg(bad).unwrap_err().field, field, "{bad}");
    }
}

#[test]
fn lease_data_as_flannel_writes_it() {
    let d: WireguardData = serde_json::from_str(
        r#"{"PublicKey":"x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g=","Port":51820}"#,
    )
    .unwrap();
    assert_eq!(d.port, 51820);
    assert!(d.key().is_ok());
    let old: WireguardData =
        serde_json::from_str(r#"{"PublicKey":"x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g="}"#)
            .unwrap();
    assert_eq!(old.port, 0);
    let bad: WireguardData = serde_json::from_str(r#"{"PublicKey":"AAAA"}"#).unwrap();
    assert!(bad.key().unwrap_err().starts_with("PublicKey: "));
}
