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
    /// in a directory made 0755 if needed). The file is written whole
    /// under another name and then linked into place, so a crash or a full
    /// disk never leaves a half-written key. A file that exists but holds
    /// no key (written by something else, or cut short before this) is set
    /// aside beside it, never deleted, and a new key is made: the node's
    /// public key changes, and its lease says so.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => match WgKey::parse(text.trim()) {
                Ok(k) => Ok(Self(k.0)),
                Err(e) => {
                    let aside = set_aside(path)?;
                    tracing::warn!(file = %path.display(), moved_to = %aside.display(), error = %e, "the WireGuard key file holds no key: set it aside, making a new key");
                    Self::create(path)
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::create(path),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let aside = set_aside(path)?;
                tracing::warn!(file = %path.display(), moved_to = %aside.display(), "the WireGuard key file is not text: set it aside, making a new key");
                Self::create(path)
            }
            Err(e) => bail!("reading {}: {e}", path.display()),
        }
    }

    /// Makes a key and writes it to `path`, which must not exist.
    fn create(path: &Path) -> Result<Self> {
        let key = Self::generate();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = path
            .file_name()
            .with_context(|| format!("{} names no file", path.display()))?;
        let tmp = dir.join(format!(".{}.new", name.to_string_lossy()));
        // A leftover of a start cut short.
        let _ = std::fs::remove_file(&tmp);
        let written = (|| -> Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o400)
                .open(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            f.write_all(WgKey(key.0).to_string().as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("writing {}", tmp.display()))?;
            // Whatever the umask did.
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o400))?;
            // Never over a key another start wrote meanwhile.
            std::fs::hard_link(&tmp, path)
                .with_context(|| format!("linking {} to {}", tmp.display(), path.display()))?;
            Ok(())
        })();
        let _ = std::fs::remove_file(&tmp);
        written?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        tracing::info!(file = %path.display(), public_key = %key.public(), "made a WireGuard key for this node");
        Ok(key)
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

/// Renames the unusable key file `path` to `<path>.bad-<unix seconds>`.
fn set_aside(path: &Path) -> Result<std::path::PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".bad-{secs}"));
    let aside = std::path::PathBuf::from(aside);
    std::fs::rename(path, &aside)
        .with_context(|| format!("setting {} aside as {}", path.display(), aside.display()))?;
    Ok(aside)
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A key file cut short (a crash or a full disk while an older build
    /// wrote it), empty, or not text: set aside, kept, and a new key made,
    /// so the node starts.
    #[test]
    fn a_file_holding_no_key_is_set_aside_and_a_new_key_made() {
        let dir = std::env::temp_dir().join(format!("weft-wgkey-bad-{}", std::process::id()));
        let path = dir.join("wgkey");
        let good = WgKey(*PrivateKey::generate().bytes()).to_string();
        let bad: [&[u8]; 4] = [b"", &good.as_bytes()[..20], b"garbage", b"\xff\xfe\x00"];
        for (i, content) in bad.iter().enumerate() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, content).unwrap();
            // A leftover of a start cut short is no obstacle.
            std::fs::write(dir.join(".wgkey.new"), "x").unwrap();
            let k = PrivateKey::load_or_create(&path).unwrap_or_else(|e| panic!("case {i}: {e:#}"));
            assert_eq!(
                PrivateKey::load_or_create(&path).unwrap().public(),
                k.public(),
                "case {i}: the new key is kept"
            );
            let aside: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().contains("wgkey.bad-"))
                .collect();
            assert_eq!(aside.len(), 1, "case {i}: {aside:?}");
            assert_eq!(&std::fs::read(&aside[0]).unwrap(), content, "case {i}");
            assert!(!dir.join(".wgkey.new").exists(), "case {i}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
