//! Booting a kernel under qemu with virtme-ng: the host's root file system
//! shared read-only (writes land in the guest's memory), a directory of
//! ours shared writable for the results, a script run as root, then power
//! off. Hardware virtualization (KVM) where the kernel boots under it,
//! emulation (TCG) where it does not.

use std::{
    io::{Read as _, Seek as _, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::kernels::Kernel;

/// How the guest's CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// qemu's emulation: about 1/20 of native speed.
    Tcg,
}

impl Accel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "emulation",
        }
    }
}

/// What `--accel` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AccelChoice {
    /// KVM where the kernel boots under it, else emulation.
    Auto,
    Kvm,
    Tcg,
}

/// One boot of a kernel running one script.
pub(crate) struct Boot<'a> {
    pub(crate) kernel: &'a Kernel,
    pub(crate) accel: Accel,
    pub(crate) cpus: u32,
    pub(crate) memory: &'a str,
    /// Shared writable with the guest (the script, its results, the
    /// console log).
    pub(crate) dir: &'a Path,
    /// The script, run by bash in the guest.
    pub(crate) script: &'a Path,
    /// The guest must have started the script by then.
    pub(crate) boot_timeout: Duration,
    /// The whole run, boot to power-off.
    pub(crate) timeout: Duration,
}

/// How a boot ended.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The script started in the guest (it wrote [`BOOTED`]).
    pub(crate) booted: bool,
    /// Why the VM was stopped, if it was.
    pub(crate) stopped: Option<String>,
    /// The console log (the kernel's messages and virtme-ng's).
    pub(crate) console: PathBuf,
    pub(crate) took: Duration,
}

/// The file a guest script writes first, in [`Boot::dir`].
pub(crate) const BOOTED: &str = "booted";

/// Console lines after which the guest will not get anywhere: stop at once
/// instead of waiting out the timeout (qemu stays up after a KVM error).
const FATAL: [&str; 5] = [
    "KVM internal error",
    "failed to set MSR",
    "Kernel panic",
    "qemu-system-x86_64: ",
    "virtme-ng-init: fatal",
];

impl Boot<'_> {
    /// Boots, runs the script, waits for power-off (or a timeout, or a fatal
    /// console line), calling `tick` about every 200 ms meanwhile.
    pub(crate) fn run(&self, mut tick: impl FnMut()) -> Result<Ended> {
        let console = self.dir.join("console.log");
        let log = std::fs::File::create(&console)?;
        let started = Instant::now();
        let mut child = self.command(&log)?.spawn().context(
            "starting virtme-ng's vng (`cargo xtask setup` installs it in ~/.cache/weft/venv)",
        )?;
        let mut seen = 0u64;
        let mut stopped = None;
        loop {
            tick();
            if child.try_wait()?.is_some() {
                break;
            }
            let booted = self.dir.join(BOOTED).exists();
            let fatal = fatal_line(&console, &mut seen);
            let why = if let Some(l) = fatal {
                Some(format!("the console said: {l}"))
            } else if !booted && started.elapsed() > self.boot_timeout {
                Some(format!(
                    "the guest had not started its script after {:?}",
                    self.boot_timeout
                ))
            } else if started.elapsed() > self.timeout {
                Some(format!(
                    "the VM ran past its time limit ({:?})",
                    self.timeout
                ))
            } else {
                None
            };
            if let Some(why) = why {
                // A panic's last lines come just after the word.
                std::thread::sleep(Duration::from_millis(500));
                kill(&mut child);
                stopped = Some(why);
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        tick();
        Ok(Ended {
            booted: self.dir.join(BOOTED).exists(),
            stopped,
            console,
            took: started.elapsed(),
        })
    }

    fn command(&self, log: &std::fs::File) -> Result<Command> {
        let mut c = Command::new(crate::paths::venv_bin().join("vng"));
        c.arg("--run")
            .arg(&self.kernel.image)
            .args(["--user", "root"])
            .args(["--cpus", &self.cpus.to_string()])
            .args(["--memory", self.memory])
            // The console (kernel messages, the script's own console
            // fallback) goes to our log; without -v nothing does.
            .arg("--verbose")
            .arg("--rwdir")
            .arg(self.dir)
            .arg("--exec")
            .arg(format!("bash {}", self.script.display()));
        if self.accel == Accel::Tcg {
            // One host thread for all vCPUs: with a thread per vCPU,
            // qemu 7.2 races the kernel's live code patching (a static key
            // flipped on one vCPU while another runs the site: "Oops: int3"
            // in netif_rx_internal, seen under the agent tests). The guest
            // keeps its CPUs; they share one host core.
            c.arg("--disable-kvm")
                .arg("--qemu-opts=-accel tcg,thread=single");
        }
        // `vng` runs `virtme-run` from its own directory.
        let path = std::env::var("PATH").unwrap_or_default();
        c.env(
            "PATH",
            format!("{}:{path}", crate::paths::venv_bin().display()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?);
        // Its own process group, so a timeout stops qemu with it.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        Ok(c)
    }
}

/// The first fatal console line past `seen` (which advances).
fn fatal_line(console: &Path, seen: &mut u64) -> Option<String> {
    let mut f = std::fs::File::open(console).ok()?;
    // Back a little, so a line split across two reads is still whole.
    let from = seen.saturating_sub(256);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = vec![];
    f.read_to_end(&mut buf).ok()?;
    *seen = from + buf.len() as u64;
    let text = String::from_utf8_lossy(&buf);
    text.lines()
        .find(|l| FATAL.iter().any(|f| l.contains(f)) && !l.contains("terminating on signal"))
        .map(|l| {
            printable(l)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
}

/// `line` without terminal control sequences and other control characters
/// (the firmware's and qemu's console output has both).
fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters final-byte
            if chars.peek() == Some(&'[') {
                chars.next();
                for n in chars.by_ref() {
                    if ('@'..='~').contains(&n) {
                        break;
                    }
                }
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

fn kill(child: &mut Child) {
    let group = format!("-{}", child.id());
    for sig in ["-TERM", "-KILL"] {
        let _ = Command::new("kill").args([sig, "--", &group]).status();
        for _ in 0..25 {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let _ = child.wait();
}

/// The last `n` lines of the console log, for a failure's message.
pub(crate) fn console_tail(console: &Path, n: usize) -> String {
    let text = std::fs::read(console).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| printable(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Which accelerator `choice` comes to for `kernel`: for `auto`, KVM if
/// this kernel boots under it here (a short probe boot), else emulation,
/// saying why. The verdict is kept in `scratch` for this host kernel and
/// qemu, so the probe runs once per machine and kernel.
pub(crate) fn accel(choice: AccelChoice, kernel: &Kernel, scratch: &Path) -> Result<Accel> {
    match choice {
        AccelChoice::Kvm => return Ok(Accel::Kvm),
        AccelChoice::Tcg => return Ok(Accel::Tcg),
        AccelChoice::Auto => {}
    }
    // Two VMs of one kernel start side by side: one probes, the other
    // reads its verdict.
    static PROBING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = PROBING.lock().unwrap_or_else(|e| e.into_inner());
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    let key = format!(
        "host {} | {qemu} | kvm {}",
        host.trim(),
        Path::new("/dev/kvm").exists()
    );
    let verdict = scratch.join(format!("accel-{}", kernel.release));
    if let Ok(text) = std::fs::read_to_string(&verdict)
        && let Some((k, rest)) = text.split_once('\n')
        && k == key
    {
        let (accel, why) = rest.split_once('\n').unwrap_or((rest, ""));
        eprintln!(
            "vm: {} under {accel} (as probed before on this machine{})",
            kernel.release,
            if why.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", why.trim())
            }
        );
        return Ok(if accel == "kvm" {
            Accel::Kvm
        } else {
            Accel::Tcg
        });
    }
    let (accel, why) = match probe_kvm(kernel, scratch) {
        Ok(()) => {
            eprintln!("vm: {} boots under KVM", kernel.release);
            (Accel::Kvm, String::new())
        }
        Err(e) => {
            eprintln!(
                "vm: {} does not boot under KVM here, so it runs under emulation: {e:#}",
                kernel.release
            );
            (Accel::Tcg, format!("KVM probe: {e:#}"))
        }
    };
    std::fs::create_dir_all(scratch)?;
    std::fs::write(
        &verdict,
        format!(
            "{key}\n{}\n{why}\n",
            if accel == Accel::Kvm { "kvm" } else { "tcg" }
        ),
    )?;
    Ok(accel)
}

/// Boots `kernel` under KVM to a script that says which clock source the
/// guest has (kvm-clock only under KVM).
fn probe_kvm(kernel: &Kernel, scratch: &Path) -> Result<()> {
    if !Path::new("/dev/kvm").exists() {
        bail!("no /dev/kvm");
    }
    let dir = scratch.join(format!("kvm-probe-{}", kernel.release));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("probe.sh");
    std::fs::write(
        &script,
        format!(
            "echo up > {dir}/{BOOTED}\ncat /sys/devices/system/clocksource/clocksource0/available_clocksource > {dir}/clock\n",
            dir = dir.display()
        ),
    )?;
    let ended = Boot {
        kernel,
        accel: Accel::Kvm,
        cpus: 1,
        memory: "1G",
        dir: &dir,
        script: &script,
        // Under KVM a kernel reaches the script in a few seconds.
        boot_timeout: Duration::from_secs(20),
        timeout: Duration::from_secs(30),
    }
    .run(|| {})?;
    let clock = std::fs::read_to_string(dir.join("clock")).unwrap_or_default();
    if let Some(why) = ended.stopped {
        bail!("{why}");
    }
    if !clock.contains("kvm-clock") {
        bail!(
            "the guest came up without kvm-clock (clock sources: {:?}), so not under KVM",
            clock.trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_lose_terminal_sequences() {
        let line = "\u{1b}[?7l\u{1b}[2JKVM internal error. Suberror: 1\r";
        assert_eq!(printable(line), "KVM internal error. Suberror: 1");
    }

    #[test]
    fn a_fatal_console_line_is_found_once_written() {
        let dir = std::env::temp_dir().join(format!("weft-xtask-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let console = dir.join("console.log");
        std::fs::write(&console, "[    1.0] booting\n").unwrap();
        let mut seen = 0;
        assert_eq!(fatal_line(&console, &mut seen), None);
        std::fs::write(
            &console,
            "[    1.0] booting\n[    2.0] Kernel panic - not syncing: VFS\n",
        )
        .unwrap();
        assert_eq!(
            fatal_line(&console, &mut seen).as_deref(),
            Some("[ 2.0] Kernel panic - not syncing: VFS")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
