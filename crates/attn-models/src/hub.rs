//! Models from the Hugging Face hub's local cache: `--model gpt2` or
//! `--model sentence-transformers/all-MiniLM-L6-v2@main` finds the snapshot that
//! `huggingface_hub` (transformers' `from_pretrained`, `hf download`) left in the
//! cache, laid out as
//!
//! ```text
//! $HF_HUB_CACHE/models--ORG--NAME/refs/main            the commit the branch points at
//! $HF_HUB_CACHE/models--ORG--NAME/snapshots/COMMIT/…   the files (links into ../../blobs)
//! ```
//!
//! with the cache at `$HF_HUB_CACHE` (or the older `$HUGGINGFACE_HUB_CACHE`), else
//! `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`, as
//! `huggingface_hub` places it
//! (<https://huggingface.co/docs/huggingface_hub/guides/manage-cache>). Nothing is downloaded. A
//! directory of the given name comes first, so a local `./gpt2` is never shadowed.

use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// The directory `spec` names: itself when it is one (or cannot be a model id: a path, which
/// [`crate::Model::load`] then reports missing), else the snapshot of the model id
/// `REPO[@REVISION]` in the Hugging Face cache (revision `main` by default: a branch or tag in
/// `refs/`, or a commit).
///
/// # Errors
/// [`ModelError::HubCache`] when `spec` is a model id that the cache does not hold (or holds
/// unreadably), naming where it looked and the revisions it has.
pub fn resolve_model(spec: &Path) -> Result<PathBuf, ModelError> {
    resolve_in(spec, hub_cache(crate::fetch::env_path).as_deref())
}

/// [`resolve`] against the cache at `hub` (none: no cache location is set).
pub fn resolve_in(spec: &Path, hub: Option<&Path>) -> Result<PathBuf, ModelError> {
    let Some((repo, revision)) = model_id(spec) else {
        return Ok(spec.to_path_buf());
    };
    // A directory comes first, and so does a broken or looping link: its error (cannot read)
    // then names it rather than the cache. A file of that name does not hide the cache.
    let broken_link = crate::config::present(spec) && std::fs::metadata(spec).is_err();
    if spec.is_dir() || broken_link {
        return Ok(spec.to_path_buf());
    }
    let missing = |reason: String| {
        Err(ModelError::HubCache {
            spec: spec.display().to_string(),
            reason,
        })
    };
    let Some(hub) = hub else {
        return missing(
            "no such directory, and no Hugging Face cache to look in (none of HF_HUB_CACHE, \
             HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is set)"
                .into(),
        );
    };
    let folder = hub.join(format!("models--{}", repo.replace('/', "--")));
    match std::fs::metadata(&folder) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return missing(format!("{} is not a folder", folder.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let name = folder.file_name().unwrap_or_default().to_string_lossy();
            return missing(format!(
                "no such directory, and the Hugging Face cache {} has no {name} (`hf download \
                 {repo}` puts it there)",
                hub.display(),
            ));
        }
        Err(e) => return missing(format!("cannot read {}: {e}", folder.display())),
    }
    // A branch or tag names its commit in `refs/`; a commit is a snapshot's own name.
    let reference = folder.join("refs").join(revision);
    let commit = match read_reference(&reference) {
        Ok(Some(commit)) if revision_part(&commit) => commit,
        Ok(Some(commit)) => {
            return missing(format!(
                "{} names {commit:?}, which is no commit",
                reference.display()
            ));
        }
        Ok(None) => revision.to_string(),
        Err(reason) => return missing(format!("{}: {reason}", reference.display())),
    };
    let snapshot = folder.join("snapshots").join(&commit);
    match std::fs::metadata(&snapshot) {
        Ok(meta) if meta.is_dir() => Ok(snapshot),
        Ok(_) => missing(format!("{} is not a folder", snapshot.display())),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            missing(format!("cannot read {}: {e}", snapshot.display()))
        }
        Err(_) if commit != revision => missing(format!(
            "{} names commit {commit}, which the cache has no snapshot of (it has: {})",
            reference.display(),
            listed(names(&folder.join("snapshots")))
        )),
        Err(_) => missing(format!(
            "the Hugging Face cache {} holds no revision {revision:?} of {repo} (it has: {})",
            hub.display(),
            revisions(&folder)
        )),
    }
}

/// The commit a branch or tag file names (`None` when there is no such file): a regular file
/// of at most [`MAX_REFERENCE`] bytes, trimmed.
fn read_reference(path: &Path) -> Result<Option<String>, String> {
    use std::io::Read;
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    // Checked before opening: a named pipe would block the open for ever.
    if !meta.is_file() {
        return Err("not a file".into());
    }
    if meta.len() > MAX_REFERENCE {
        return Err(format!(
            "{} bytes, where a commit takes {MAX_REFERENCE} at most",
            meta.len()
        ));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_REFERENCE).read_to_string(&mut text))
        .map_err(|e| format!("cannot read it: {e}"))?;
    Ok(Some(text.trim().to_string()))
}

/// The longest branch or tag file read: a commit is 40 hexadecimal digits.
const MAX_REFERENCE: u64 = 1024;

/// The model id and commit of a snapshot directory of the cache, for titles:
/// `…/models--ORG--NAME/snapshots/COMMIT` → `ORG/NAME@COMMIT`, the commit cut to 7 characters
/// as git shortens it, so that a picture says which weights made it.
pub fn repo_of(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let commit = dir.file_name()?.to_str()?;
    let snapshots = dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let folder = snapshots.parent()?.file_name()?.to_str()?;
    let repo = folder.strip_prefix("models--")?.replace("--", "/");
    let short: String = commit.chars().take(7).collect();
    Some(format!("{repo}@{short}"))
}

/// The cache `huggingface_hub` uses, from the environment variables `var` reads.
pub fn hub_cache(var: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    // `~/` at the start stands for the home folder, as `huggingface_hub` expands it.
    let expanded = |name: &str| {
        let path = var(name)?;
        match path.strip_prefix("~") {
            Ok(rest) => Some(var("HOME")?.join(rest)),
            Err(_) => Some(path),
        }
    };
    expanded("HF_HUB_CACHE")
        .or_else(|| expanded("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| expanded("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| expanded("XDG_CACHE_HOME").map(|cache| cache.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|home| home.join(".cache").join("huggingface").join("hub")))
}

/// `REPO[@REVISION]` when `spec` reads as a Hugging Face model id (`NAME` or `ORG/NAME` of
/// letters, digits, `-`, `_` and `.`, not starting with `.` nor holding `..` or `--`; a
/// revision of the same characters and `/`, as `refs/pr/1` has), else `None`.
fn model_id(spec: &Path) -> Option<(&str, &str)> {
    let spec = spec.to_str()?;
    let (repo, revision) = spec.split_once('@').unwrap_or((spec, "main"));
    let parts: Vec<&str> = repo.split('/').collect();
    let name_ok = |part: &&str| {
        !part.is_empty()
            && part.len() <= 96
            && !part.starts_with('.')
            && !part.contains("..")
            && !part.contains("--")
            && part.chars().all(id_char)
    };
    let revision_ok = !revision.is_empty() && revision.split('/').all(revision_part);
    (parts.len() <= 2 && parts.iter().all(name_ok) && revision_ok).then_some((repo, revision))
}

/// One `/`-separated part of a revision or commit: a plain name, never `.` or `..`.
fn revision_part(part: &str) -> bool {
    !part.is_empty() && part != "." && part != ".." && part.chars().all(id_char)
}

/// A character of a model id's names and of revisions: a letter, a digit, `-`, `_` or `.`.
fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// The revisions a model's folder holds: its branches and tags (`refs/`), then its snapshots.
fn revisions(folder: &Path) -> String {
    let mut all = names(&folder.join("refs"));
    all.extend(names(&folder.join("snapshots")));
    listed(all)
}

/// `names` joined by commas, or "none".
fn listed(names: Vec<String>) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The sorted names in `dir` (none when it cannot be read).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_and_paths() {
        fn id(s: &str) -> Option<(&str, &str)> {
            model_id(Path::new(s))
        }
        assert_eq!(id("gpt2"), Some(("gpt2", "main")));
        assert_eq!(
            id("sentence-transformers/all-MiniLM-L6-v2@v1.0"),
            Some(("sentence-transformers/all-MiniLM-L6-v2", "v1.0"))
        );
        assert_eq!(id("org/name@pr/1"), Some(("org/name", "pr/1")));
        for path in [
            "/abs/model",
            "./gpt2",
            "a/b/c",
            "../up",
            "a/..",
            "org/name@../../etc",
            "org/name@",
            "a--b",
            "a..b",
            "org/x..y",
            "",
            "model dir",
        ] {
            assert_eq!(id(path), None, "{path}");
        }
    }

    #[test]
    fn the_cache_follows_huggingface_hub() {
        fn env<'a>(pairs: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<PathBuf> + 'a {
            move |name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| PathBuf::from(v))
            }
        }
        let all = [
            ("HF_HUB_CACHE", "/hub"),
            ("HF_HOME", "/hf"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(hub_cache(env(&all)), Some("/hub".into()));
        assert_eq!(
            hub_cache(env(&[
                ("HUGGINGFACE_HUB_CACHE", "/old"),
                ("HF_HOME", "/hf")
            ])),
            Some("/old".into())
        );
        assert_eq!(
            hub_cache(env(&[
                ("HUGGINGFACE_HUB_CACHE", "/old"),
                ("HF_HUB_CACHE", "/hub")
            ])),
            Some("/hub".into())
        );
        assert_eq!(
            hub_cache(env(&[("HF_HOME", "~/hf"), ("HOME", "/home/u")])),
            Some("/home/u/hf/hub".into())
        );
        assert_eq!(hub_cache(env(&all[1..])), Some("/hf/hub".into()));
        assert_eq!(
            hub_cache(env(&all[2..])),
            Some("/xdg/huggingface/hub".into())
        );
        assert_eq!(
            hub_cache(env(&all[3..])),
            Some("/home/u/.cache/huggingface/hub".into())
        );
        assert_eq!(hub_cache(env(&[])), None);
    }
}
