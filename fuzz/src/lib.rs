//! Shared pieces of the attnscope fuzz targets: a scratch directory for the files a target has
//! to hand to path-based readers, the golden data the targets start from, and input splitting.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `tests/data`, the reference files in the repository.
pub fn golden() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data"))
}

/// all-MiniLM-L6-v2 in the model cache, when it has been fetched.
pub fn cached_minilm() -> Option<PathBuf> {
    let dir = attn_models::cache_dir().ok()?.join("all-MiniLM-L6-v2");
    attn_models::is_complete(&dir).then_some(dir)
}

/// A directory private to this process, in memory (`/dev/shm`) when there is one, so that
/// writing an input per run costs little.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("attnscope-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the fuzz scratch directory");
        dir
    })
}

/// Writes `bytes` to `name` inside the scratch directory and returns its path.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, bytes).expect("writing a fuzz input to the scratch directory");
    path
}

/// Splits an input into at most `n` fields at NUL bytes (missing fields are empty).
pub fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |&b| b == 0).collect();
    out.resize(n, &[]);
    out
}
