//! The house as docs/architecture.md draws it, held against the code.
//!
//! - **Crate floors** ("Crates and their floors"): a crate's `[dependencies]` on the
//!   workspace's crates point at lower floors only.
//! - **control's floors** ("crates/control"): every top-level module of crates/control is on
//!   one floor, and a module names only modules on floors below its own.
//! - **No import circles** ("Rules that keep it so"): between the files of a crate, the modules
//!   one file names form no loop.
//!
//! Files are parsed with `syn`. A file names module M where a `use` (grouped or not, `pub use`
//! only if the file uses the name itself: a face passing a child's name on draws nothing) or a
//! path in its code, in a macro's tokens too, starts with `crate::`, `super::`, `self::`, a
//! child module, or a name a `use` brought in for a module; the path belongs to the deepest
//! module along it that is a file. A file naming a module it sits inside (its parents, up to the
//! crate root) names nothing: a child lives in its parent's scope. Test code is not read: items
//! and `mod` files under `#[cfg(test)]`. Comments, doc links and literals are no paths.

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

type Module = Vec<String>;

#[test]
fn crates_depend_only_on_lower_floors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let floors = crate_floors(&read(&root.join("docs/architecture.md")));
    assert!(floors.len() >= 6, "crate floors not found: {floors:?}");
    let mut wrong = Vec::new();
    for (dir, floor) in &floors {
        let manifest = read(&root.join(dir.trim_end_matches("src/")).join("Cargo.toml"));
        for dep in workspace_dependencies(&manifest) {
            let dir_of_dep = format!("crates/{}", dep.trim_start_matches("twill-"));
            match floors.get(&dir_of_dep) {
                Some(below) if below < floor => {}
                other => wrong.push(format!("{dir} (floor {floor}) -> {dep} ({other:?})")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies not pointing down:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn control_modules_import_only_lower_floors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let floors = module_floors(&read(&root.join("docs/architecture.md")));
    let krate = Crate::read(&root.join("crates/control/src"));
    let declared: BTreeSet<String> = krate
        .modules
        .iter()
        .filter(|m| m.len() == 1)
        .map(|m| m[0].clone())
        .collect();
    let drawn: BTreeSet<String> = floors.keys().cloned().collect();
    assert_eq!(
        declared, drawn,
        "control's modules and the floors architecture.md draws differ"
    );
    let mut wrong = BTreeSet::new();
    for (file, named) in krate.edges() {
        let (Some(from), Some(to)) = (file.first(), named.first()) else {
            continue;
        };
        if from != to && floors[to] >= floors[from] {
            wrong.insert(format!(
                "{from} (floor {}) -> {to} (floor {})",
                floors[from], floors[to]
            ));
        }
    }
    let wrong: Vec<String> = wrong.into_iter().collect();
    assert!(
        wrong.is_empty(),
        "imports that do not point down a floor:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("src")];
    let crates = std::fs::read_dir(root.join("crates")).expect("read crates/");
    dirs.extend(
        crates
            .map(|e| e.expect("crates/").path().join("src"))
            .filter(|p| p.is_dir()),
    );
    let mut circles = Vec::new();
    for dir in dirs {
        let krate = Crate::read(&dir);
        let label = dir
            .strip_prefix(root)
            .expect("under the workspace")
            .display();
        assert!(krate.files.len() > 2, "{label}: too few files");
        for circle in krate.circles() {
            let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
            circles.push(format!("{label}: {}", names.join(" <-> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}\nMove what both sides use down, into a module of its own.",
        circles.join("\n")
    );
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fenced block under `heading`, as lines.
fn block_under<'a>(doc: &'a str, heading: &str) -> Vec<&'a str> {
    let after = doc
        .split_once(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"))
        .1;
    let block = after.split("```").nth(1).expect("a fenced block");
    block.lines().collect()
}

/// `crates/x` (or `src/`) -> floor, from "Crates and their floors".
fn crate_floors(doc: &str) -> BTreeMap<String, u32> {
    let mut floors = BTreeMap::new();
    let mut floor = 0;
    for line in block_under(doc, "## Crates and their floors") {
        let mut words = line.split_whitespace().peekable();
        if words.peek() == Some(&"floor") {
            words.next();
            floor = words.next().and_then(|n| n.parse().ok()).expect("floor N");
        }
        if let Some(dir) = words
            .next()
            .filter(|w| w.starts_with("crates/") || *w == "src/")
        {
            floors.insert(dir.to_string(), floor);
        }
    }
    floors
}

/// Module -> floor, from the block under "## crates/control".
fn module_floors(doc: &str) -> BTreeMap<String, u32> {
    let mut floors = BTreeMap::new();
    for line in block_under(doc, "## crates/control") {
        let mut words = line.split_whitespace();
        if words.next() != Some("floor") {
            continue;
        }
        let floor: u32 = words.next().and_then(|n| n.parse().ok()).expect("floor N");
        floors.extend(words.map(|m| (m.to_string(), floor)));
    }
    floors
}

/// The `twill-*` names under a manifest's `[dependencies]`.
fn workspace_dependencies(manifest: &str) -> Vec<String> {
    let section = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .unwrap_or_default();
    let section = section.split("\n[").next().unwrap_or_default();
    let names = section
        .lines()
        .filter_map(|l| l.split(['.', ' ', '=']).next());
    names
        .filter(|n| n.starts_with("twill-"))
        .map(str::to_string)
        .collect()
}

/// The files of one crate (a `lib.rs` or `main.rs` tree), parsed.
struct Crate {
    files: BTreeMap<Module, syn::File>,
    /// Every module that is a file.
    modules: BTreeSet<Module>,
}

impl Crate {
    /// The crate rooted in `dir`'s `lib.rs` (else `main.rs`); a `main.rs` beside a `lib.rs` is
    /// a crate of its own that declares no modules here.
    fn read(dir: &Path) -> Crate {
        let root = ["lib.rs", "main.rs"]
            .into_iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists());
        let root = root.unwrap_or_else(|| panic!("{}: no lib.rs or main.rs", dir.display()));
        let mut files = BTreeMap::new();
        let mut todo: Vec<(Module, PathBuf)> = vec![(vec![], root)];
        while let Some((module, path)) = todo.pop() {
            let file =
                syn::parse_file(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let own_dir = match path.file_name().and_then(|n| n.to_str()) {
                Some("lib.rs" | "main.rs" | "mod.rs") => path.parent().unwrap().to_path_buf(),
                _ => path.with_extension(""),
            };
            for item in &file.items {
                let syn::Item::Mod(m) = item else { continue };
                if m.content.is_some() || is_test(&m.attrs) {
                    continue;
                }
                let name = m.ident.to_string();
                let flat = own_dir.join(format!("{name}.rs"));
                let path = if flat.exists() {
                    flat
                } else {
                    own_dir.join(&name).join("mod.rs")
                };
                todo.push(([module.clone(), vec![name]].concat(), path));
            }
            files.insert(module, file);
        }
        let modules = files.keys().cloned().collect();
        Crate { files, modules }
    }

    /// (file, module it names) for every name one file takes from another.
    fn edges(&self) -> BTreeSet<(Module, Module)> {
        let mut edges = BTreeSet::new();
        for (module, file) in &self.files {
            let mut names = Names::new(module, &self.modules);
            names.visit_file(file);
            for target in names.targets() {
                if !module.starts_with(&target) {
                    edges.insert((module.clone(), target));
                }
            }
        }
        edges
    }

    /// The sets of two or more files that name each other in a loop.
    fn circles(&self) -> Vec<Vec<Module>> {
        let edges = self.edges();
        let reach = |from: &Module| -> BTreeSet<Module> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from.clone()];
            while let Some(m) = todo.pop() {
                for (_, to) in edges
                    .range((m.clone(), vec![])..)
                    .take_while(|(f, _)| *f == m)
                {
                    if seen.insert(to.clone()) {
                        todo.push(to.clone());
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&Module, BTreeSet<Module>> =
            self.modules.iter().map(|m| (m, reach(m))).collect();
        let mut circles: Vec<Vec<Module>> = Vec::new();
        for (m, from_m) in &reaches {
            if !from_m.contains(*m) || circles.iter().any(|c| c.contains(m)) {
                continue;
            }
            let circle = from_m
                .iter()
                .filter(|o| reaches[o].contains(*m))
                .cloned()
                .collect();
            circles.push(circle);
        }
        circles
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// What one file names, found by walking its syntax.
struct Names<'a> {
    module: &'a Module,
    modules: &'a BTreeSet<Module>,
    /// Names a `use` brought in, as the absolute paths they stand for.
    aliases: BTreeMap<String, Module>,
    /// Absolute paths the file names.
    named: Vec<Module>,
    /// Paths of `pub use`s, with the name each brings in.
    passed_on: Vec<(String, Module)>,
    /// The first segment of every path in the code.
    used: BTreeSet<String>,
}

impl<'a> Names<'a> {
    fn new(module: &'a Module, modules: &'a BTreeSet<Module>) -> Self {
        let (aliases, named, passed_on, used) = Default::default();
        Names {
            module,
            modules,
            aliases,
            named,
            passed_on,
            used,
        }
    }

    /// The path `segments` from the crate root, if it is in this crate.
    fn absolute(&self, segments: &[String]) -> Option<Module> {
        let (first, rest) = segments.split_first()?;
        let mut base = self.module.clone();
        match first.as_str() {
            "crate" => return Some(rest.to_vec()),
            "self" => return Some([base, rest.to_vec()].concat()),
            "super" => {
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                return Some([base, rest.to_vec()].concat());
            }
            _ => {}
        }
        base.push(first.clone());
        if self.modules.contains(&base) {
            return Some([base, rest.to_vec()].concat());
        }
        let alias = self
            .aliases
            .get(first)
            .filter(|a| self.modules.contains(*a))?;
        Some([alias.clone(), rest.to_vec()].concat())
    }

    /// The file module `path` belongs to: the deepest one along it.
    fn file_of(&self, path: &Module) -> Module {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| self.modules.contains(m))
            .unwrap_or_default()
    }

    fn targets(&self) -> BTreeSet<Module> {
        let passed = self
            .passed_on
            .iter()
            .filter(|(name, _)| self.used.contains(name));
        let paths = self.named.iter().chain(passed.map(|(_, p)| p));
        paths.map(|p| self.file_of(p)).collect()
    }

    fn use_tree(&mut self, prefix: &[String], tree: &syn::UseTree, public: bool) {
        let leaf = |ident: &syn::Ident| [prefix, &[ident.to_string()]].concat();
        let (path, name) = match tree {
            syn::UseTree::Path(p) => return self.use_tree(&leaf(&p.ident), &p.tree, public),
            syn::UseTree::Group(g) => {
                return g
                    .items
                    .iter()
                    .for_each(|t| self.use_tree(prefix, t, public))
            }
            syn::UseTree::Name(n) => (leaf(&n.ident), n.ident.to_string()),
            syn::UseTree::Rename(r) => (leaf(&r.ident), r.rename.to_string()),
            syn::UseTree::Glob(_) => (prefix.to_vec(), "*".to_string()),
        };
        let Some(absolute) = self.absolute(&path) else {
            return;
        };
        self.aliases.insert(name.clone(), absolute.clone());
        match public {
            true => self.passed_on.push((name, absolute)),
            false => self.named.push(absolute),
        }
    }

    fn path(&mut self, segments: Vec<String>) {
        if let Some(first) = segments.first() {
            self.used.insert(first.clone());
        }
        if segments.len() > 1 {
            if let Some(absolute) = self.absolute(&segments) {
                self.named.push(absolute);
            }
        }
    }

    /// Paths in a macro's tokens: runs of `ident :: ident …`.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        for token in tokens {
            match token {
                TokenTree::Ident(i) if run.is_empty() || colons == 2 => {
                    run.push(i.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1
                }
                other => {
                    self.path(std::mem::take(&mut run));
                    colons = 0;
                    match other {
                        TokenTree::Group(g) => self.tokens(g.stream()),
                        TokenTree::Ident(i) => run.push(i.to_string()),
                        _ => {}
                    }
                }
            }
        }
        self.path(run);
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let public = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&[], &item.tree, public);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.path(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

// ---------------------------------------------------------------------------------------------
// The reading itself, on small crates written here.

/// The edges among `files` (`(path under src, text)`), as `from -> to` module paths.
fn edges_of(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    for (rel, text) in files {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let show = |m: &Module| {
        if m.is_empty() {
            "crate".to_string()
        } else {
            m.join("::")
        }
    };
    let krate = Crate::read(dir.path());
    krate
        .edges()
        .iter()
        .map(|(f, t)| format!("{} -> {}", show(f), show(t)))
        .collect()
}

#[test]
fn uses_of_every_spelling_are_read() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b; mod c; mod d;"),
        ("a.rs", "use crate::{b::B, c::{self, C}};\nuse super::d::*;"),
        ("b.rs", "pub struct B;"),
        ("c.rs", "pub struct C;"),
        ("d.rs", "pub struct D;"),
    ]);
    assert_eq!(edges, ["a -> b", "a -> c", "a -> d"]);
}

#[test]
fn a_path_belongs_to_the_deepest_file_along_it() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "fn f() { crate::b::inner::g(); crate::b::X; }"),
        ("b/mod.rs", "pub mod inner; pub struct X;"),
        ("b/inner.rs", "pub fn g() {}"),
    ]);
    assert_eq!(edges, ["a -> b", "a -> b::inner"]);
}

#[test]
fn inline_paths_aliases_children_and_macros_are_read() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b; mod c; mod d;"),
        (
            "a.rs",
            "mod kid; use crate::b; fn f() { b::g(); kid::h(); }",
        ),
        ("a/kid.rs", "pub fn h() {}"),
        ("b.rs", "pub fn g() {}"),
        ("c.rs", "fn f() { tracing::warn!(\"{}\", crate::d::D); }"),
        ("d.rs", "pub struct D;"),
    ]);
    assert_eq!(edges, ["a -> a::kid", "a -> b", "c -> d"]);
}

#[test]
fn test_code_comments_literals_and_parents_are_not_read() {
    let edges = edges_of(&[
        ("lib.rs", "mod a; mod b;"),
        (
            "a/mod.rs",
            "//! See [`crate::b::Doc`].\nmod kid;\nconst S: &str = \"crate::b::S\";\n\
             #[cfg(test)]\nmod tests { use crate::b::T; }\n#[cfg(test)]\nmod more;",
        ),
        ("a/kid.rs", "use super::S; use crate::a::S as T;"),
        ("a/more.rs", "use crate::b::M;"),
        ("b.rs", ""),
    ]);
    assert_eq!(edges, Vec::<String>::new());
}

#[test]
fn a_re_export_counts_only_where_the_file_uses_the_name() {
    let passed_on = edges_of(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a.rs", "pub use crate::b::B;"),
        ("b.rs", "pub struct B;"),
    ]);
    assert_eq!(passed_on, Vec::<String>::new());
    let used = edges_of(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a.rs", "pub use crate::b::B;\npub fn f() -> B { B }"),
        ("b.rs", "pub struct B;"),
    ]);
    assert_eq!(used, ["a -> b"]);
}

#[test]
fn circles_are_found_and_floors_read() {
    let dir = tempfile::tempdir().unwrap();
    for (rel, text) in [
        ("lib.rs", "mod a; mod b; mod c; mod d;"),
        ("a.rs", "use crate::b::B;"),
        ("b.rs", "use crate::c::C;"),
        ("c.rs", "use crate::a::A; use crate::d::D;"),
        ("d.rs", ""),
    ] {
        std::fs::write(dir.path().join(rel), text).unwrap();
    }
    let m = |s: &str| vec![s.to_string()];
    assert_eq!(
        Crate::read(dir.path()).circles(),
        [vec![m("a"), m("b"), m("c")]]
    );
    let doc = "## crates/control\n\n```\nfloor  2  a b\nfloor  1  c\n```\n";
    assert_eq!(
        module_floors(doc),
        [("a".into(), 2), ("b".into(), 2), ("c".into(), 1)].into()
    );
    let doc = "## Crates and their floors\n\n```\nfloor 2   crates/x   what\n          crates/y\n\
               floor 1   crates/z   it is\n```\n";
    let floors = crate_floors(doc);
    assert_eq!(
        floors,
        [
            ("crates/x".into(), 2),
            ("crates/y".into(), 2),
            ("crates/z".into(), 1)
        ]
        .into()
    );
    let manifest = "[package]\n\n[dependencies]\ntwill-z.workspace = true\nanyhow = \"1\"\n\n[dev-dependencies]\ntwill-lab = { path = \"x\" }\n";
    assert_eq!(workspace_dependencies(manifest), ["twill-z"]);
}
