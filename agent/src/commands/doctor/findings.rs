//! What the checks found: each check says `ok`, `warn` or `FAIL`, what it
//! saw, and for anything short of ok the fix; printed as text as the checks
//! run, or gathered and printed once as JSON (`weft doctor --json`).

use anyhow::{Result, bail};
use serde::Serialize;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Serialize)]
struct Finding {
    check: String,
    level: Level,
    saw: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

#[derive(Default)]
pub(super) struct Findings {
    found: Vec<Finding>,
    /// Gathered and printed once as JSON by [`Findings::finish`].
    json: bool,
}

impl Findings {
    pub(super) fn new(json: bool) -> Self {
        Self {
            found: Vec::new(),
            json,
        }
    }

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
        if !self.json {
            let tag = match level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{tag}  {check:<10} {saw}");
            if let Some(f) = &fix {
                println!("      {:<10} fix: {f}", "");
            }
        }
        self.found.push(Finding {
            level,
            check: check.into(),
            saw,
            fix,
        });
    }

    /// The summary (the whole report as JSON with `--json`); an error
    /// (non-zero exit) when a check failed.
    pub(super) fn finish(self) -> Result<()> {
        let failed: Vec<&str> = self
            .found
            .iter()
            .filter(|x| x.level == Level::Fail)
            .map(|x| x.check.as_str())
            .collect();
        let warned = self.found.iter().filter(|x| x.level == Level::Warn).count();
        if self.json {
            let report = serde_json::json!({
                "passed": failed.is_empty(),
                "failed": failed.len(),
                "warnings": warned,
                "checks": self.found,
            });
            println!("{report:#}");
        } else {
            println!();
        }
        if !failed.is_empty() {
            let mut names = failed.clone();
            names.dedup();
            bail!(
                "{} check(s) failed ({}), {warned} warning(s)",
                failed.len(),
                names.join(", ")
            );
        }
        if !self.json {
            println!("all checks passed, {warned} warning(s)");
        }
        Ok(())
    }
}
