//! Memory-mapped, validated safetensors checkpoints.
//!
//! Format (<https://github.com/huggingface/safetensors>, README "Format"): an 8-byte little-endian
//! header length `N`, `N` bytes of JSON mapping each tensor name to
//! `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the data section that
//! follows the header), then the data. Every check happens once, in [`Checkpoint::open`]: the
//! header size is capped, each range lies inside the file, the ranges tile the data section in
//! order without gaps or overlaps, and each range holds exactly `numel · dtype size` bytes.
//! Reading a tensor then only checks its name, dtype and shape.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;
use serde::Deserialize;

use crate::ModelError;
use crate::config::regular_file;

/// Largest header accepted (the `safetensors` crate uses the same 100 MB cap).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor's entry in the header, already validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The safetensors dtype, as the header writes it (`"F32"`, `"BF16"`).
    pub dtype: String,
    /// The tensor's dims.
    pub shape: Vec<usize>,
    /// Byte range inside the data section.
    pub begin: usize,
    /// End of the byte range (exclusive).
    pub end: usize,
}

/// A safetensors file mapped into memory, with its header validated, or the shards a
/// `model.safetensors.index.json` names.
pub struct Checkpoint {
    path: PathBuf,
    /// The mapped files: one, or the shards an index names.
    shards: Vec<Shard>,
    /// Each tensor's shard and place in it.
    tensors: BTreeMap<String, (usize, TensorInfo)>,
}

/// One mapped safetensors file.
struct Shard {
    mmap: Arc<Mmap>,
    data_start: usize,
}

/// `model.safetensors.index.json`: which file holds each tensor.
#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

impl Checkpoint {
    /// Maps `path` and validates its header against the file.
    pub fn open(path: &Path) -> Result<Checkpoint, ModelError> {
        let (shard, tensors) = open_shard(path)?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            shards: vec![shard],
            tensors: tensors.into_iter().map(|(k, v)| (k, (0, v))).collect(),
        })
    }

    /// A model directory's weights: `model.safetensors`, else the shards its
    /// `model.safetensors.index.json` names (the one file wins where both are).
    pub fn open_dir(dir: &Path) -> Result<Checkpoint, ModelError> {
        let (file, index) = (
            dir.join("model.safetensors"),
            dir.join("model.safetensors.index.json"),
        );
        match crate::config::present(&file) || !crate::config::present(&index) {
            true => Checkpoint::open(&file),
            false => Checkpoint::open_sharded(&index),
        }
    }

    /// The checkpoint a `model.safetensors.index.json` spreads over shards in its directory:
    /// every shard's header checked as [`Checkpoint::open`] checks one file's, then the index
    /// against them. A missing shard, a file name that leaves the directory, a tensor the index
    /// names twice or places in a shard that lacks it, and a tensor two shards hold are each an
    /// error naming the file and the tensor.
    pub fn open_sharded(index: &Path) -> Result<Checkpoint, ModelError> {
        let text = crate::config::read_text(index, "the weights' shard index")?;
        let bad = |reason: String| ModelError::BadHeader {
            path: index.to_path_buf(),
            reason,
        };
        if let Some(key) = repeated_header_key(&text) {
            let key = (key.strip_prefix("key "))
                .and_then(|k| k.strip_suffix(" of tensor \"weight_map\""))
                .map_or(key.clone(), |k| format!("tensor {k}"));
            return Err(bad(format!("it names {key} twice")));
        }
        let parsed: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a shard index with a weight_map: {e}")))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut files: Vec<&String> = parsed.weight_map.values().collect();
        files.sort();
        files.dedup();
        let mut shards = Vec::with_capacity(files.len());
        let mut tensors: BTreeMap<String, (usize, TensorInfo)> = BTreeMap::new();
        for (n, file) in files.iter().enumerate() {
            let plain = Path::new(file.as_str())
                .file_name()
                .is_some_and(|f| f == file.as_str());
            if !plain || !file.ends_with(".safetensors") {
                return Err(bad(format!(
                    "shard {file:?} is not a .safetensors file name in the index's directory"
                )));
            }
            let (shard, held) = open_shard(&dir.join(file.as_str()))?;
            for (name, info) in held {
                if let Some((other, _)) = tensors.get(&name) {
                    return Err(bad(format!(
                        "tensor {name} is in both {} and {file}",
                        files[*other]
                    )));
                }
                tensors.insert(name, (n, info));
            }
            shards.push(shard);
        }
        for (name, file) in &parsed.weight_map {
            let n = files.binary_search(&file).unwrap_or(0);
            if tensors.get(name).is_none_or(|(at, _)| *at != n) {
                return Err(bad(format!(
                    "it places tensor {name} in {file}, which does not hold it"
                )));
            }
        }
        Ok(Checkpoint {
            path: index.to_path_buf(),
            shards,
            tensors,
        })
    }

    /// The file this checkpoint was mapped from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the checkpoint holds a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Whether any tensor's name starts with `prefix`.
    pub fn has_prefix(&self, prefix: &str) -> bool {
        (self.tensors.range(prefix.to_string()..).next())
            .is_some_and(|(name, _)| name.starts_with(prefix))
    }

    /// The validated header entry of `name`.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name).map(|(_, info)| info)
    }

    /// The dtype and raw little-endian bytes of a tensor whose shape must be `shape`.
    fn bytes(&self, name: &str, shape: &[usize]) -> Result<(&Shard, &str, &[u8]), ModelError> {
        let (shard, info) = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: name.to_string(),
            })?;
        if info.shape != shape {
            return Err(ModelError::TensorShape {
                tensor: name.to_string(),
                expected: shape.to_vec(),
                got: info.shape.clone(),
            });
        }
        let shard = &self.shards[*shard];
        let bytes = &shard.mmap[shard.data_start + info.begin..shard.data_start + info.end];
        Ok((shard, &info.dtype, bytes))
    }

    /// A floating-point tensor checked to have `shape`, as f32. F32 is read in place from the
    /// map when it is aligned (little-endian targets), else copied; F16, BF16 and F64 are
    /// converted, as transformers upcasts them when it loads a model in f32 (exactly, except
    /// F64, whose values beyond f32's range are an error and are otherwise rounded).
    ///
    /// # Shapes
    /// - returns `numel(shape)` values, row-major
    pub fn f32_data(&self, name: &str, shape: &[usize]) -> Result<F32Data, ModelError> {
        let (shard, dtype, bytes) = self.bytes(name, shape)?;
        let values = match dtype {
            "F32" => {
                let aligned = bytemuck::try_cast_slice::<u8, f32>(bytes).is_ok();
                if cfg!(target_endian = "little") && aligned {
                    let start = bytes.as_ptr() as usize - shard.mmap.as_ptr() as usize;
                    return Ok(F32Data::Mapped {
                        map: Arc::clone(&shard.mmap),
                        start,
                        len: bytes.len() / 4,
                    });
                }
                f32_from_le(bytes)
            }
            "F16" => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            "BF16" => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            "F64" => f64_to_f32(name, bytes)?,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    tensor: name.to_string(),
                    dtype: other.to_string(),
                });
            }
        };
        Ok(F32Data::Owned(values))
    }

    /// A weight matrix checked to have `shape`, kept in its stored dtype: BF16 and F16 read in
    /// place from the map (half the memory of f32, widened as the GEMMs read them), other
    /// dtypes as [`Checkpoint::f32_data`] reads them.
    ///
    /// # Shapes
    /// - returns `numel(shape)` values, row-major
    pub fn weight(&self, name: &str, shape: &[usize]) -> Result<WeightData, ModelError> {
        let (shard, dtype, bytes) = self.bytes(name, shape)?;
        let format = match dtype {
            "BF16" => Half::Bf16,
            "F16" => Half::F16,
            _ => return self.f32_data(name, shape).map(WeightData::F32),
        };
        Ok(WeightData::Half {
            map: Arc::clone(&shard.mmap),
            start: bytes.as_ptr() as usize - shard.mmap.as_ptr() as usize,
            len: bytes.len() / 2,
            format,
        })
    }

    /// [`Checkpoint::f32_data`] copied out of the map.
    ///
    /// # Shapes
    /// - returns `numel(shape)` values, row-major
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        Ok(match self.f32_data(name, shape)? {
            F32Data::Owned(values) => values,
            mapped => mapped.to_vec(),
        })
    }
}

/// Maps one safetensors file and reads its header.
fn open_shard(path: &Path) -> Result<(Shard, BTreeMap<String, TensorInfo>), ModelError> {
    // Mapping a directory fails with a puzzling "No such device", and opening a named pipe
    // blocks: say what is wrong instead.
    regular_file(path, "the model weights")?;
    let file = File::open(path).map_err(|e| ModelError::io(path, "the model weights", e))?;
    // SAFETY: the map is read-only and private to this process; like every reader of
    // safetensors files we assume nobody truncates the file while it is mapped.
    let mmap =
        unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, "the model weights", e))?;
    let (data_start, tensors) = parse_header(path, &mmap)?;
    Ok((
        Shard {
            mmap: Arc::new(mmap),
            data_start,
        },
        tensors,
    ))
}

/// Little-endian f64 values as f32; a finite value beyond f32's range is an error naming it.
fn f64_to_f32(tensor: &str, bytes: &[u8]) -> Result<Vec<f32>, ModelError> {
    bytes
        .chunks_exact(8)
        .enumerate()
        .map(|(index, b)| {
            let value = f64::from_le_bytes(b.try_into().expect("chunks of 8 bytes"));
            let narrow = value as f32;
            match narrow.is_infinite() && value.is_finite() {
                true => Err(ModelError::ValueOutOfRange {
                    tensor: tensor.to_string(),
                    index,
                    value,
                }),
                false => Ok(narrow),
            }
        })
        .collect()
}

/// f32 values either owned or borrowed from a mapped checkpoint (kept alive by the `Arc`).
#[derive(Clone)]
pub enum F32Data {
    /// Values held in memory (converted from another dtype, or copied off alignment).
    Owned(Vec<f32>),
    /// `len` values at byte `start` of the map; 4-byte aligned and little-endian, checked when
    /// made by [`Checkpoint::f32_data`].
    Mapped {
        /// The mapped checkpoint.
        map: Arc<Mmap>,
        /// Byte offset of the first value in the map.
        start: usize,
        /// Number of f32 values.
        len: usize,
    },
}

impl Deref for F32Data {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            F32Data::Owned(v) => v,
            F32Data::Mapped { map, start, len } => {
                bytemuck::cast_slice(&map[*start..*start + *len * 4])
            }
        }
    }
}

impl std::fmt::Debug for F32Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            F32Data::Owned(_) => "owned",
            F32Data::Mapped { .. } => "mapped",
        };
        write!(f, "F32Data({kind}, {} values)", self.len())
    }
}

/// A 16-bit float format a checkpoint stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// bfloat16: f32's exponent, 8 significant bits.
    Bf16,
    /// IEEE binary16.
    F16,
}

/// A weight matrix as the checkpoint stores it: f32 values, or 16-bit floats read in place
/// from the map and widened to f32 (exactly) as they are read.
#[derive(Clone)]
pub enum WeightData {
    /// f32 values (stored so, or converted from F64).
    F32(F32Data),
    /// `len` little-endian 16-bit values at byte `start` of the map.
    Half {
        /// The mapped checkpoint.
        map: Arc<Mmap>,
        /// Byte offset of the first value in the map.
        start: usize,
        /// Number of values.
        len: usize,
        /// Their format.
        format: Half,
    },
}

impl WeightData {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(data) => data.len(),
            WeightData::Half { len, .. } => *len,
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, when they are f32 already.
    pub fn f32(&self) -> Option<&[f32]> {
        match self {
            WeightData::F32(data) => Some(data),
            WeightData::Half { .. } => None,
        }
    }

    /// The values as f32: borrowed when they are f32, else widened into a copy.
    pub fn to_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            WeightData::F32(data) => std::borrow::Cow::Borrowed(data),
            WeightData::Half { .. } => {
                let mut out = vec![0.0f32; self.len()];
                self.widen(0, &mut out);
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// Values `start..start + out.len()` as f32, into `out`.
    pub fn widen(&self, start: usize, out: &mut [f32]) {
        match self {
            WeightData::F32(data) => out.copy_from_slice(&data[start..start + out.len()]),
            WeightData::Half {
                map,
                start: at,
                format,
                ..
            } => {
                let bytes = &map[at + 2 * start..][..2 * out.len()];
                match format {
                    // In place when aligned: a loop the compiler vectorises.
                    Half::Bf16 if cfg!(target_endian = "little") => {
                        match bytemuck::try_cast_slice::<u8, u16>(bytes) {
                            Ok(bits) => {
                                for (o, &b) in out.iter_mut().zip(bits) {
                                    *o = f32::from_bits(u32::from(b) << 16);
                                }
                            }
                            Err(_) => widen_bf16_bytes(bytes, out),
                        }
                    }
                    Half::Bf16 => widen_bf16_bytes(bytes, out),
                    Half::F16 => {
                        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                            *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                        }
                    }
                }
            }
        }
    }

    /// Row `i` of a `[_, width]` matrix as f32: borrowed when the values are f32, else widened.
    pub fn row(&self, i: usize, width: usize) -> std::borrow::Cow<'_, [f32]> {
        match self {
            WeightData::F32(data) => std::borrow::Cow::Borrowed(&data[i * width..][..width]),
            WeightData::Half { .. } => {
                let mut out = vec![0.0f32; width];
                self.widen(i * width, &mut out);
                std::borrow::Cow::Owned(out)
            }
        }
    }
}

impl std::fmt::Debug for WeightData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightData::F32(data) => data.fmt(f),
            WeightData::Half { len, format, .. } => {
                write!(f, "WeightData({format:?}, {len} values)")
            }
        }
    }
}

/// Little-endian BF16 values, at any alignment, as f32.
fn widen_bf16_bytes(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
    }
}

/// Decodes little-endian f32 values (the map need not be 4-byte aligned).
pub fn f32_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The first key a safetensors header repeats, as "tensor NAME" (its top level), "metadata
/// key NAME" (inside `__metadata__`), "key NAME of tensor T" (inside a tensor's entry) or
/// "metadata" (`__metadata__` itself); `None` when none repeats or the header is not JSON. A
/// JSON object may repeat a key, and readers keep one of them (serde_json and Python the last),
/// so a file naming a tensor, a metadata key or a tensor's dtype twice would be read as
/// whichever its reader keeps. Values that are not objects are skipped here (the parser
/// judges them).
pub fn repeated_header_key(header: &str) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// Where an object sits in the header: its top level, `__metadata__`, or a tensor's entry.
    enum Keys {
        Top,
        Metadata,
        Entry(String),
    }
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut repeated = None;
            while let Some(key) = map.next_key::<String>()? {
                let inner = match (&self, key.as_str()) {
                    (Keys::Top, "__metadata__") => map.next_value_seed(Keys::Metadata)?,
                    (Keys::Top, _) => map.next_value_seed(Keys::Entry(key.clone()))?,
                    _ => map.next_value::<IgnoredAny>().map(|_| None)?,
                };
                if !seen.insert(key.clone()) {
                    let what = match &self {
                        Keys::Top if key == "__metadata__" => "metadata".to_string(),
                        Keys::Top => format!("tensor {key:?}"),
                        Keys::Metadata => format!("metadata key {key:?}"),
                        Keys::Entry(tensor) => format!("key {key:?} of tensor {tensor:?}"),
                    };
                    repeated = repeated.or(Some(what));
                }
                repeated = repeated.or(inner);
            }
            Ok(repeated)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    impl<'de> DeserializeSeed<'de> for Keys {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    let mut json = serde_json::Deserializer::from_str(header);
    Keys::Top.deserialize(&mut json).ok().flatten()
}

fn parse_header(
    path: &Path,
    bytes: &[u8],
) -> Result<(usize, BTreeMap<String, TensorInfo>), ModelError> {
    let file_len = bytes.len() as u64;
    let Some(prefix) = bytes.first_chunk::<8>() else {
        return Err(ModelError::FileTooShort {
            path: path.to_path_buf(),
            len: file_len,
        });
    };
    let header_len = u64::from_le_bytes(*prefix);
    let limit = MAX_HEADER_BYTES.min(file_len - 8);
    if header_len > limit {
        return Err(ModelError::HeaderTooLarge {
            path: path.to_path_buf(),
            size: header_len,
            limit,
        });
    }
    // Both fit in usize: header_len ≤ file_len − 8, and the file is mapped.
    let data_start = 8 + header_len as usize;
    let bad = |reason: String| ModelError::BadHeader {
        path: path.to_path_buf(),
        reason,
    };
    let header =
        std::str::from_utf8(&bytes[8..data_start]).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let raw: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(header).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    if let Some(key) = repeated_header_key(header) {
        return Err(bad(format!("it names {key} twice")));
    }
    let data_len = file_len - data_start as u64;

    let mut entries = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let entry: RawEntry =
            serde_json::from_value(value).map_err(|e| bad(format!("tensor {name}: {e}")))?;
        let [begin, end] = entry.data_offsets;
        if begin > end || end > data_len {
            return Err(ModelError::TensorOutOfBounds {
                path: path.to_path_buf(),
                tensor: name,
                begin,
                end,
                data_len,
            });
        }
        let size = dtype_size(&entry.dtype)
            .ok_or_else(|| bad(format!("tensor {name}: unknown dtype {}", entry.dtype)))?;
        let expected = entry
            .shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d as u64))
            .unwrap_or(u64::MAX);
        if expected != end - begin {
            return Err(ModelError::TensorByteLength {
                path: path.to_path_buf(),
                tensor: name,
                dtype: entry.dtype,
                shape: entry.shape,
                expected,
                got: end - begin,
            });
        }
        entries.push((name, entry.dtype, entry.shape, begin, end));
    }

    entries.sort_by_key(|e| (e.3, e.4));
    let mut next = 0u64;
    for (name, _, _, begin, end) in &entries {
        if *begin != next {
            return Err(ModelError::TensorNotContiguous {
                path: path.to_path_buf(),
                tensor: name.clone(),
                expected: next,
                got: *begin,
            });
        }
        next = *end;
    }
    if next != data_len {
        return Err(bad(format!(
            "tensors cover {next} bytes of the {data_len}-byte data section"
        )));
    }
    let tensors = entries
        .into_iter()
        .map(|(name, dtype, shape, begin, end)| {
            let info = TensorInfo {
                dtype,
                shape,
                begin: begin as usize,
                end: end as usize,
            };
            (name, info)
        })
        .collect();
    Ok((data_start, tensors))
}
