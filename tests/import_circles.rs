//! No import circles (docs/architecture.md, "Rules that keep it so"): between the files of a
//! crate, the names one file takes from another form no loop.
//!
//! Every `.rs` file under `crates/*/src` and `src/` is read. An edge A -> B stands where file A
//! takes a name from file B:
//! - a `use` of `crate::…`, `super::…` (`super::super::…` too), `self::…` or of a child module
//!   (`use child::X`, the 2018 spelling of `self::child::X`), grouped (`use crate::{a::X, b::Y}`)
//!   or not, on one line or many, `pub use` too (but see re-exports below);
//! - the same path written inline in code: `crate::proc::signal(…)`, and `wire::batch::X` after
//!   `use crate::wire`.
//!
//! A path belongs to the deepest module that exists along it: `crate::a::b::Item` to `a/b.rs`
//! (or `a/b/mod.rs`, or an inline `mod b { … }` in `a.rs`) if there is one, else to `a`'s file.
//! Re-exports are not followed: `crate::Netns` is taken from the crate root. A `pub use` (or
//! `pub(crate) use`, …) of a name the file does not use itself only passes the name on, as a
//! module's face does for its children: it draws no edge.
//!
//! A file naming itself, or a file its module sits inside (the crate root, the `mod.rs` or `a.rs`
//! that declares `a::b`, and their own parents), draws no edge: a child lives in its parent's
//! scope, which `use super::X` only reads, while the parent is the face that declares and
//! re-exports it. A parent naming its child (`use child::Y`), and any file naming a file it does
//! not sit in, does draw one. A circle is a strongly connected set of two or more files of one
//! crate, found with Tarjan's algorithm.
//!
//! Test code is not read: a `#[cfg(test)]` item (`mod tests { … }`) may import freely. Comments,
//! doc links and string literals are not imports either.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

#[test]
fn no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut source_dirs = vec![root.join("src")];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|entry| entry.expect("read crates/").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    source_dirs.extend(crates);

    let mut circles = Vec::new();
    let mut files_read = 0;
    for src in &source_dirs {
        let label = src
            .strip_prefix(root)
            .expect("under the workspace")
            .to_string_lossy()
            .into_owned();
        let files = read_rs_files(src);
        assert!(!files.is_empty(), "no .rs file under {label}");
        files_read += files.len();
        circles.extend(find_circles(&label, &files));
    }
    assert!(files_read > 50, "only {files_read} files read: wrong root?");

    let mut report = format!(
        "{} circle(s) in {files_read} files of {} crates:\n",
        circles.len(),
        source_dirs.len()
    );
    for circle in &circles {
        report += &circle.to_string();
    }
    assert!(
        circles.is_empty(),
        "{report}\nBreak each circle: move what both sides use down, into a module of its own, \
         instead of importing back up."
    );
    // Shown with --nocapture.
    println!("{report}");
}

/// `(path under src, contents)` of every `.rs` file below `src`, in a stable order.
fn read_rs_files(src: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let rel = path.strip_prefix(src).expect("under src");
                let rel = rel.components().map(|c| c.as_os_str().to_string_lossy());
                out.push((rel.collect::<Vec<_>>().join("/"), text));
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// Tokens: identifiers, `::` and single punctuation; comments, literals and lifetimes vanish.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
    Literal,
}

fn tokenize(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(end) = string_end(&c, i) {
            out.push(Tok::Literal);
            i = end;
        } else if ch == '\'' || (ch == 'b' && at(i + 1) == '\'') {
            let q = if ch == 'b' { i + 1 } else { i };
            if at(q + 1) == '\\' {
                // '\n', '\'', '\u{..}': the literal ends at the next quote after the escape.
                i = q + 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push(Tok::Literal);
            } else if at(q + 2) == '\'' {
                i = q + 3;
                out.push(Tok::Literal);
            } else {
                // A lifetime or a label.
                i = q + 1;
                while is_ident_char(at(i)) {
                    i += 1;
                }
            }
        } else if is_ident_start(ch) {
            if ch == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
                i += 2; // r#type
            }
            let start = i;
            while is_ident_char(at(i)) {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while is_ident_char(at(i)) {
                i += 1;
            }
            out.push(Tok::Literal);
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

fn is_ident_start(ch: char) -> bool {
    ch == '_' || ch.is_alphabetic()
}

fn is_ident_char(ch: char) -> bool {
    ch == '_' || ch.is_alphanumeric()
}

/// If a string literal starts at `i` ("..", b"..", c"..", r#".."#, br"..", cr".."), where it ends.
fn string_end(c: &[char], i: usize) -> Option<usize> {
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut j = i;
    if at(j) == 'b' || at(j) == 'c' {
        j += 1;
    }
    let raw = at(j) == 'r';
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    while raw && at(j) == '#' {
        hashes += 1;
        j += 1;
    }
    if at(j) != '"' {
        return None;
    }
    j += 1;
    while j < c.len() {
        if !raw && c[j] == '\\' {
            j += 2;
        } else if c[j] == '"' && (0..hashes).all(|h| at(j + 1 + h) == '#') {
            return Some(j + 1 + hashes);
        } else {
            j += 1;
        }
    }
    Some(c.len())
}

// ---------------------------------------------------------------------------------------------
// One file read: the paths it names, with the module (file or inline) they are named in.

/// A path as written, not yet resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawRef {
    /// The module the path is written in: the file's, or an inline `mod` inside it.
    module: Vec<String>,
    segments: Vec<String>,
    /// A `use` leaf: the name it brings into scope (`as` name or last segment); None inline.
    alias: Option<String>,
    glob: bool,
    /// A leaf of `pub use` (`pub(crate) use`, …): it passes the name on.
    reexport: bool,
}

#[derive(Debug, Default)]
struct FileScan {
    refs: Vec<RawRef>,
    /// Inline modules (`mod field { … }`), as full module paths.
    inline_modules: Vec<Vec<String>>,
    /// Out-of-line modules declared under `#[cfg(test)]`: their files are test code.
    test_modules: Vec<Vec<String>>,
    /// Out-of-line modules declared (`mod x;`), as full module paths.
    declared_modules: Vec<Vec<String>>,
    /// `#![cfg(test)]` at the top.
    test_only: bool,
    /// Every identifier of the code outside `use` declarations.
    used: BTreeSet<String>,
}

fn scan(tokens: &[Tok], module: &[String]) -> FileScan {
    let ident = |i: usize| match tokens.get(i) {
        Some(Tok::Ident(s)) => Some(s.as_str()),
        _ => None,
    };
    let is = |i: usize, tok: Tok| tokens.get(i) == Some(&tok);
    let mut out = FileScan::default();
    // One entry per open brace: the inline module it opens, if it opens one.
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut cfg_test = false;
    let mut i = 0;
    while i < tokens.len() {
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(braces.iter().flatten().cloned())
            .collect();
        if is(i, Tok::Punct('#')) {
            let inner = is(i + 1, Tok::Punct('!'));
            let open = if inner { i + 2 } else { i + 1 };
            let close = matching(tokens, open);
            let body = &tokens[open + 1..close];
            let test = body
                == [
                    Tok::Ident("cfg".into()),
                    Tok::Punct('('),
                    Tok::Ident("test".into()),
                    Tok::Punct(')'),
                ];
            if test && inner && braces.is_empty() {
                out.test_only = true;
                return out;
            }
            cfg_test |= test && !inner;
            i = close + 1;
            continue;
        }
        if cfg_test {
            cfg_test = false;
            let end = item_end(tokens, i);
            // `#[cfg(test)] mod helpers;`: that file is test code.
            if let (Some("mod"), Some(name), true) = (
                end.checked_sub(3).and_then(ident),
                ident(end.saturating_sub(2)),
                is(end.saturating_sub(1), Tok::Punct(';')),
            ) {
                out.test_modules.push(child(&here, name));
            }
            i = end;
            continue;
        }
        match &tokens[i] {
            // pub(crate), pub(super), pub(in crate::a): a visibility, not a path.
            Tok::Ident(s) if s == "pub" && is(i + 1, Tok::Punct('(')) => {
                i = matching(tokens, i + 1) + 1;
            }
            Tok::Ident(s) if s == "mod" && ident(i + 1).is_some() => {
                let name = ident(i + 1).unwrap_or_default();
                if is(i + 2, Tok::Punct('{')) {
                    out.inline_modules.push(child(&here, name));
                    braces.push(Some(name.to_string()));
                    i += 3;
                } else {
                    out.declared_modules.push(child(&here, name));
                    i += 2;
                }
            }
            Tok::Ident(s) if s == "use" => {
                let reexport = match i.checked_sub(1).map(|k| &tokens[k]) {
                    Some(Tok::Ident(p)) => p == "pub",
                    Some(Tok::Punct(')')) => tokens[..i]
                        .iter()
                        .rposition(|t| *t == Tok::Punct('('))
                        .and_then(|open| open.checked_sub(1))
                        .is_some_and(|k| is(k, Tok::Ident("pub".into()))),
                    _ => false,
                };
                let mut leaves = Vec::new();
                let mut end = use_tree(tokens, i + 1, Vec::new(), &mut leaves);
                while end < tokens.len() && !is(end, Tok::Punct(';')) {
                    end += 1;
                }
                for (segments, alias, glob) in leaves {
                    out.refs.push(RawRef {
                        module: here.clone(),
                        segments,
                        alias: Some(alias),
                        glob,
                        reexport,
                    });
                }
                i = end + 1;
            }
            Tok::Punct('{') => {
                braces.push(None);
                i += 1;
            }
            Tok::Punct('}') => {
                braces.pop();
                i += 1;
            }
            Tok::Ident(first)
                if is(i + 1, Tok::PathSep) && (i == 0 || !is(i - 1, Tok::PathSep)) =>
            {
                // The start of a path: take its segments up to `::<`, `::{` or its end.
                let mut segments = vec![first.clone()];
                out.used.insert(first.clone());
                i += 1;
                while is(i, Tok::PathSep) {
                    match ident(i + 1) {
                        Some(s) => {
                            segments.push(s.to_string());
                            out.used.insert(s.to_string());
                            i += 2;
                        }
                        None => break,
                    }
                }
                out.refs.push(RawRef {
                    module: here,
                    segments,
                    alias: None,
                    glob: false,
                    reexport: false,
                });
            }
            Tok::Ident(s) => {
                out.used.insert(s.clone());
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn child(module: &[String], name: &str) -> Vec<String> {
    let mut path = module.to_vec();
    path.push(name.to_string());
    path
}

/// The index of the bracket closing the one at `open` (`(`, `[` or `{`).
fn matching(tokens: &[Tok], open: usize) -> usize {
    let mut depth = 0;
    for (k, tok) in tokens.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    tokens.len() - 1
}

/// Where the item starting at `i` ends: after its `;`, or after its `{ … }` body
/// (`const X: T = T { … };` and the like run on to their `;`).
fn item_end(tokens: &[Tok], i: usize) -> usize {
    let until_semicolon = tokens[i..]
        .iter()
        .find_map(|tok| match tok {
            Tok::Ident(s)
                if !matches!(
                    s.as_str(),
                    "pub" | "crate" | "super" | "in" | "self" | "unsafe" | "async" | "extern"
                ) =>
            {
                Some(matches!(
                    s.as_str(),
                    "const" | "static" | "type" | "use" | "let"
                ))
            }
            _ => None,
        })
        .unwrap_or(false);
    let mut k = i;
    while k < tokens.len() {
        match tokens[k] {
            Tok::Punct(';') => return k + 1,
            Tok::Punct('(' | '[') => k = matching(tokens, k) + 1,
            Tok::Punct('{') => {
                k = matching(tokens, k) + 1;
                if !until_semicolon {
                    return k;
                }
            }
            _ => k += 1,
        }
    }
    k
}

/// Reads the use tree starting at `i` below `prefix`; pushes `(path, name in scope, glob)` per
/// leaf and returns the index after the tree.
fn use_tree(
    tokens: &[Tok],
    mut i: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, String, bool)>,
) -> usize {
    let mut path = prefix;
    if tokens.get(i) == Some(&Tok::PathSep) {
        // `::name`: an external crate.
        path.push("::".into());
        i += 1;
    }
    loop {
        match tokens.get(i) {
            Some(Tok::Ident(s)) => {
                let group_self = s == "self" && !path.is_empty();
                if !group_self {
                    path.push(s.clone());
                }
                i += 1;
                if !group_self && tokens.get(i) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                let mut name = path.last().cloned().unwrap_or_default();
                if tokens.get(i) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(alias)) = tokens.get(i + 1) {
                        name = alias.clone();
                    }
                    i += 2;
                }
                leaves.push((path, name, false));
                return i;
            }
            Some(Tok::Punct('*')) => {
                leaves.push((path, "*".into(), true));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < tokens.len() && tokens[i] != Tok::Punct('}') {
                    i = use_tree(tokens, i, path.clone(), leaves);
                    if tokens.get(i) == Some(&Tok::Punct(',')) {
                        i += 1;
                    }
                }
                return i + 1;
            }
            _ => return i,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One crate: files as modules, paths resolved to files, circles found.

/// `lib.rs`, `main.rs` -> the root; `a.rs`, `a/mod.rs` -> `a`; `a/b.rs`, `a/b/mod.rs` -> `a::b`.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    let file = parts.pop().expect("a file name");
    let stem = file.strip_suffix(".rs").expect("a .rs file");
    if !(stem == "mod" || parts.is_empty() && (stem == "lib" || stem == "main")) {
        parts.push(stem.to_string());
    }
    parts
}

#[derive(Debug, PartialEq, Eq)]
struct Circle {
    /// Paths as shown: `crates/lab/src/netns.rs`.
    files: Vec<String>,
    /// `(from, to, names from takes from to)` for every edge inside the circle.
    ties: Vec<(String, String, Vec<String>)>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "circle of {} files: {}",
            self.files.len(),
            self.files.join(", ")
        )?;
        for (from, to, names) in &self.ties {
            writeln!(f, "  {from} -> {to}: {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// The circles among `files` (`(path under src, contents)`) of the source dir `label`.
fn find_circles(label: &str, files: &[(String, String)]) -> Vec<Circle> {
    let edges = import_edges(files);
    let names: Vec<String> = files
        .iter()
        .map(|(rel, _)| format!("{label}/{rel}"))
        .collect();
    let successors: Vec<Vec<usize>> = (0..files.len())
        .map(|from| {
            edges
                .range((from, 0)..(from + 1, 0))
                .map(|(&(_, to), _)| to)
                .collect()
        })
        .collect();
    let mut circles: Vec<Circle> = strongly_connected(&successors)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let ties = edges
                .iter()
                .filter(|((from, to), _)| component.contains(from) && component.contains(to))
                .map(|((from, to), taken)| {
                    let taken = taken.iter().cloned().collect();
                    (names[*from].clone(), names[*to].clone(), taken)
                })
                .collect();
            let mut files: Vec<String> = component.iter().map(|&f| names[f].clone()).collect();
            files.sort();
            Circle { files, ties }
        })
        .collect();
    circles.sort_by(|a, b| a.files.cmp(&b.files));
    circles
}

/// `(from file, to file) -> names` between the files of one source dir, by index in `files`.
fn import_edges(files: &[(String, String)]) -> BTreeMap<(usize, usize), BTreeSet<String>> {
    // The library's modules form one tree; a binary root beside it (main.rs next to lib.rs,
    // src/bin/*.rs) is a crate of its own, and names the library by its crate name.
    let has_lib = files.iter().any(|(rel, _)| rel == "lib.rs");
    let separate_root = |rel: &str| rel.starts_with("bin/") || has_lib && rel == "main.rs";

    let scans: Vec<FileScan> = files
        .iter()
        .map(|(rel, text)| {
            let module = if separate_root(rel) {
                Vec::new()
            } else {
                module_of(rel)
            };
            scan(&tokenize(text), &module)
        })
        .collect();
    let test_modules: Vec<&Vec<String>> = scans.iter().flat_map(|s| &s.test_modules).collect();
    let is_test = |rel: &str, scan: &FileScan| {
        scan.test_only
            || !separate_root(rel)
                && test_modules
                    .iter()
                    .any(|m| module_of(rel).starts_with(m.as_slice()))
    };

    // Module path -> the file that holds it, for the library tree.
    let mut tree: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (f, (rel, _)) in files.iter().enumerate() {
        if !separate_root(rel) && !is_test(rel, &scans[f]) {
            tree.insert(module_of(rel), f);
            for inline in &scans[f].inline_modules {
                tree.insert(inline.clone(), f);
            }
        }
    }

    let mut edges: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
    for (f, (rel, _)) in files.iter().enumerate() {
        let scan = &scans[f];
        if is_test(rel, scan) {
            continue;
        }
        let own_tree: BTreeMap<Vec<String>, usize>;
        let tree = if separate_root(rel) {
            assert!(
                scan.declared_modules.is_empty(),
                "{rel} is a binary beside a library and declares modules of its own \
                 ({:?}): teach this check to read them as a crate of their own",
                scan.declared_modules
            );
            own_tree = scan
                .inline_modules
                .iter()
                .map(|m| (m.clone(), f))
                .chain([(Vec::new(), f)])
                .collect();
            &own_tree
        } else {
            &tree
        };
        // The files this one sits in: itself, and the files of the modules around its own.
        let own_module = module_of(rel);
        let sits_in = |to: usize| to == f || own_module.starts_with(&module_of(&files[to].0));

        // Names that `use` binds to modules (`use crate::wire::{self, batch}`), per module:
        // inline paths may start with them. Twice round, so that a use may build on a later one.
        let mut aliases: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
        for _ in 0..2 {
            for r in &scan.refs {
                if let (Some(alias), false) = (&r.alias, r.glob) {
                    if let Some(path) = absolute(tree, &aliases, r) {
                        if tree.contains_key(&path) {
                            aliases.insert((r.module.clone(), alias.clone()), path);
                        }
                    }
                }
            }
        }

        for r in &scan.refs {
            // A re-export that the file does not use itself only passes the name on.
            let passed_on =
                r.reexport && (r.glob || r.alias.as_ref().is_some_and(|a| !scan.used.contains(a)));
            let Some(path) = absolute(tree, &aliases, r).filter(|_| !passed_on) else {
                continue;
            };
            let depth = (0..=path.len())
                .rev()
                .find(|&k| tree.contains_key(&path[..k]))
                .expect("the root is always there");
            let to = tree[&path[..depth]];
            if sits_in(to) {
                continue;
            }
            let name = if r.glob {
                "*".to_string()
            } else {
                path.get(depth).or(path.last()).cloned().unwrap_or_default()
            };
            edges.entry((f, to)).or_default().insert(name);
        }
    }
    edges
}

/// The path `r` names, from the crate root; None for paths outside the crate (std, other crates,
/// local types' associated items).
fn absolute(
    tree: &BTreeMap<Vec<String>, usize>,
    aliases: &BTreeMap<(Vec<String>, String), Vec<String>>,
    r: &RawRef,
) -> Option<Vec<String>> {
    let first = r.segments.first()?.as_str();
    let (base, rest): (Vec<String>, &[String]) = match first {
        "crate" => (Vec::new(), &r.segments[1..]),
        "self" => (r.module.clone(), &r.segments[1..]),
        "super" => {
            let mut base = r.module.clone();
            let ups = r.segments.iter().take_while(|s| *s == "super").count();
            for _ in 0..ups {
                base.pop()?;
            }
            (base, &r.segments[ups..])
        }
        _ if tree.contains_key(&child(&r.module, first)) => (r.module.clone(), &r.segments[..]),
        _ => {
            let target = aliases.get(&(r.module.clone(), first.to_string()))?;
            (target.clone(), &r.segments[1..])
        }
    };
    Some(base.into_iter().chain(rest.iter().cloned()).collect())
}

/// Tarjan's strongly connected components of the graph `successors[node] = [node, …]`.
fn strongly_connected(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct Tarjan<'a> {
        successors: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        components: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.successors[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().expect("v is on the stack");
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.components.push(component);
            }
        }
    }
    let n = successors.len();
    let mut tarjan = Tarjan {
        successors,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..n {
        if tarjan.index[v].is_none() {
            tarjan.visit(v);
        }
    }
    tarjan.components
}

// ---------------------------------------------------------------------------------------------
// The tricky parts, checked on small made-up crates.

/// `(from, to, names)` of the edges among `files` (paths under src), by path.
fn edges_of(files: &[(&str, &str)]) -> Vec<(String, String, Vec<String>)> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(rel, text)| (rel.to_string(), text.to_string()))
        .collect();
    let mut edges: Vec<_> = import_edges(&files)
        .into_iter()
        .map(|((from, to), names)| {
            let names = names.into_iter().collect();
            (files[from].0.clone(), files[to].0.clone(), names)
        })
        .collect();
    edges.sort();
    edges
}

fn edge(from: &str, to: &str, names: &[&str]) -> (String, String, Vec<String>) {
    let names = names.iter().map(|n| n.to_string()).collect();
    (from.to_string(), to.to_string(), names)
}

fn circles_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(rel, text)| (rel.to_string(), text.to_string()))
        .collect();
    find_circles("src", &files)
        .into_iter()
        .map(|c| c.files)
        .collect()
}

#[test]
fn grouped_multi_line_and_nested_uses_are_all_read() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b; mod c; pub mod d;"),
        (
            "a.rs",
            "use crate::{\n    b::{self, B1 as Renamed,\n        },\n    c::{C1, C2},\n    d::e::*, // trailing\n};",
        ),
        ("b.rs", ""),
        ("c.rs", ""),
        ("d/mod.rs", "pub mod e;"),
        ("d/e.rs", ""),
    ]);
    assert_eq!(
        edges,
        vec![
            edge("a.rs", "b.rs", &["B1", "b"]),
            edge("a.rs", "c.rs", &["C1", "C2"]),
            edge("a.rs", "d/e.rs", &["*"]),
        ]
    );
}

#[test]
fn super_chains_climb_from_the_file_module() {
    let edges = edges_of(&[
        ("lib.rs", "mod x; mod engine;"),
        ("x.rs", "pub fn helper() {}"),
        ("engine/mod.rs", "mod batch; pub fn shared() {}"),
        ("engine/batch/mod.rs", "mod sender;"),
        (
            "engine/batch/sender.rs",
            "use super::super::super::x::helper;\nuse super::super::shared;\nfn f() { super::super::super::x::helper(); }",
        ),
    ]);
    // shared is engine/mod.rs's, which sender sits in: no edge.
    assert_eq!(
        edges,
        vec![edge("engine/batch/sender.rs", "x.rs", &["helper"])]
    );
}

#[test]
fn a_path_belongs_to_the_deepest_module_on_it() {
    let edges = edges_of(&[
        ("lib.rs", "pub mod a; mod user;"),
        ("a/mod.rs", "pub mod b; pub struct InA;"),
        ("a/b.rs", "pub mod inline { pub struct Deep; } pub struct InB;"),
        (
            "user.rs",
            "use crate::a::InA; use crate::a::b::InB;\nfn f() -> crate::a::b::inline::Deep { todo!() }",
        ),
    ]);
    assert_eq!(
        edges,
        vec![
            edge("user.rs", "a/b.rs", &["Deep", "InB"]),
            edge("user.rs", "a/mod.rs", &["InA"]),
        ]
    );
}

#[test]
fn inline_paths_go_through_module_aliases_and_child_modules() {
    let edges = edges_of(&[
        ("lib.rs", "pub mod wire; mod engine;"),
        ("wire/mod.rs", "pub mod batch; pub mod chunk;"),
        ("wire/batch.rs", ""),
        ("wire/chunk.rs", ""),
        ("engine/mod.rs", "mod batch;\nuse crate::wire::{self};\nfn f() { wire::batch::PORT; batch::run(); Vec::<u8>::new(); std::mem::drop(1); }"),
        ("engine/batch.rs", "use crate::wire::chunk as c;\nfn g() { c::VERSION; }"),
    ]);
    assert_eq!(
        edges,
        vec![
            edge("engine/batch.rs", "wire/chunk.rs", &["VERSION", "chunk"]),
            edge("engine/mod.rs", "engine/batch.rs", &["run"]),
            edge("engine/mod.rs", "wire/batch.rs", &["PORT"]),
            edge("engine/mod.rs", "wire/mod.rs", &["wire"]),
        ]
    );
}

#[test]
fn test_code_comments_and_literals_are_not_imports() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b; #[cfg(test)] mod helpers;"),
        (
            "a.rs",
            r##"
//! See [`crate::b::Doc`].
/* a /* nested */ crate::b::Block */
const S: &str = "crate::b::Str";
const R: &str = r#"crate::b::"Raw"#;
const C: char = '"'; const Q: char = '\''; fn l<'a>(x: &'a str) -> &'a str { x }
#[cfg(test)]
fn helper() { crate::b::TestFn; }
#[cfg(test)]
mod tests {
    use crate::b::InTests;
    fn t() { let _ = '{'; }
}
pub(in crate::a) fn vis() {}
fn real() { crate::b::Real; }
"##,
        ),
        ("b.rs", "use crate::helpers::Test;"),
        ("helpers.rs", "use crate::a::Anything;"),
    ]);
    assert_eq!(edges, vec![edge("a.rs", "b.rs", &["Real"])]);
}

#[test]
fn a_child_naming_its_parent_is_no_edge_but_a_parent_naming_its_child_is() {
    // sender -> engine/mod.rs is containment; engine/mod.rs -> sender is an edge; no circle.
    let nested = [
        ("lib.rs", "pub mod engine; pub fn require_root() {}"),
        (
            "engine/mod.rs",
            "mod sender; use sender::Sender; pub struct Counts;",
        ),
        (
            "engine/sender.rs",
            "use super::Counts; use crate::require_root; pub struct Sender;",
        ),
    ];
    assert_eq!(
        edges_of(&nested),
        vec![edge("engine/mod.rs", "engine/sender.rs", &["Sender"])]
    );
    assert!(circles_of(&nested).is_empty());
    // status.rs declares status/prometheus.rs the 2018 way: the same rule.
    let flat = [
        ("lib.rs", "pub mod status;"),
        (
            "status.rs",
            "mod prometheus; use prometheus::render; pub struct S;",
        ),
        ("status/prometheus.rs", "use super::S; pub fn render() {}"),
    ];
    assert!(circles_of(&flat).is_empty());
    // Through a file it does not sit in, the parent's name does close a circle.
    let through = [
        ("lib.rs", "pub mod p; pub mod x;"),
        ("p/mod.rs", "pub mod c; use c::Yc; pub struct Zp;"),
        ("p/c.rs", "use crate::x::Xx; pub struct Yc;"),
        ("x.rs", "use crate::p::Zp; pub struct Xx;"),
    ];
    assert_eq!(
        circles_of(&through),
        vec![vec!["src/p/c.rs", "src/p/mod.rs", "src/x.rs"]]
    );
}

#[test]
fn a_re_export_draws_an_edge_only_where_the_file_uses_the_name() {
    let passed_on = [
        ("lib.rs", "pub mod a; pub mod b;"),
        (
            "a.rs",
            "pub(crate) use crate::b::B;\npub use crate::b::*;\npub struct A;",
        ),
        ("b.rs", "use crate::a::A; pub struct B;"),
    ];
    assert_eq!(edges_of(&passed_on), vec![edge("b.rs", "a.rs", &["A"])]);
    let used = [
        ("lib.rs", "pub mod a; pub mod b;"),
        (
            "a.rs",
            "pub use crate::b::B;\npub struct A;\npub fn f() -> B { B }",
        ),
        ("b.rs", "use crate::a::A; pub struct B;"),
    ];
    assert_eq!(circles_of(&used), vec![vec!["src/a.rs", "src/b.rs"]]);
}

#[test]
fn circles_are_strongly_connected_sets_with_their_ties() {
    let files: Vec<(String, String)> = [
        ("lib.rs", "mod a; mod b; mod c; mod d; mod e;"),
        ("a.rs", "use crate::b::B;"),
        ("b.rs", "use crate::c::C;"),
        ("c.rs", "use crate::a::A; use crate::d::D;"),
        ("d.rs", "use super::e::E;"),
        ("e.rs", "use super::d::{D1, D2};"),
    ]
    .iter()
    .map(|(rel, text)| (rel.to_string(), text.to_string()))
    .collect();
    let circles = find_circles("crates/x/src", &files);
    assert_eq!(
        circles.iter().map(|c| c.to_string()).collect::<String>(),
        "circle of 3 files: crates/x/src/a.rs, crates/x/src/b.rs, crates/x/src/c.rs\n\
         \x20 crates/x/src/a.rs -> crates/x/src/b.rs: B\n\
         \x20 crates/x/src/b.rs -> crates/x/src/c.rs: C\n\
         \x20 crates/x/src/c.rs -> crates/x/src/a.rs: A\n\
         circle of 2 files: crates/x/src/d.rs, crates/x/src/e.rs\n\
         \x20 crates/x/src/d.rs -> crates/x/src/e.rs: E\n\
         \x20 crates/x/src/e.rs -> crates/x/src/d.rs: D1, D2\n"
    );
}

#[test]
fn a_binary_beside_the_library_is_a_crate_of_its_own() {
    let edges = edges_of(&[
        ("lib.rs", "pub mod a; pub fn f() {}"),
        (
            "main.rs",
            "use mylib::a::X; fn main() { crate::helper(); } fn helper() {}",
        ),
        ("a.rs", "use crate::f; pub struct X;"),
    ]);
    assert!(edges.is_empty(), "{edges:?}");
}

#[test]
fn tokens_keep_paths_and_drop_the_rest() {
    assert_eq!(
        tokenize("r#type::x b'\\'' br#\"a\"b\"# 1.5 'a: loop {}"),
        vec![
            Tok::Ident("type".into()),
            Tok::PathSep,
            Tok::Ident("x".into()),
            Tok::Literal,
            Tok::Literal,
            Tok::Literal,
            Tok::Punct('.'),
            Tok::Literal,
            Tok::Punct(':'),
            Tok::Ident("loop".into()),
            Tok::Punct('{'),
            Tok::Punct('}'),
        ]
    );
    assert_eq!(
        module_of("a/b/mod.rs"),
        vec!["a".to_string(), "b".to_string()]
    );
    assert_eq!(module_of("lib.rs"), Vec::<String>::new());
    assert_eq!(
        module_of("a/main.rs"),
        vec!["a".to_string(), "main".to_string()]
    );
}
