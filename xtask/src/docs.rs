//! `cargo xtask docs [--check]`: the generated reference pages
//! (`docs/reference/`, from `weft reference`: clap's command and the
//! agent's metrics) written, or checked against the code; and every
//! relative link of the Markdown pages checked to resolve (the file, and
//! the heading an anchor names). `cargo xtask test` runs the check.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

/// The generated pages: `docs/reference/<page>.md` from `weft reference <page>`.
const PAGES: [&str; 2] = ["flags", "metrics"];

pub(crate) fn docs(weft: &Path, check: bool) -> Result<()> {
    let mut stale = Vec::new();
    for page in PAGES {
        let out = Command::new(weft)
            .args(["reference", page])
            .output()
            .with_context(|| format!("running {} reference {page}", weft.display()))?;
        if !out.status.success() {
            bail!(
                "weft reference {page} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let path = PathBuf::from(format!("docs/reference/{page}.md"));
        let now = std::fs::read(&path).unwrap_or_default();
        if now == out.stdout {
            continue;
        }
        if check {
            stale.push(path.display().to_string());
        } else {
            std::fs::create_dir_all("docs/reference")?;
            std::fs::write(&path, &out.stdout)
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("xtask docs: wrote {}", path.display());
        }
    }
    if !stale.is_empty() {
        bail!(
            "{} differ from what the code generates (a flag or metric changed): run `cargo xtask docs` and commit them",
            stale.join(", ")
        );
    }
    let broken = broken_links()?;
    if !broken.is_empty() {
        bail!(
            "{} broken link(s) in the docs:\n  {}",
            broken.len(),
            broken.join("\n  ")
        );
    }
    eprintln!("xtask docs: the reference pages match the code; every link resolves");
    Ok(())
}

/// The Markdown pages: README.md, CHANGELOG.md and everything under docs/.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut out: Vec<PathBuf> = ["README.md", "CHANGELOG.md"]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    walk(Path::new("docs"), &mut out);
    out.sort();
    out
}

/// The text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans dropped.
        let mut inline = false;
        for c in line.chars() {
            if c == '`' {
                inline = !inline;
            } else if !inline {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_`
/// dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (a repeated heading gets `-1`, `-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut s = base.clone();
        let mut n = 0;
        while seen.contains(&s) {
            n += 1;
            s = format!("{base}-{n}");
        }
        seen.insert(s);
    }
    seen
}

/// Links `[text](target)` of `text` whose target is relative.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

fn broken_links() -> Result<Vec<String>> {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page)?;
        for target in relative_links(&prose(&text)) {
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap_or(Path::new("")).join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(a) = anchor
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&path)?).contains(a)
            {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    Ok(broken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_and_links_as_github_makes_them() {
        assert_eq!(
            slug(" What `auto` keeps of conntrack"),
            "what-auto-keeps-of-conntrack"
        );
        assert_eq!(
            slug(" When a node's subnet changes"),
            "when-a-nodes-subnet-changes"
        );
        let a = anchors("# A\n## A\n```\n# not\n```\n### B.c\n");
        assert_eq!(a, BTreeSet::from(["a".into(), "a-1".into(), "bc".into()]));
        let l = relative_links(&prose(
            "[x](a.md#b) [y](https://e.org) `[z](no.md)`\n```\n[w](no2.md)\n```\n[v](../c \"t\")",
        ));
        assert_eq!(l, vec!["a.md#b".to_string(), "../c".to_string()]);
    }
}
