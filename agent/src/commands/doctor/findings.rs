//! What the checks found: each check prints `ok`, `warn` or `FAIL`, what it
//! saw, and for anything short of ok the fix.

use anyhow::{Result, bail};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Finding {
    level: Level,
    check: String,
}

#[derive(Default)]
pub(super) struct Findings(Vec<Finding>);

impl Findings {
    pub(super) fn ok(&mut self, check: &str, saw: impl Into<String>) {
        self.push(Level::Ok, check, saw.into(), None);
    }

    pub(super) fn warn(&mut self, check: &str, saw: impl Into<String>, fix: impl Into<String>) {
        self.push(Level::Warn, check, saw.into(), Some(fix.into()));
    }

    pub(super) fn fail(&mut self, check: &str, saw: impl Into<String>, fix: impl Into<String>) {
        self.push(Level::Fail, check, saw.into(), Some(fix.into()));
    }

    fn push(&mut self, level: Level, check: &str, saw: String, fix: Option<String>) {
        let tag = match level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        println!("{tag}  {check:<10} {saw}");
        if let Some(f) = &fix {
            println!("      {:<10} fix: {f}", "");
        }
        self.0.push(Finding {
            level,
            check: check.into(),
        });
    }

    /// The summary line; an error (non-zero exit) when a check failed.
    pub(super) fn finish(self) -> Result<()> {
        let failed: Vec<&str> = self
            .0
            .iter()
            .filter(|x| x.level == Level::Fail)
            .map(|x| x.check.as_str())
            .collect();
        let warned = self.0.iter().filter(|x| x.level == Level::Warn).count();
        println!();
        if !failed.is_empty() {
            let mut names = failed.clone();
            names.dedup();
            bail!(
                "{} check(s) failed ({}), {warned} warning(s)",
                failed.len(),
                names.join(", ")
            );
        }
        println!("all checks passed, {warned} warning(s)");
        Ok(())
    }
}
