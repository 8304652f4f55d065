//! The "never" rules of `ARCHITECTURE.md` (which module of the library may not reach which),
//! held against the code: every path that names a module is read (`use` items and their
//! groups, inline `crate::m::…` paths, `super::` crossings, paths inside macros) from the
//! library's sources with comments and literals taken out; test-only code (`#[cfg(test)]`
//! modules and files) may reach further. A rule written in `ARCHITECTURE.md` is one this test
//! holds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A module, as its path below the crate root (`["container", "site"]`).
type Module = Vec<String>;

/// One rule: code in `from` (a module or any module below it) never names `to` (likewise),
/// except in `except` (module paths below `from` that may).
struct Rule {
    from: &'static str,
    to: &'static [&'static str],
    except: &'static [&'static str],
    why: &'static str,
}

const RUNGS: &[&str] = &["container", "kube", "process", "inprocess", "oci"];

/// The rules, as `ARCHITECTURE.md`'s map states them.
const RULES: &[Rule] = &[
    Rule {
        from: "contract",
        to: &[
            "attempt",
            "link",
            "container",
            "kube",
            "process",
            "inprocess",
            "image",
            "profiles",
            "replay",
            "sandbox",
            "handlers",
            "inputs",
            "outputs",
            "hostdir",
            "pipe",
            "labels",
            "envlayer",
        ],
        except: &[],
        why: "contract imports nothing of the crate but util (and engine::EngineError behind docker)",
    },
    Rule {
        from: "util",
        to: &[
            "contract",
            "attempt",
            "link",
            "container",
            "kube",
            "process",
            "inprocess",
            "engine",
            "image",
            "profiles",
            "replay",
            "sandbox",
            "handlers",
            "inputs",
            "outputs",
            "hostdir",
            "pipe",
            "labels",
            "envlayer",
        ],
        except: &[],
        why: "util imports nothing of the crate",
    },
    Rule { from: "attempt", to: RUNGS, except: &[], why: "attempt names no rung" },
    Rule {
        from: "link",
        to: &["container", "kube", "process", "inprocess", "attempt"],
        except: &[],
        why: "link names no rung",
    },
    Rule { from: "container", to: &["kube", "process", "inprocess", "oci"], except: &[], why: "no rung names another" },
    Rule {
        from: "oci",
        to: &["container", "kube", "process", "inprocess"],
        except: &[],
        why: "oci names no other rung (its images come from the engine module, not the container rung)",
    },
    Rule {
        from: "kube",
        to: &["container", "process", "inprocess", "oci", "engine", "image", "profiles"],
        except: &[],
        why: "kube names no other rung and needs no Docker engine",
    },
    Rule {
        from: "process",
        to: &["container", "kube", "inprocess", "oci", "engine", "image", "profiles"],
        except: &[],
        why: "process names no other rung and builds without the docker feature",
    },
    Rule {
        from: "engine",
        to: &["container", "kube", "process", "inprocess", "oci", "attempt", "link", "sandbox"],
        except: &["engine::fake"],
        why: "engine holds no rung (its cfg(test) fake plays an engine of the init's architecture)",
    },
    Rule { from: "labels", to: RUNGS, except: &[], why: "labels are pure" },
    Rule { from: "envlayer", to: RUNGS, except: &[], why: "envlayer is pure" },
    Rule {
        from: "container::site",
        to: &[
            "container::attempt",
            "container::backstop",
            "container::caches",
            "container::cleanup",
            "container::executor",
            "container::finish",
            "container::journal",
            "container::launch",
            "container::mounts",
            "container::pool",
            "container::prepare",
            "container::reclaim",
            "container::recover",
            "container::spec",
            "container::stage",
            "container::tools",
        ],
        except: &[],
        why: "container::site imports no sibling but config and sizes",
    },
];

/// Nothing imports a rung's `executor` (its public face) but the rung's `mod.rs`.
const FACES: &[&str] = &["container::executor", "kube::executor", "process::executor", "inprocess::executor"];

fn lib_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lib/src")
}

/// `text` with comments, string and char literals blanked (their bytes become spaces, so
/// positions hold), lifetimes kept.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (0usize, i);
                while j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j);
                i = j;
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                let start = i + 2 + hashes;
                let end = b[start..].windows(close.len()).position(|w| w == close).map_or(b.len(), |p| start + p);
                blank(&mut out, i, end + close.len());
                i = end + close.len();
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i, j + 1);
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}'); else a lifetime or a label.
                let rest = &text[i + 1..];
                let end = if let Some(escaped) = rest.strip_prefix('\\') {
                    escaped.find('\'').map(|n| n + 1)
                } else {
                    rest.chars().next().filter(|_| rest.chars().nth(1) == Some('\'')).map(|c| c.len_utf8())
                };
                match end {
                    Some(n) => {
                        blank(&mut out, i, i + n + 2);
                        i += n + 2;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were changed")
}

/// `code` without its `#[cfg(test)]` items (a module block, or one item up to its `;` or its
/// block): test code may reach further than the rules.
fn without_tests(code: &str) -> String {
    let mut out = code.to_owned();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(test)]").map(|p| p + from) {
        let after = at + "#[cfg(test)]".len();
        let brace = out[after..].find('{').map(|p| p + after);
        let semi = out[after..].find(';').map(|p| p + after);
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (Some(b), _) => {
                let mut depth = 0;
                let mut end = out.len();
                for (k, c) in out[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => s + 1,
            (None, None) => out.len(),
        };
        let blanked: String = out[at..end].chars().map(|c| if c == '\n' { '\n' } else { ' ' }).collect();
        out.replace_range(at..end, &blanked);
        from = end;
    }
    out
}

/// The module a source file is.
fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).unwrap();
    let mut m: Module = rel.iter().map(|s| s.to_string_lossy().trim_end_matches(".rs").to_owned()).collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
        m.pop();
    }
    m
}

/// The files only tests compile (`#[cfg(test)] mod x;`).
fn test_only_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut only = BTreeSet::new();
    for f in files {
        let code = code_only(&std::fs::read_to_string(f).unwrap());
        let dir = if f.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs") {
            f.parent().unwrap().to_owned()
        } else {
            f.with_extension("")
        };
        let mut rest = code.as_str();
        while let Some(p) = rest.find("#[cfg(test)]") {
            rest = &rest[p + "#[cfg(test)]".len()..];
            let decl: String = rest.chars().take_while(|&c| c != ';' && c != '{').collect();
            let words: Vec<&str> = decl.split_whitespace().collect();
            if let Some(i) = words.iter().position(|w| *w == "mod")
                && let Some(name) = words.get(i + 1)
                && rest[decl.len()..].starts_with(';')
            {
                only.insert(dir.join(format!("{name}.rs")));
                only.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    only
}

/// Every module path `code` names (in `module`), resolved to a path below the crate root.
fn references(code: &str, module: &Module) -> Vec<Module> {
    let mut found = Vec::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let starts = ["$crate", "crate", "super", "self"].iter().find(|w| {
            code[i..].starts_with(**w)
                && (i == 0 || !(ident(b[i - 1]) || b[i - 1] == b'$' || b[i - 1] == b':'))
                && !b.get(i + w.len()).is_some_and(|&c| ident(c))
        });
        let Some(start) = starts else {
            i += 1;
            continue;
        };
        let (path, end) = path_at(code, i);
        i = end.max(i + start.len());
        if path.len() < 2 {
            continue;
        }
        for p in expand(&path) {
            if let Some(m) = resolve(&p, module) {
                found.push(m);
            }
        }
    }
    found
}

/// The path starting at `i` as its segments, a brace group kept as one segment (`{a, b::c}`);
/// and where it ends.
fn path_at(code: &str, i: usize) -> (Vec<String>, usize) {
    let b = code.as_bytes();
    let mut segs = Vec::new();
    let mut j = i;
    loop {
        let start = j;
        if b.get(j) == Some(&b'{') {
            let mut depth = 0;
            while j < b.len() {
                match b[j] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            j += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            segs.push(code[start..j].to_owned());
            return (segs, j);
        }
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || (j == start && b[j] == b'$')) {
            j += 1;
        }
        if j == start {
            return (segs, j);
        }
        segs.push(code[start..j].to_owned());
        let k = code[j..].len() - code[j..].trim_start().len() + j;
        if code[k..].starts_with("::") {
            j = k + 2;
            j += code[j..].len() - code[j..].trim_start().len();
        } else {
            return (segs, j);
        }
    }
}

/// A path whose last segment is a brace group, as every path it names.
fn expand(path: &[String]) -> Vec<Vec<String>> {
    let Some(last) = path.last().filter(|l| l.starts_with('{')) else { return vec![path.to_vec()] };
    let inner = &last[1..last.len() - 1];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    let head = &path[..path.len() - 1];
    items
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .flat_map(|item| {
            let (sub, _) = path_at(item, 0);
            let mut p = head.to_vec();
            p.extend(sub);
            expand(&p)
        })
        .collect()
}

/// `path` (starting `crate`, `$crate`, `super` or `self`) as a module path below the root;
/// `None` when it leaves the crate or names nothing below it.
fn resolve(path: &[String], module: &Module) -> Option<Module> {
    // A file's module (`module_of`: `mod.rs` is its directory's), whose `super` is one up.
    let mut at: Module = match path[0].as_str() {
        "crate" | "$crate" => Vec::new(),
        "super" | "self" => module.clone(),
        _ => return None,
    };
    let mut rest = if path[0] == "super" { path } else { &path[1..] };
    while let Some(first) = rest.first() {
        if first == "super" {
            at.pop()?;
            rest = &rest[1..];
        } else {
            break;
        }
    }
    at.extend(rest.iter().filter(|s| s.as_str() != "self" && s.as_str() != "*").cloned());
    (!at.is_empty()).then_some(at)
}

fn under(m: &[String], prefix: &str) -> bool {
    let p: Vec<&str> = prefix.split("::").collect();
    m.len() >= p.len() && m.iter().zip(&p).all(|(a, b)| a == b)
}

/// What breaks a rule in the library's sources, as `file:line: rule: path`.
fn broken(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    let test_only = test_only_files(&files);
    let mut out = Vec::new();
    for f in files.iter().filter(|f| !test_only.contains(*f)) {
        let text = std::fs::read_to_string(f).unwrap();
        let code = without_tests(&code_only(&text));
        let module = module_of(root, f);
        let refs = references(&code, &module);
        let line_of = |needle: &str| code.find(needle).map_or(0, |p| code[..p].lines().count() + 1);
        for target in refs {
            let name = target.join("::");
            for rule in RULES {
                let from_here = under(&module, rule.from) && !rule.except.iter().any(|e| under(&module, e));
                if from_here && rule.to.iter().any(|t| under(&target, t)) && !under(&target, rule.from) {
                    let last = target.last().cloned().unwrap_or_default();
                    out.push(format!("{}:{}: {}: {name}", f.display(), line_of(&last), rule.why));
                }
            }
            // A rung's `mod.rs` declares its face by a bare path (`pub use executor::…`), which
            // is not read; every other path to it breaks the rule.
            if FACES.iter().any(|face| under(&target, face)) && !under(&module, &target[..2].join("::")) {
                out.push(format!("{}: nothing imports a rung's executor: {name}", f.display()));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_never_rules_of_the_architecture_hold_in_the_code() {
    let broken = broken(&lib_src());
    assert!(broken.is_empty(), "rules of ARCHITECTURE.md broken:\n{}", broken.join("\n"));
}

#[test]
fn the_reader_finds_every_kind_of_path() {
    let m = |s: &str| s.split("::").map(str::to_owned).collect::<Module>();
    let code = code_only(
        r#"
        use super::{config::X, sizes::{self, Y}};
        use crate::contract::{Outcome, limits::Limits};
        // crate::kube::in_a_comment
        let s = "crate::kube::in_a_string";
        fn f<'a>(c: char) { let _ = 'x'; crate::kube::inline(); }
        macro_rules! m { () => { $crate::link::thing() } }
        let x = super::super::engine::api::Thing;
        #[cfg(test)]
        mod tests { use crate::process::tested; }
    "#,
    );
    let refs = references(&without_tests(&code), &m("container::site"));
    let names: BTreeSet<String> = refs.iter().map(|r| r.join("::")).collect();
    for want in [
        "container::config::X",
        "container::sizes",
        "container::sizes::Y",
        "contract::Outcome",
        "contract::limits::Limits",
        "kube::inline",
        "link::thing",
        "engine::api::Thing",
    ] {
        assert!(names.contains(want), "{want} not found in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("in_a_") || n.contains("process")), "{names:?}");
}

#[test]
fn a_path_against_a_rule_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in [
        ("contract/mod.rs", "mod error;\n"),
        ("contract/error.rs", "fn f() { let _ = crate::kube::ClusterError::Closed; }\n"),
        ("container/site.rs", "use super::pool::PoolStats;\n"),
        (
            "attempt/mod.rs",
            "fn g() { crate::container::run(); }\n#[cfg(test)]\nmod tests { fn t() { crate::kube::x(); } }\n",
        ),
        ("kube/mod.rs", "mod executor;\n"),
        ("kube/other.rs", "use super::executor::KubeExecutor;\n"),
    ] {
        let p = dir.path().join(file);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let broken = broken(dir.path()).join("\n");
    assert!(broken.contains("contract/error.rs") && broken.contains("kube::ClusterError"), "{broken}");
    assert!(broken.contains("container/site.rs") && broken.contains("container::pool::PoolStats"), "{broken}");
    assert!(broken.contains("attempt/mod.rs") && broken.contains("container::run"), "{broken}");
    assert!(broken.contains("kube/other.rs") && broken.contains("executor"), "{broken}");
    assert!(!broken.contains("kube::x"), "test code may reach further: {broken}");
    assert!(!broken.contains("kube/mod.rs"), "a rung's mod.rs declares its face: {broken}");
}
