//! Bank snapshots: one safetensors file holding the arrays (`keys` [N, d], `support` [N, m],
//! `bias` [N, m], `counts` [N]) and, in `__metadata__`, the caller's metadata (at least
//! `draft_fingerprint` and `config`) plus the format version, the array layout, the books
//! (tenants, recency, validity, counters; see `state.rs`) and a sha256 checksum over all of it.
//!
//! Saving writes a temp file beside the target, fsyncs it, renames it over the target and fsyncs
//! the directory. Loading reads the whole file and checks, in order: the safetensors structure,
//! the format version, the checksum, the layout against the arrays, the array values (finite
//! keys and biases, support ids and counts >= 0: a checksum only proves the bytes are the
//! writer's), the books, the caller's metadata, the draft fingerprint. Nothing is returned unless
//! every check passes. Only a regular file is read, and only a regular file (or nothing) is
//! replaced by a save.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::books::Books;
use crate::error::{corrupt, BankError, Result};
use crate::state::{decode_books_checked, encode_books};

#[cfg(target_endian = "big")]
compile_error!("snapshots store little-endian bytes as they lie in memory");

pub const FORMAT_VERSION: u32 = 1;
pub const META_VERSION: &str = "drift_bank.format_version";
pub const META_LAYOUT: &str = "drift_bank.layout";
pub const META_BOOKS: &str = "drift_bank.books";
pub const META_CHECKSUM: &str = "drift_bank.checksum";
/// Metadata keys under this prefix belong to the bank; callers may not set them.
pub const RESERVED_PREFIX: &str = "drift_bank.";
pub const REQUIRED_META: [&str; 2] = ["draft_fingerprint", "config"];
const CHECKSUM_DOMAIN: &[u8] = b"drift-bank-snapshot\0";

/// Element types a snapshot array may have, named as numpy names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElementType {
    Float32,
    Float16,
    Int32,
    Int64,
}

impl ElementType {
    pub fn size(self) -> usize {
        match self {
            ElementType::Float16 => 2,
            ElementType::Float32 | ElementType::Int32 => 4,
            ElementType::Int64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ElementType::Float32 => "float32",
            ElementType::Float16 => "float16",
            ElementType::Int32 => "int32",
            ElementType::Int64 => "int64",
        }
    }

    fn to_dtype(self) -> Dtype {
        match self {
            ElementType::Float32 => Dtype::F32,
            ElementType::Float16 => Dtype::F16,
            ElementType::Int32 => Dtype::I32,
            ElementType::Int64 => Dtype::I64,
        }
    }

    fn from_dtype(dtype: Dtype) -> Option<ElementType> {
        match dtype {
            Dtype::F32 => Some(ElementType::Float32),
            Dtype::F16 => Some(ElementType::Float16),
            Dtype::I32 => Some(ElementType::Int32),
            Dtype::I64 => Some(ElementType::Int64),
            _ => None,
        }
    }
}

/// The arrays of a bank: name, allowed element types, and shape as a function of (N, d, m).
const ROLES: [(&str, &[ElementType]); 4] = [
    ("keys", &[ElementType::Float32, ElementType::Float16]),
    ("support", &[ElementType::Int32, ElementType::Int64]),
    ("bias", &[ElementType::Float32]),
    ("counts", &[ElementType::Int32, ElementType::Int64]),
];

/// Shapes and element types of the four arrays, stored as metadata and checked against them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub capacity: u64, // N
    pub dim: u64,      // d
    pub support: u64,  // m
    pub keys_dtype: ElementType,
    pub support_dtype: ElementType,
    pub bias_dtype: ElementType,
    pub counts_dtype: ElementType,
}

impl Layout {
    fn expected(&self, role: &str) -> (ElementType, Vec<u64>) {
        let (n, d, m) = (self.capacity, self.dim, self.support);
        match role {
            "keys" => (self.keys_dtype, vec![n, d]),
            "support" => (self.support_dtype, vec![n, m]),
            "bias" => (self.bias_dtype, vec![n, m]),
            _ => (self.counts_dtype, vec![n]),
        }
    }

    /// Bytes of the arrays: N·(d·key + m·(id + value) + count).
    pub fn array_bytes(&self) -> u64 {
        let size = |t: ElementType| t.size() as u64;
        self.capacity
            * (self.dim * size(self.keys_dtype)
                + self.support * (size(self.support_dtype) + size(self.bias_dtype))
                + size(self.counts_dtype))
    }
}

/// A borrowed array to save: raw little-endian bytes in C order.
#[derive(Clone, Debug)]
pub struct ArrayRef<'a> {
    pub dtype: ElementType,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl View for &ArrayRef<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.to_dtype()
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// An array of a loaded snapshot: its bytes are `Snapshot::buffer[range]`.
#[derive(Clone, Debug)]
pub struct LoadedArray {
    pub name: String,
    pub dtype: ElementType,
    pub shape: Vec<usize>,
    pub range: Range<usize>,
}

/// A loaded and fully checked snapshot.
#[derive(Debug)]
pub struct Snapshot {
    pub books: Books,
    pub layout: Layout,
    /// The caller's metadata (the bank's own keys removed).
    pub meta: BTreeMap<String, String>,
    pub arrays: Vec<LoadedArray>, // in ROLES order
    pub checksum: String,
    pub header_bytes: usize,
    pub buffer: Vec<u8>, // the whole file
}

impl Snapshot {
    pub fn array_data(&self, array: &LoadedArray) -> &[u8] {
        &self.buffer[array.range.clone()]
    }
}

// ---------------------------------------------------------------- saving

pub fn save(
    path: &Path,
    books: &Books,
    arrays: &BTreeMap<String, ArrayRef<'_>>,
    meta: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = encode(books, arrays, meta)?;
    write_atomic(path, &bytes)
}

/// The snapshot file's bytes.
pub fn encode(
    books: &Books,
    arrays: &BTreeMap<String, ArrayRef<'_>>,
    meta: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    check_caller_meta(meta).map_err(BankError::SnapshotInput)?;
    let layout = layout_of(arrays, books.capacity().into())?;
    let mut full: BTreeMap<String, String> = meta.clone();
    full.insert(META_VERSION.into(), FORMAT_VERSION.to_string());
    full.insert(
        META_LAYOUT.into(),
        serde_json::to_string(&layout).expect("layout serialises"),
    );
    full.insert(META_BOOKS.into(), encode_books(books));
    let sum = checksum(
        arrays
            .iter()
            .map(|(k, a)| (k.as_str(), a.dtype, &a.shape[..], a.data)),
        &full,
    );
    full.insert(META_CHECKSUM.into(), sum);
    let header: HashMap<String, String> = full.into_iter().collect();
    safetensors::serialize(arrays.iter().map(|(k, a)| (k.as_str(), a)), Some(header))
        .map_err(|e| BankError::SnapshotInput(format!("cannot encode snapshot: {e}")))
}

fn check_caller_meta(meta: &BTreeMap<String, String>) -> std::result::Result<(), String> {
    for key in REQUIRED_META {
        if !meta.contains_key(key) {
            return Err(format!("snapshot metadata must include {key:?}"));
        }
    }
    if let Some(key) = meta.keys().find(|k| k.starts_with(RESERVED_PREFIX)) {
        return Err(format!(
            "metadata key {key:?} is reserved for the bank ({RESERVED_PREFIX}*)"
        ));
    }
    serde_json::from_str::<serde_json::Value>(&meta["config"])
        .map_err(|e| format!("metadata \"config\" must be a JSON document: {e}"))?;
    Ok(())
}

/// Derives and checks the layout of the arrays handed to `save`.
fn layout_of(arrays: &BTreeMap<String, ArrayRef<'_>>, capacity: u64) -> Result<Layout> {
    let bad = |msg: String| BankError::SnapshotInput(msg);
    let names: Vec<&str> = arrays.keys().map(String::as_str).collect();
    let mut wanted: Vec<&str> = ROLES.iter().map(|r| r.0).collect();
    wanted.sort_unstable();
    if names != wanted {
        return Err(bad(format!(
            "snapshot arrays must be exactly {wanted:?}, got {names:?}"
        )));
    }
    for (role, allowed) in ROLES {
        let a = &arrays[role];
        if !allowed.contains(&a.dtype) {
            let allowed: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
            return Err(bad(format!(
                "{role} must be one of {allowed:?}, got {}",
                a.dtype.name()
            )));
        }
        let elements = a
            .shape
            .iter()
            .try_fold(1usize, |acc, &x| acc.checked_mul(x));
        if elements.and_then(|e| e.checked_mul(a.dtype.size())) != Some(a.data.len()) {
            return Err(bad(format!(
                "{role}: {} bytes do not match shape {:?}",
                a.data.len(),
                a.shape
            )));
        }
    }
    let dim =
        |role: &str, axis: usize| arrays[role].shape.get(axis).map(|&x| x as u64).unwrap_or(0);
    let layout = Layout {
        capacity,
        dim: dim("keys", 1),
        support: dim("support", 1),
        keys_dtype: arrays["keys"].dtype,
        support_dtype: arrays["support"].dtype,
        bias_dtype: arrays["bias"].dtype,
        counts_dtype: arrays["counts"].dtype,
    };
    if layout.dim == 0 || layout.support == 0 {
        return Err(bad("keys and support need a non-empty second axis".into()));
    }
    for (role, _) in ROLES {
        let (_, shape) = layout.expected(role);
        let got: Vec<u64> = arrays[role].shape.iter().map(|&x| x as u64).collect();
        if got != shape {
            return Err(bad(format!(
                "{role} has shape {got:?}, expected {shape:?} (N = capacity {capacity}, d, m)"
            )));
        }
    }
    Ok(layout)
}

/// sha256 over a domain tag, the arrays in name order (name, element type, shape, bytes) and the
/// metadata in key order without the checksum itself; every field is length-prefixed (u64 LE).
pub fn checksum<'a>(
    arrays: impl Iterator<Item = (&'a str, ElementType, &'a [usize], &'a [u8])>,
    meta: &BTreeMap<String, String>,
) -> String {
    let mut h = Sha256::new();
    let field = |h: &mut Sha256, bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    h.update(CHECKSUM_DOMAIN);
    let mut arrays: Vec<_> = arrays.collect();
    arrays.sort_by(|a, b| a.0.cmp(b.0));
    for (name, dtype, shape, data) in arrays {
        field(&mut h, name.as_bytes());
        field(&mut h, dtype.name().as_bytes());
        h.update((shape.len() as u64).to_le_bytes());
        for &x in shape {
            h.update((x as u64).to_le_bytes());
        }
        field(&mut h, data);
    }
    for (k, v) in meta.iter().filter(|(k, _)| k.as_str() != META_CHECKSUM) {
        field(&mut h, k.as_bytes());
        field(&mut h, v.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Temp file in the target's directory + fsync + rename + fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io_err = |source| BankError::Io {
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().ok_or_else(|| {
        BankError::SnapshotInput(format!("{} is not a file path", path.display()))
    })?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    check_target(path)?;
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            d.sync_all().ok(); // some file systems refuse fsync on directories; the rename stands
        }
        Ok(())
    })();
    if written.is_err() {
        fs::remove_file(&tmp).ok();
    }
    written.map_err(io_err)
}

// ---------------------------------------------------------------- loading

/// A save may replace a regular file or create one, never a device node, FIFO, socket or directory.
fn check_target(path: &Path) -> Result<()> {
    match fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(BankError::SnapshotInput(format!(
            "{} exists and is not a regular file; a snapshot is only written to a new or regular file",
            path.display()
        ))),
        _ => Ok(()),
    }
}

pub fn load(path: &Path, expect_draft: Option<&str>) -> Result<Snapshot> {
    let io_err = |source| BankError::Io {
        path: path.to_path_buf(),
        source,
    };
    // A FIFO would block for ever (even its open does) and /dev/zero never ends: look before
    // opening, and read no more than the size the file system states. (A directory goes on to
    // fail with the system's own "is a directory".)
    let kind = fs::metadata(path).map_err(io_err)?.file_type();
    if !kind.is_file() && !kind.is_dir() {
        return Err(io_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let file = File::open(path).map_err(io_err)?;
    let size = file.metadata().map_err(io_err)?;
    let mut buffer = Vec::with_capacity(size.len() as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, size.len()), &mut buffer)
        .map_err(io_err)?;
    decode(buffer, expect_draft)
}

/// Checks and decodes the bytes of a snapshot file.
pub fn decode(buffer: Vec<u8>, expect_draft: Option<&str>) -> Result<Snapshot> {
    // read_metadata checks the header and that the offsets tile the rest of the file exactly.
    let (header_bytes, st_meta) = SafeTensors::read_metadata(&buffer)
        .map_err(|e| corrupt(format!("not a readable safetensors file ({e:?})")))?;
    let full: BTreeMap<String, String> = st_meta
        .metadata()
        .clone()
        .ok_or_else(|| corrupt("no __metadata__: not a DRIFT bank snapshot"))?
        .into_iter()
        .collect();
    check_version(&full)?;

    let data_start = 8 + header_bytes; // u64 header length, header, data
    let mut arrays = Vec::new();
    for (name, info) in st_meta.tensors() {
        let dtype = ElementType::from_dtype(info.dtype)
            .ok_or_else(|| corrupt(format!("{name} has unsupported dtype {:?}", info.dtype)))?;
        let (begin, end) = info.data_offsets;
        let range = data_start + begin..data_start + end;
        arrays.push(LoadedArray {
            name,
            dtype,
            shape: info.shape.clone(),
            range,
        });
    }
    let stored = full
        .get(META_CHECKSUM)
        .ok_or_else(|| corrupt("no checksum"))?;
    let computed = checksum(
        arrays.iter().map(|a| {
            (
                a.name.as_str(),
                a.dtype,
                &a.shape[..],
                &buffer[a.range.clone()],
            )
        }),
        &full,
    );
    if *stored != computed {
        return Err(corrupt(format!(
            "checksum mismatch (stored {stored}, computed {computed})"
        )));
    }

    let layout_json = full
        .get(META_LAYOUT)
        .ok_or_else(|| corrupt("no layout metadata"))?;
    let layout: Layout =
        serde_json::from_str(layout_json).map_err(|e| corrupt(format!("layout metadata: {e}")))?;
    let arrays = order_and_check_arrays(arrays, &layout)?;
    for a in &arrays {
        check_values(a, &buffer[a.range.clone()])?;
    }
    let books_json = full
        .get(META_BOOKS)
        .ok_or_else(|| corrupt("no books metadata"))?;
    let books = decode_books_checked(books_json, Some(layout.capacity))?;
    let meta: BTreeMap<String, String> = full
        .into_iter()
        .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
        .collect();
    check_caller_meta(&meta).map_err(corrupt)?;
    if let Some(expected) = expect_draft {
        let found = &meta["draft_fingerprint"];
        if found != expected {
            return Err(BankError::SnapshotDraftMismatch {
                expected: expected.to_owned(),
                found: found.clone(),
            });
        }
    }
    Ok(Snapshot {
        books,
        layout,
        meta,
        arrays,
        checksum: computed,
        header_bytes,
        buffer,
    })
}

fn check_version(meta: &BTreeMap<String, String>) -> Result<()> {
    let found = meta
        .get(META_VERSION)
        .ok_or_else(|| corrupt(format!("no {META_VERSION}: not a DRIFT bank snapshot")))?;
    if found.parse::<u32>().ok() != Some(FORMAT_VERSION) {
        return Err(BankError::SnapshotVersion {
            found: found.clone(),
            supported: FORMAT_VERSION,
        });
    }
    Ok(())
}

/// Values the kernels rely on: finite keys and biases, support ids and counts >= 0 (that ids
/// are below the vocabulary size is the caller's check: the snapshot does not know the vocabulary).
fn check_values(a: &LoadedArray, bytes: &[u8]) -> Result<()> {
    let first_bad = match a.dtype {
        ElementType::Float32 => bytes
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes(c.try_into().unwrap()).is_finite()),
        ElementType::Float16 => bytes
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes(c.try_into().unwrap()) & 0x7c00 == 0x7c00),
        ElementType::Int32 => bytes
            .chunks_exact(4)
            .position(|c| i32::from_le_bytes(c.try_into().unwrap()) < 0),
        ElementType::Int64 => bytes
            .chunks_exact(8)
            .position(|c| i64::from_le_bytes(c.try_into().unwrap()) < 0),
    };
    match first_bad {
        None => Ok(()),
        Some(i) => {
            let rule = match a.dtype {
                ElementType::Float32 | ElementType::Float16 => "must be finite",
                _ => "must be >= 0",
            };
            Err(corrupt(format!(
                "{} value #{i} {rule} (the checksum holds, but the values are not a bank's)",
                a.name
            )))
        }
    }
}

/// The four arrays in ROLES order, each with the element type and shape the layout states.
fn order_and_check_arrays(arrays: Vec<LoadedArray>, layout: &Layout) -> Result<Vec<LoadedArray>> {
    if arrays.len() != ROLES.len() {
        let names: Vec<&str> = arrays.iter().map(|a| a.name.as_str()).collect();
        return Err(corrupt(format!(
            "expected arrays keys, support, bias, counts; found {names:?}"
        )));
    }
    let mut ordered = Vec::with_capacity(ROLES.len());
    for (role, allowed) in ROLES {
        let a = arrays
            .iter()
            .find(|a| a.name == role)
            .ok_or_else(|| corrupt(format!("array {role:?} is missing")))?;
        let (dtype, shape) = layout.expected(role);
        let got: Vec<u64> = a.shape.iter().map(|&x| x as u64).collect();
        if a.dtype != dtype || !allowed.contains(&dtype) || got != shape {
            return Err(corrupt(format!(
                "{role} is {} {got:?} but the metadata says {} {shape:?}",
                a.dtype.name(),
                dtype.name()
            )));
        }
        ordered.push(a.clone());
    }
    if layout.dim == 0 || layout.support == 0 {
        return Err(corrupt("layout has an empty key or support axis"));
    }
    Ok(ordered)
}
