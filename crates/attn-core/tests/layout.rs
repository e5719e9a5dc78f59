//! The crate's shape, checked on its sources: no two files of `src/` import each other, even
//! through others, and the CPU layer (`src/cpu/`) names nothing of the crate outside it but the
//! error type. A file imports another when it names an item of it: `crate::…`, `super::…` or
//! a child module's path (items re-exported at the crate root count as their own module's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, as its path relative to `src/` (`cpu/amx.rs`).
fn sources(src: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(src).unwrap().to_path_buf());
        }
    }
}

/// The module path of a file: `cpu/mod.rs` and `cpu.rs` are `["cpu"]`, `lib.rs` is `[]`.
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// `text` without comments, string literals and its tests (`#[cfg(test)] mod tests`).
fn code_of(text: &str) -> String {
    let tests = [
        "#[cfg(test)]\nmod tests",
        "#[cfg(test)]\npub(crate) mod tests",
    ];
    let text = match tests.iter().filter_map(|t| text.find(t)).min() {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .map(|line| {
            // Strings could hold paths in messages; none of the crate's spans lines.
            let mut out = String::new();
            let mut in_string = false;
            let mut chars = line.chars();
            while let Some(c) = chars.next() {
                match (in_string, c) {
                    (true, '\\') => {
                        chars.next();
                    }
                    (_, '"') => in_string = !in_string,
                    (false, c) => out.push(c),
                    _ => {}
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a file names: each `crate::`, `super::` or child-module path, as the segments
/// after it (`use crate::cpu::{Isa, avx512}` names `["cpu", "Isa"]` and `["cpu", "avx512"]`).
fn paths_in(code: &str, children: &BTreeSet<String>) -> Vec<(String, Vec<String>)> {
    let bytes: Vec<char> = code.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && ident(bytes[i]) {
            i += 1;
        }
        let head: String = bytes[start..i].iter().collect();
        let root = match head.as_str() {
            "crate" | "super" => head.clone(),
            h if children.contains(h) => "self".to_string(),
            _ => continue,
        };
        // `pub(crate)`, `pub(super)`: visibility, not a path.
        if start >= 4 && bytes[start - 4..start].iter().collect::<String>() == "pub(" {
            continue;
        }
        let mut segments = if root == "self" {
            vec![head]
        } else {
            Vec::new()
        };
        let mut groups = Vec::new();
        while bytes.get(i) == Some(&':') && bytes.get(i + 1) == Some(&':') {
            i += 2;
            if bytes.get(i) == Some(&'{') {
                let end = (i..bytes.len())
                    .find(|&j| bytes[j] == '}')
                    .unwrap_or(bytes.len());
                let inner: String = bytes[i + 1..end].iter().collect();
                groups.extend(inner.split(',').filter_map(|item| {
                    let first = item.trim().split("::").next()?.split_whitespace().next()?;
                    Some(first.to_string())
                }));
                i = end;
                break;
            }
            let seg_start = i;
            while i < bytes.len() && ident(bytes[i]) {
                i += 1;
            }
            // A glob (`super::*`) names no module of its own.
            if i == seg_start {
                break;
            }
            segments.push(bytes[seg_start..i].iter().collect());
        }
        if segments.is_empty() && groups.is_empty() {
            continue;
        }
        match groups.is_empty() {
            true => found.push((root.clone(), segments)),
            false => {
                for item in groups.into_iter().filter(|g| g != "self" && g != "*") {
                    let mut path = segments.clone();
                    path.push(item);
                    found.push((root.clone(), path));
                }
            }
        }
    }
    found
}

/// The file of `module` + the longest prefix of `path` that is a module.
fn resolve<'a>(
    modules: &'a BTreeMap<Vec<String>, PathBuf>,
    reexports: &BTreeMap<String, Vec<String>>,
    base: &[String],
    path: &[String],
) -> Option<&'a PathBuf> {
    if base.is_empty()
        && path.len() == 1
        && let Some(module) = reexports.get(&path[0])
    {
        return resolve(modules, &BTreeMap::new(), module, &[]);
    }
    (0..=path.len()).rev().find_map(|n| {
        let mut module = base.to_vec();
        module.extend_from_slice(&path[..n]);
        modules.get(&module)
    })
}

/// Which file imports which: `src/`'s file-level import graph.
fn import_graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    sources(src, src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    // `pub use module::{A, B};` at the root: `crate::A` is `module`'s.
    let lib = code_of(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut reexports = BTreeMap::new();
    for line in lib.split(';') {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (module, items) = match rest.split_once("::{") {
            Some((module, items)) => (module, items.trim_end_matches('}').to_string()),
            None => match rest.rsplit_once("::") {
                Some((module, item)) => (module, item.to_string()),
                None => continue,
            },
        };
        let module: Vec<String> = module.split("::").map(str::to_string).collect();
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            reexports.insert(item.to_string(), module.clone());
        }
    }
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let children: BTreeSet<String> = (modules.keys())
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(&module))
            .map(|m| m[module.len()].clone())
            .collect();
        let code = code_of(&std::fs::read_to_string(src.join(file)).unwrap());
        let mut imports = BTreeSet::new();
        for (root, path) in paths_in(&code, &children) {
            let base: Vec<String> = match root.as_str() {
                "crate" => Vec::new(),
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.clone(),
            };
            let no_reexports = BTreeMap::new();
            let reexports = if root == "crate" {
                &reexports
            } else {
                &no_reexports
            };
            if let Some(target) = resolve(&modules, reexports, &base, &path)
                && target != file
            {
                imports.insert(target.clone());
            }
        }
        graph.insert(file.clone(), imports);
    }
    graph
}

/// A path from `from` back to itself through `graph`, if any.
fn cycle_through(
    graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    from: &Path,
) -> Option<Vec<PathBuf>> {
    let mut stack = vec![(from.to_path_buf(), vec![from.to_path_buf()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in &graph[&at] {
            if next == from {
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_file_of_the_crate_imports_itself_through_others() {
    let graph = import_graph(&src());
    assert!(graph.len() > 20, "{} files", graph.len());
    for file in graph.keys() {
        if let Some(cycle) = cycle_through(&graph, file) {
            panic!("an import circle: {cycle:?}");
        }
    }
}

#[test]
fn the_cpu_layer_imports_nothing_of_the_algorithms() {
    let graph = import_graph(&src());
    for (file, imports) in graph.iter().filter(|(f, _)| f.starts_with("cpu")) {
        for import in imports {
            assert!(
                import.starts_with("cpu") || import == Path::new("error.rs"),
                "{} imports {}",
                file.display(),
                import.display()
            );
        }
    }
}

/// The checker finds the circles it is for: the fused kernel's two passes, written as they
/// were before `fused/plan.rs` (each naming the other's items).
#[test]
fn the_checker_finds_a_circle() {
    let dir = std::env::temp_dir().join(format!("attn-core-layout-{}", std::process::id()));
    let fused = dir.join("fused");
    std::fs::create_dir_all(&fused).unwrap();
    std::fs::write(
        dir.join("lib.rs"),
        "mod fused;\nmod shape;\npub use shape::Shape;\n",
    )
    .unwrap();
    std::fs::write(dir.join("shape.rs"), "pub struct Shape;\n").unwrap();
    std::fs::write(
        fused.join("mod.rs"),
        "mod amx;\nuse amx::AmxHead;\npub struct Plan;\n",
    )
    .unwrap();
    std::fs::write(
        fused.join("amx.rs"),
        "use super::Plan;\nuse crate::Shape;\npub struct AmxHead;\n",
    )
    .unwrap();
    let graph = import_graph(&dir);
    let cycle = cycle_through(&graph, Path::new("fused/mod.rs"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        cycle,
        Some(vec![
            PathBuf::from("fused/mod.rs"),
            PathBuf::from("fused/amx.rs")
        ])
    );
    assert!(graph[Path::new("fused/amx.rs")].contains(Path::new("shape.rs")));
}
