//! `weft install-cni` / `weft uninstall-cni`: put Weft's CNI plugin and a
//! network config on the node, or take them away. The DaemonSet's init
//! container runs the first (the image has no shell to `cp` with).

use std::{
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// The plugin's file name in the CNI bin directory.
const PLUGIN: &str = "weft";

/// The network config installed when none is given: Weft's plugin
/// standalone (as flannel's: bridge + host-local from subnet.env) and
/// portmap, under flannel's network name so host-local keeps its records.
const DEFAULT_CONFLIST: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "cbr0",
  "plugins": [
    { "type": "weft" },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
"#;

/// Copies this binary to `<bin_dir>/weft` and writes the conflist (given, or
/// the default) to `<conf_dir>/<name>`, each atomically.
pub(crate) fn install_cni(
    bin_dir: &Path,
    conf_dir: &Path,
    conflist: Option<&Path>,
    name: &str,
) -> Result<()> {
    check_name(name)?;
    let text = match conflist {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading the network config {}", p.display()))?,
        None => DEFAULT_CONFLIST.to_string(),
    };
    check_conflist(&text)?;
    let exe = std::env::current_exe().context("finding this binary")?;
    let bin = std::fs::read(&exe).with_context(|| format!("reading {}", exe.display()))?;
    let plugin = bin_dir.join(PLUGIN);
    write_atomically(&plugin, &bin, 0o755)?;
    let conf = conf_dir.join(name);
    write_atomically(&conf, text.as_bytes(), 0o644)?;
    println!("installed {} and {}", plugin.display(), conf.display());
    Ok(())
}

/// Removes `<bin_dir>/weft` and `<conf_dir>/<name>` (only if that config
/// uses Weft's plugin). Absent files are not an error.
pub(crate) fn uninstall_cni(bin_dir: &Path, conf_dir: &Path, name: &str) -> Result<()> {
    check_name(name)?;
    let conf = conf_dir.join(name);
    match std::fs::read_to_string(&conf) {
        Ok(text) if check_conflist(&text).is_ok() => remove(&conf)?,
        Ok(_) => eprintln!("{} does not use Weft's plugin: left alone", conf.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", conf.display())),
    }
    remove(&bin_dir.join(PLUGIN))
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || !(name.ends_with(".conflist")) {
        bail!("--name {name:?}: a file name ending in .conflist is expected");
    }
    Ok(())
}

/// A conflist whose plugins include Weft's.
fn check_conflist(text: &str) -> Result<()> {
    let v: serde_json::Value =
        serde_json::from_str(text).context("the network config is not JSON")?;
    let plugins = v["plugins"]
        .as_array()
        .context("the network config has no \"plugins\" list (a .conflist is expected)")?;
    if v["name"].as_str().is_none_or(str::is_empty) {
        bail!("the network config has no \"name\"");
    }
    if !plugins.iter().any(|p| p["type"] == PLUGIN) {
        bail!("the network config does not use Weft's plugin (no \"type\": \"weft\")");
    }
    Ok(())
}

fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().context("no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp: PathBuf = dir.join(format!(
        ".{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    f.sync_all()?;
    drop(f);
    // A rename replaces a plugin binary that is running (ETXTBSY otherwise).
    std::fs::rename(&tmp, path).with_context(|| format!("installing {}", path.display()))
}

fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            println!("removed {}", path.display());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_then_uninstall() {
        let d = std::env::temp_dir().join(format!("weft-install-cni-{}", std::process::id()));
        let (bin, conf) = (d.join("bin"), d.join("net.d"));
        install_cni(&bin, &conf, None, "10-weft.conflist").unwrap();
        let meta = std::fs::metadata(bin.join("weft")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        assert!(meta.len() > 0);
        let text = std::fs::read_to_string(conf.join("10-weft.conflist")).unwrap();
        assert!(text.contains("\"weft\""));
        // Someone else's config of the same name is left alone.
        std::fs::write(
            conf.join("20-other.conflist"),
            r#"{"name":"x","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        uninstall_cni(&bin, &conf, "20-other.conflist").unwrap();
        assert!(conf.join("20-other.conflist").exists());
        uninstall_cni(&bin, &conf, "10-weft.conflist").unwrap();
        assert!(!bin.join("weft").exists());
        assert!(!conf.join("10-weft.conflist").exists());
        // Twice is fine.
        uninstall_cni(&bin, &conf, "10-weft.conflist").unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn bad_configs_are_named() {
        assert!(
            check_conflist("{")
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        assert!(
            check_conflist(r#"{"name":"a","type":"weft"}"#)
                .unwrap_err()
                .to_string()
                .contains("plugins")
        );
        assert!(
            check_conflist(r#"{"name":"a","plugins":[{"type":"bridge"}]}"#)
                .unwrap_err()
                .to_string()
                .contains("Weft's plugin")
        );
        assert!(check_name("../x.conflist").is_err());
        assert!(check_name("x.conf").is_err());
        check_conflist(DEFAULT_CONFLIST).unwrap();
    }
}
