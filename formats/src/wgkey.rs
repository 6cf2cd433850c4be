//! WireGuard keys as flannel, `wg` and the kernel write them: 32 bytes,
//! shown as standard base64 (44 characters, one `=` of padding).

use std::{fmt, str::FromStr};

use base64::{Engine as _, engine::general_purpose::STANDARD};

/// A Curve25519 public key (or a pre-shared key): 32 bytes. Its text is
/// canonical base64, so one key has exactly one spelling.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WgKey(pub [u8; 32]);

impl WgKey {
    /// Parses a key's base64 text: exactly 44 characters that decode to 32
    /// bytes, canonically (no stray bits in the last character), and not
    /// all zero (the kernel's "no key").
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim_end_matches('\n');
        if t.len() != 44 || !t.ends_with('=') || t.ends_with("==") {
            return Err(format!(
                "{:?} is not a WireGuard key (44 characters of base64)",
                shorten(s)
            ));
        }
        let bytes = STANDARD
            .decode(t)
            .map_err(|e| format!("{:?} is not a WireGuard key: {e}", shorten(s)))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|_| format!("{:?} does not decode to 32 bytes", shorten(s)))?;
        if key == [0; 32] {
            return Err("the all-zero key is no key".into());
        }
        Ok(Self(key))
    }
}

/// At most 60 characters of untrusted text, for an error message.
fn shorten(s: &str) -> String {
    s.chars().take(60).collect()
}

impl fmt::Display for WgKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0))
    }
}

impl fmt::Debug for WgKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WgKey({self})")
    }
}

impl FromStr for WgKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_writes_keys_as_wg_does() {
        // `wg genkey | wg pubkey` output.
        let text = "x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g=";
        let k = WgKey::parse(text).unwrap();
        assert_eq!(k.to_string(), text);
        assert_eq!(WgKey::parse(&format!("{text}\n")).unwrap(), k);
    }

    #[test]
    fn refuses_what_is_not_a_key() {
        for bad in [
            "",
            "abc",
            "x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g",
            "x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1g==",
            "x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1!=",
            // Stray low bits in the last character: not canonical.
            "x9Rtw8t1XjpDqbdFVH0p5Z3BzM2DQCjJ7ySPw9KQm1h=",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "not a key at all, but forty-four characters=",
        ] {
            assert!(WgKey::parse(bad).is_err(), "{bad:?}");
        }
    }
}
