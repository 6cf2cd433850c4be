//! The node's WireGuard private key, where flannel keeps it
//! (`/run/flannel/wgkey`, mode 0400, base64; `WIREGUARD_KEY_FILE`
//! overrides): read when it exists, made once when it does not. One key
//! serves both devices, so the lease carries one public key.

use std::{
    io::Write as _,
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::Path,
};

use anyhow::{Context as _, Result, bail};

use crate::wgkey::WgKey;

/// flannel's path for the key.
pub const DEFAULT_KEY_FILE: &str = "/run/flannel/wgkey";

/// A Curve25519 private key. Never printed.
pub struct PrivateKey([u8; 32]);

impl PrivateKey {
    /// Reads the key at `path`, or makes one and writes it there (0400,
    /// in a directory made 0755 if needed). A file that exists but holds
    /// no key is an error: it is never overwritten (the node's identity
    /// would change under its peers).
    pub fn load_or_create(path: &Path) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let k = WgKey::parse(text.trim()).map_err(|e| {
                    anyhow::anyhow!(
                        "{} holds no WireGuard private key ({e}); remove it to have a new key made",
                        path.display()
                    )
                })?;
                Ok(Self(k.0))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate();
                if let Some(dir) = path.parent()
                    && !dir.as_os_str().is_empty()
                {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o400)
                    .open(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                f.write_all(WgKey(key.0).to_string().as_bytes())
                    .and_then(|()| f.sync_all())
                    .with_context(|| format!("writing {}", path.display()))?;
                // Whatever the umask did.
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o400))?;
                tracing::info!(file = %path.display(), public_key = %key.public(), "made a WireGuard key for this node");
                Ok(key)
            }
            Err(e) => bail!("reading {}: {e}", path.display()),
        }
    }

    /// A new random key, clamped as Curve25519 wants.
    fn generate() -> Self {
        let mut k: [u8; 32] = rand::random();
        k[0] &= 248;
        k[31] &= 127;
        k[31] |= 64;
        Self(k)
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The public key peers know this node by.
    pub fn public(&self) -> WgKey {
        let secret = x25519_dalek::StaticSecret::from(self.0);
        WgKey(x25519_dalek::PublicKey::from(&secret).to_bytes())
    }
}

impl Clone for PrivateKey {
    fn clone(&self) -> Self {
        Self(self.0)
    }
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateKey(public {})", self.public())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_key_is_curve25519s() {
        // RFC 7748, section 6.1: Alice's private and public keys.
        let hex = |s: &str| -> [u8; 32] {
            let v: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        let k = PrivateKey(hex(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        ));
        assert_eq!(
            k.public().0,
            hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        );
    }

    #[test]
    fn made_once_then_read_and_never_overwritten() {
        let dir = std::env::temp_dir().join(format!("weft-wgkey-{}", std::process::id()));
        let path = dir.join("sub/wgkey");
        let a = PrivateKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let b = PrivateKey::load_or_create(&path).unwrap();
        assert_eq!(a.public(), b.public());
        // wg's own file (a trailing newline) reads the same.
        let text = format!("{}\n", WgKey(*a.bytes()));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            PrivateKey::load_or_create(&path).unwrap().public(),
            a.public()
        );
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "garbage").unwrap();
        let e = PrivateKey::load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains("holds no WireGuard private key"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "garbage");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
