//! Models from the Hugging Face hub's local cache: `--model gpt2` or
//! `--model sentence-transformers/all-MiniLM-L6-v2@main` finds the snapshot that
//! `huggingface_hub` (transformers' `from_pretrained`, `huggingface-cli download`) left in the
//! cache, laid out as
//!
//! ```text
//! $HF_HUB_CACHE/models--ORG--NAME/refs/main            the commit the branch points at
//! $HF_HUB_CACHE/models--ORG--NAME/snapshots/COMMIT/…   the files (links into ../../blobs)
//! ```
//!
//! with the cache at `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`, as `huggingface_hub`
//! places it. Nothing is downloaded. A directory of the given name comes first, so a local
//! `./gpt2` is never shadowed.

use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// The directory `spec` names: itself when it exists (or cannot be a model id: a path, which
/// [`crate::Model::load`] then reports missing), else the snapshot of the model id
/// `REPO[@REVISION]` in the Hugging Face cache (revision `main` by default: a branch or tag in
/// `refs/`, or a commit).
///
/// # Errors
/// [`ModelError::HubCache`] when `spec` is a model id that the cache does not hold, naming
/// where it looked and the revisions it has.
pub fn resolve(spec: &Path) -> Result<PathBuf, ModelError> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    resolve_in(spec, hub_cache(var).as_deref())
}

/// [`resolve`] against the cache at `hub` (none: no cache location is set).
pub fn resolve_in(spec: &Path, hub: Option<&Path>) -> Result<PathBuf, ModelError> {
    let Some((repo, revision)) = model_id(spec) else {
        return Ok(spec.to_path_buf());
    };
    if spec.exists() {
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
             HF_HOME, XDG_CACHE_HOME, HOME is set)"
                .into(),
        );
    };
    let folder = hub.join(format!("models--{}", repo.replace('/', "--")));
    if !folder.is_dir() {
        return missing(format!(
            "no such directory, and the Hugging Face cache {} has no {} (`huggingface-cli \
             download {repo}` puts it there)",
            hub.display(),
            folder
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into()),
        ));
    }
    // A branch or tag names its commit in `refs/`; a commit is a snapshot's own name.
    let commit = match std::fs::read_to_string(folder.join("refs").join(revision)) {
        Ok(text) => text.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    let snapshot = folder.join("snapshots").join(&commit);
    if !revision_part(&commit) || !snapshot.is_dir() {
        return missing(format!(
            "the Hugging Face cache {} holds no revision {revision:?} of {repo} (it has: {})",
            hub.display(),
            revisions(&folder).join(", ")
        ));
    }
    Ok(snapshot)
}

/// The model id a snapshot directory of the cache belongs to (`…/models--ORG--NAME/snapshots/
/// COMMIT` → `ORG/NAME`), for titles.
pub fn repo_of(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let snapshots = dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let folder = snapshots.parent()?.file_name()?.to_str()?;
    Some(folder.strip_prefix("models--")?.replace("--", "/"))
}

/// The cache `huggingface_hub` uses, from the environment variables `var` reads.
pub fn hub_cache(var: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|cache| cache.join("huggingface").join("hub")))
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
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let revision_ok = !revision.is_empty() && revision.split('/').all(revision_part);
    (parts.len() <= 2 && parts.iter().all(name_ok) && revision_ok).then_some((repo, revision))
}

/// One `/`-separated part of a revision or commit: a plain name, never `.` or `..`.
fn revision_part(part: &str) -> bool {
    !part.is_empty()
        && part != "."
        && part != ".."
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The revisions a model's folder holds: its branches and tags (`refs/`), then its snapshots.
fn revisions(folder: &Path) -> Vec<String> {
    let names = |dir: PathBuf| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut all = names(folder.join("refs"));
    all.extend(names(folder.join("snapshots")));
    if all.is_empty() {
        all.push("none".into());
    }
    all
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
