//! `cargo xtask lint`'s check that no files of a crate import each other,
//! directly or around a loop: shared vocabulary lives below its users, so
//! each file can be read after the files it uses. A module and the modules
//! inside it (`a/mod.rs` and `a/b.rs`) may use each other: that is Rust's
//! shape for one concern spread over several files.
//!
//! Paths are read from the source as written (`crate::a::b`, `super::c`,
//! `self::d`, and the trees of `use` items), comments left out; each is
//! taken to name the deepest module file it reaches.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

type Module = Vec<String>;

/// Fails, naming them, if the files under each of `roots` (a crate's `src`)
/// form an import cycle.
pub(crate) fn check(roots: &[&str]) -> Result<()> {
    let mut found = Vec::new();
    for root in roots {
        let mods = modules(Path::new(root))?;
        let graph = graph(&mods)?;
        for cycle in cycles(&graph) {
            let names: Vec<String> = cycle.iter().map(|m| name(root, m)).collect();
            let edges: Vec<String> = cycle
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| cycle.contains(b))
                        .map(move |b| format!("{} -> {}", name(root, a), name(root, b)))
                })
                .collect();
            found.push(format!("{} ({})", names.join(", "), edges.join("; ")));
        }
    }
    if !found.is_empty() {
        bail!(
            "import cycles between files (move what both use below them):\n  {}",
            found.join("\n  ")
        );
    }
    eprintln!("xtask lint: no import cycles in {}", roots.join(", "));
    Ok(())
}

fn name(root: &str, m: &Module) -> String {
    if m.is_empty() {
        format!("{root}/(crate root)")
    } else {
        format!("{root}/{}", m.join("/"))
    }
}

/// Every module file under `root`, by module path (`a/mod.rs` is `a`).
fn modules(root: &Path) -> Result<BTreeMap<Module, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(root)?.with_extension("");
            let mut m: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if m.last()
                .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
            {
                m.pop();
            }
            out.insert(m, p);
        }
    }
    Ok(out)
}

/// Module -> the modules it names, parents and children left out.
fn graph(mods: &BTreeMap<Module, PathBuf>) -> Result<BTreeMap<Module, BTreeSet<Module>>> {
    let mut g = BTreeMap::new();
    for (m, p) in mods {
        let src = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let mut to = BTreeSet::new();
        for path in paths(&without_comments(&src)) {
            if let Some(r) = resolve(m, &path, mods)
                && !nested(m, &r)
            {
                to.insert(r);
            }
        }
        g.insert(m.clone(), to);
    }
    Ok(g)
}

/// Whether one of `a`, `b` is inside the other (or they are the same).
fn nested(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The source without `//` comments (doc links name modules too).
fn without_comments(src: &str) -> String {
    src.lines()
        .map(|l| match l.find("//") {
            // Not inside a string: good enough for this code base, whose
            // strings with `//` (URLs) name no module.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path that starts at `crate`, `super` or `self`: those in the
/// code, and each leaf of a `use` tree.
fn paths(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = src.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|s| bytes[i..].starts_with(s.as_bytes()))
            && (i == 0 || !word(bytes[i - 1]) && bytes[i - 1] != b':');
        if !starts {
            i += 1;
            continue;
        }
        // The path with its `use` tree, if any: up to what cannot be part
        // of one.
        let mut j = i;
        let mut depth = 0usize;
        while j < bytes.len() {
            let b = bytes[j];
            match b {
                b'{' => depth += 1,
                b'}' if depth == 0 => break,
                b'}' => depth -= 1,
                b',' | b' ' | b'\n' | b'\t' if depth > 0 => {}
                _ if word(b) || b == b':' || b == b'*' => {}
                _ => break,
            }
            j += 1;
        }
        let tree: String = src[i..j].chars().filter(|c| !c.is_whitespace()).collect();
        expand("", &tree, &mut out);
        i = j.max(i + 1);
    }
    out
}

/// The leaves of a `use` tree `tree` under `prefix`.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    match tree.find('{') {
        None => out.push(format!("{prefix}{tree}")),
        Some(open) => {
            let head = &tree[..open];
            let inner = tree[open + 1..]
                .strip_suffix('}')
                .unwrap_or(&tree[open + 1..]);
            // The head itself names a module too (`a::{self, b}`).
            out.push(format!("{prefix}{}", head.trim_end_matches(':')));
            let (mut depth, mut start) = (0usize, 0usize);
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth = depth.saturating_sub(1),
                    ',' if depth == 0 => {
                        expand(&format!("{prefix}{head}"), &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            if start < inner.len() {
                expand(&format!("{prefix}{head}"), &inner[start..], out);
            }
        }
    }
}

/// The deepest module file `path`, written in `cur`, reaches.
fn resolve(cur: &Module, path: &str, mods: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut parts = path.split("::").filter(|p| !p.is_empty()).peekable();
    let mut base: Module = match parts.next()? {
        "crate" => Vec::new(),
        "self" => cur.clone(),
        "super" => {
            let mut b = cur.clone();
            b.pop();
            b
        }
        _ => return None,
    };
    while parts.peek() == Some(&"super") {
        parts.next();
        base.pop();
    }
    let mut best = mods.contains_key(&base).then(|| base.clone());
    for p in parts {
        if p == "self" || p == "*" {
            continue;
        }
        base.push(p.to_string());
        if mods.contains_key(&base) {
            best = Some(base.clone());
        } else {
            break;
        }
    }
    best
}

/// The strongly connected groups of more than one module (Tarjan's).
fn cycles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct T<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a Module) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.g[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Module {
        s.split('/')
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn use_trees_are_expanded_to_their_leaves() {
        let p = paths("use crate::{a::{self, B}, c::d::E};\nfn f() { super::g::h(); }\n");
        assert!(p.contains(&"crate::a".to_string()), "{p:?}");
        assert!(p.contains(&"crate::a::B".to_string()), "{p:?}");
        assert!(p.contains(&"crate::c::d::E".to_string()), "{p:?}");
        assert!(p.contains(&"super::g::h".to_string()), "{p:?}");
    }

    #[test]
    fn a_loop_between_files_is_found_and_nesting_is_not_one() {
        let mods: BTreeMap<Module, PathBuf> = ["", "a", "b", "c", "c/d"]
            .iter()
            .map(|s| (m(s), PathBuf::new()))
            .collect();
        assert_eq!(resolve(&m("a"), "crate::b::Thing", &mods), Some(m("b")));
        assert_eq!(
            resolve(&m("c/d"), "super::super::a::x", &mods),
            Some(m("a"))
        );
        assert_eq!(resolve(&m("c/d"), "super::Y", &mods), Some(m("c")));
        let g: BTreeMap<Module, BTreeSet<Module>> = [
            (m(""), BTreeSet::new()),
            (m("a"), [m("b")].into()),
            (m("b"), [m("a")].into()),
            (m("c"), BTreeSet::new()),
            (m("c/d"), BTreeSet::new()),
        ]
        .into();
        assert_eq!(cycles(&g), vec![vec![m("a"), m("b")]]);
        assert!(nested(&m("c"), &m("c/d")));
        assert!(!nested(&m("a"), &m("b")));
    }

    #[test]
    fn comments_name_nothing() {
        let src = "/// See [`crate::a`].\nfn f() {} // crate::b\n";
        assert!(paths(&without_comments(src)).is_empty());
    }
}
