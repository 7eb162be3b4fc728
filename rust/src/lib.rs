//! `drift_cli._bank`: a thin PyO3 binding over `drift-bank-core`. Argument conversion, the
//! mapping of the core's error enum onto Python exception classes, and numpy in / out; no
//! bookkeeping logic lives here.

mod kernels;
mod linear;

use std::collections::BTreeMap;
use std::path::PathBuf;

use drift_bank_core::snapshot::{self, ArrayRef, ElementType, Snapshot};
use drift_bank_core::state::{decode_books, encode_books};
use drift_bank_core::{BankError as CoreError, Books, Stats, FORMAT_VERSION};
use half::f16;
use numpy::{
    Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyOSError, PyPermissionError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

create_exception!(
    drift_cli._bank,
    BankError,
    PyException,
    "Base of every error the bank raises."
);
create_exception!(
    drift_cli._bank,
    TenantError,
    BankError,
    "A tenant added twice or badly named."
);
create_exception!(
    drift_cli._bank,
    UnknownTenant,
    TenantError,
    "A tenant the books do not know."
);
create_exception!(
    drift_cli._bank,
    SlotError,
    BankError,
    "A slot out of range, or free where a used one is needed."
);
create_exception!(
    drift_cli._bank,
    QuotaError,
    BankError,
    "Quotas exceeding the capacity, a full zero quota, a bad capacity."
);
create_exception!(
    drift_cli._bank,
    SnapshotError,
    BankError,
    "Base of snapshot problems; raised itself for arrays or metadata that cannot be saved."
);
create_exception!(
    drift_cli._bank,
    SnapshotCorrupt,
    SnapshotError,
    "A truncated or corrupted snapshot, or one inconsistent with its own metadata."
);
create_exception!(
    drift_cli._bank,
    SnapshotVersionError,
    SnapshotError,
    "A snapshot written in another format version."
);
create_exception!(
    drift_cli._bank,
    SnapshotDraftMismatch,
    SnapshotError,
    "A snapshot made for another draft model."
);

fn py_err(e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::UnknownTenant(_) => UnknownTenant::new_err(msg),
        CoreError::Tenant(_) => TenantError::new_err(msg),
        CoreError::Slot(_) => SlotError::new_err(msg),
        CoreError::Quota(_) => QuotaError::new_err(msg),
        CoreError::Shape(_) => pyo3::exceptions::PyValueError::new_err(msg),
        CoreError::SnapshotInput(_) => SnapshotError::new_err(msg),
        CoreError::SnapshotCorrupt(_) => SnapshotCorrupt::new_err(msg),
        CoreError::SnapshotVersion { .. } => SnapshotVersionError::new_err(msg),
        CoreError::SnapshotDraftMismatch { .. } => SnapshotDraftMismatch::new_err(msg),
        CoreError::Io { path, source } => {
            // OSError(errno, strerror, filename), as Python's own file functions raise it.
            let text = source.to_string();
            let strerror = text.split(" (os error").next().unwrap_or(&text).to_owned();
            let args = (
                source.raw_os_error().unwrap_or(0),
                strerror,
                path.to_string_lossy().into_owned(),
            );
            match source.kind() {
                std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(args),
                std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(args),
                _ => PyOSError::new_err(args),
            }
        }
    }
}

/// A Python int as a slot id; negative or huge ids are out of range.
fn slot_id(slot: i64, capacity: u32) -> PyResult<u32> {
    u32::try_from(slot)
        .ok()
        .filter(|&s| s < capacity)
        .ok_or_else(|| {
            SlotError::new_err(format!(
                "slot {slot} is out of range for a bank of capacity {capacity}"
            ))
        })
}

/// Slot ids from a 1-D integer numpy array or a list (fast paths), or any sequence of ints.
fn slot_ids(slots: &Bound<'_, PyAny>, capacity: u32) -> PyResult<Vec<u32>> {
    if let Ok(a) = slots.cast::<PyArray1<i64>>() {
        // SAFETY: a read-only view, copied out before any Python code can run again (the GIL is
        // held throughout); skipping rust-numpy's borrow registry saves its lookup per call.
        let view = unsafe { a.as_array() };
        return view.iter().map(|&s| slot_id(s, capacity)).collect();
    }
    if let Ok(a) = slots.cast::<PyArray1<i32>>() {
        // SAFETY: as above.
        let view = unsafe { a.as_array() };
        return view.iter().map(|&s| slot_id(s.into(), capacity)).collect();
    }
    if let Ok(list) = slots.cast::<PyList>() {
        return list
            .iter()
            .map(|s| slot_id(s.extract()?, capacity))
            .collect();
    }
    let ids: Vec<i64> = slots.extract()?;
    ids.into_iter().map(|s| slot_id(s, capacity)).collect()
}

fn non_negative(value: i64, what: &str) -> PyResult<u64> {
    u64::try_from(value)
        .map_err(|_| QuotaError::new_err(format!("{what} must be >= 0, got {value}")))
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("hits", s.counters.hits)?;
    d.set_item("allocations", s.counters.allocations)?;
    d.set_item("evictions", s.counters.evictions)?;
    d.set_item("used", s.used)?;
    d.set_item("capacity", s.capacity)?;
    Ok(d)
}

/// The books of a DRIFT bank (slots, LRU order, tenants, counters). See `_bank.pyi`.
#[pyclass(module = "drift_cli._bank", name = "Books")]
pub struct PyBooks {
    inner: Books,
}

#[pymethods]
impl PyBooks {
    #[new]
    #[pyo3(signature = (capacity, quotas = None))]
    fn new(capacity: i64, quotas: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let capacity = non_negative(capacity, "capacity")?;
        let declared = match quotas {
            None => None,
            Some(d) => {
                let mut v = Vec::with_capacity(d.len());
                for (name, quota) in d.iter() {
                    let quota: Option<i64> = quota.extract()?;
                    let quota = quota.map(|q| non_negative(q, "quota")).transpose()?;
                    v.push((name.extract::<String>()?, quota));
                }
                Some(v)
            }
        };
        Ok(PyBooks {
            inner: Books::new(capacity, declared.as_deref()).map_err(py_err)?,
        })
    }

    #[getter]
    fn capacity(&self) -> u32 {
        self.inner.capacity()
    }

    #[pyo3(signature = (name, quota = None))]
    fn add_tenant(&mut self, name: &str, quota: Option<i64>) -> PyResult<()> {
        let quota = quota.map(|q| non_negative(q, "quota")).transpose()?;
        self.inner.add_tenant(name, quota).map_err(py_err)
    }

    /// (slot, evicted): a free slot, else the least recently used slot the tenant may evict.
    #[pyo3(signature = (tenant = "default"))]
    fn allocate(&mut self, tenant: &str) -> PyResult<(u32, bool)> {
        let a = self.inner.allocate(tenant).map_err(py_err)?;
        Ok((a.slot, a.evicted_from.is_some()))
    }

    /// `count` allocations in one call: [(slot, evicted), ...], as `allocate` in a loop.
    #[pyo3(signature = (count, tenant = "default"))]
    fn allocate_many(&mut self, count: usize, tenant: &str) -> PyResult<Vec<(u32, bool)>> {
        let all = self.inner.allocate_many(tenant, count).map_err(py_err)?;
        Ok(all
            .into_iter()
            .map(|a| (a.slot, a.evicted_from.is_some()))
            .collect())
    }

    /// Marks the slots used in order (last = most recent); all-or-nothing.
    fn touch(&mut self, slots: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = slot_ids(slots, self.inner.capacity())?;
        self.inner.touch(&ids).map_err(py_err)
    }

    fn release(&mut self, slot: i64) -> PyResult<()> {
        let slot = slot_id(slot, self.inner.capacity())?;
        self.inner.release(slot).map_err(py_err)
    }

    #[pyo3(signature = (tenant = None))]
    fn recency(&self, tenant: Option<&str>) -> PyResult<Vec<u32>> {
        self.inner.recency(tenant).map_err(py_err)
    }

    fn is_valid(&self, slot: i64) -> PyResult<bool> {
        let slot = slot_id(slot, self.inner.capacity())?;
        self.inner.is_valid(slot).map_err(py_err)
    }

    #[pyo3(signature = (tenant = None))]
    fn valid_slots(&self, tenant: Option<&str>) -> PyResult<Vec<u32>> {
        self.inner.valid_slots(tenant).map_err(py_err)
    }

    fn owner(&self, slot: i64) -> PyResult<Option<String>> {
        let slot = slot_id(slot, self.inner.capacity())?;
        Ok(self.inner.owner(slot).map_err(py_err)?.map(str::to_owned))
    }

    fn tenants<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, quota) in self.inner.tenants() {
            d.set_item(name, quota)?;
        }
        Ok(d)
    }

    #[pyo3(signature = (tenant = None))]
    fn stats<'py>(&self, py: Python<'py>, tenant: Option<&str>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.stats(tenant).map_err(py_err)?)
    }

    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// (hi, n_valid): 1 + the highest slot handed out since these books were made or loaded,
    /// and the used slots. The books own a bank's extent (retrieval scans slots [0, hi)).
    fn extent(&self) -> (u32, u32) {
        self.inner.extent()
    }

    fn __repr__(&self) -> String {
        format!(
            "Books(capacity={}, used={}, tenants={})",
            self.inner.capacity(),
            self.inner.len(),
            self.inner.tenants().len()
        )
    }

    // Pickling: copyreg rebuilds with Books(capacity) and then __setstate__ with the books JSON
    // (the same encoding a snapshot stores), tagged with the snapshot format version.
    fn __getnewargs__(&self) -> (u32,) {
        (self.inner.capacity(),)
    }

    fn __getstate__<'py>(&self, py: Python<'py>) -> (u32, Bound<'py, PyBytes>) {
        (
            FORMAT_VERSION,
            PyBytes::new(py, encode_books(&self.inner).as_bytes()),
        )
    }

    fn __setstate__(&mut self, state: (u32, Vec<u8>)) -> PyResult<()> {
        let (version, json) = state;
        if version != FORMAT_VERSION {
            return Err(py_err(CoreError::SnapshotVersion {
                found: version.to_string(),
                supported: FORMAT_VERSION,
            }));
        }
        let json = String::from_utf8(json)
            .map_err(|_| SnapshotCorrupt::new_err("pickled books are not UTF-8"))?;
        self.inner = decode_books(&json).map_err(py_err)?;
        Ok(())
    }
}

// ---------------------------------------------------------------- numpy in and out

/// A read-only borrow of one numpy array, kept alive while its bytes are in use.
enum Borrowed<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F16(PyReadonlyArrayDyn<'py, f16>),
    I32(PyReadonlyArrayDyn<'py, i32>),
    I64(PyReadonlyArrayDyn<'py, i64>),
}

fn as_bytes<'a, T: Element>(a: &'a PyReadonlyArrayDyn<'_, T>) -> &'a [u8] {
    let s = a
        .as_slice()
        .expect("made C-contiguous by numpy.ascontiguousarray");
    // SAFETY: plain numeric elements; the byte view covers exactly the slice.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

impl<'py> Borrowed<'py> {
    fn from_any(name: &str, value: &Bound<'py, PyAny>) -> PyResult<(Borrowed<'py>, Vec<usize>)> {
        let np = value.py().import("numpy")?;
        let a = np.call_method1("ascontiguousarray", (value,))?;
        let untyped = a
            .cast::<PyUntypedArray>()
            .map_err(|_| SnapshotError::new_err(format!("array {name:?} is not a numpy array")))?;
        let shape = untyped.shape().to_vec();
        let b = if let Ok(x) = a.cast::<PyArrayDyn<f32>>() {
            Borrowed::F32(x.readonly())
        } else if let Ok(x) = a.cast::<PyArrayDyn<f16>>() {
            Borrowed::F16(x.readonly())
        } else if let Ok(x) = a.cast::<PyArrayDyn<i32>>() {
            Borrowed::I32(x.readonly())
        } else if let Ok(x) = a.cast::<PyArrayDyn<i64>>() {
            Borrowed::I64(x.readonly())
        } else {
            return Err(SnapshotError::new_err(format!(
                "array {name:?} has dtype {}; snapshots hold float32, float16, int32 or int64",
                untyped.dtype()
            )));
        };
        Ok((b, shape))
    }

    fn view(&self, shape: Vec<usize>) -> ArrayRef<'_> {
        let (dtype, data) = match self {
            Borrowed::F32(a) => (ElementType::Float32, as_bytes(a)),
            Borrowed::F16(a) => (ElementType::Float16, as_bytes(a)),
            Borrowed::I32(a) => (ElementType::Int32, as_bytes(a)),
            Borrowed::I64(a) => (ElementType::Int64, as_bytes(a)),
        };
        ArrayRef { dtype, shape, data }
    }
}

/// A new numpy array of `shape` holding `bytes` (little-endian elements of T in C order).
fn to_numpy<'py, T: Element>(py: Python<'py>, shape: &[usize], bytes: &[u8]) -> Bound<'py, PyAny> {
    // SAFETY: uninitialised C-ordered array whose every byte is overwritten below.
    let a = unsafe { PyArrayDyn::<T>::new(py, shape.to_vec(), false) };
    debug_assert_eq!(a.len() * std::mem::size_of::<T>(), bytes.len());
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), a.data().cast::<u8>(), bytes.len()) };
    a.into_any()
}

fn str_map(d: &Bound<'_, PyDict>) -> PyResult<BTreeMap<String, String>> {
    d.iter()
        .map(|(k, v)| Ok((k.extract()?, v.extract()?)))
        .collect()
}

/// Writes books + arrays + meta to `path` atomically.
#[pyfunction]
fn save_snapshot(
    py: Python<'_>,
    path: PathBuf,
    books: PyRef<'_, PyBooks>,
    arrays: &Bound<'_, PyDict>,
    meta: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let meta = str_map(meta)?;
    let mut borrowed = Vec::with_capacity(arrays.len());
    for (k, v) in arrays.iter() {
        let name: String = k.extract()?;
        let (b, shape) = Borrowed::from_any(&name, &v)?;
        borrowed.push((name, b, shape));
    }
    let views: BTreeMap<String, ArrayRef<'_>> = borrowed
        .iter()
        .map(|(n, b, shape)| (n.clone(), b.view(shape.clone())))
        .collect();
    let bytes = snapshot::encode(&books.inner, &views, &meta).map_err(py_err)?;
    drop(views);
    py.detach(|| snapshot::write_atomic(&path, &bytes))
        .map_err(py_err)
}

/// Reads and checks a snapshot: (books, arrays, meta). Raises a SnapshotError subclass otherwise.
#[pyfunction]
#[pyo3(signature = (path, expect_draft = None))]
fn load_snapshot<'py>(
    py: Python<'py>,
    path: PathBuf,
    expect_draft: Option<String>,
) -> PyResult<Bound<'py, PyTuple>> {
    let snap = py
        .detach(|| snapshot::load(&path, expect_draft.as_deref()))
        .map_err(py_err)?;
    let arrays = PyDict::new(py);
    for a in &snap.arrays {
        let bytes = snap.array_data(a);
        let array = match a.dtype {
            ElementType::Float32 => to_numpy::<f32>(py, &a.shape, bytes),
            ElementType::Float16 => to_numpy::<f16>(py, &a.shape, bytes),
            ElementType::Int32 => to_numpy::<i32>(py, &a.shape, bytes),
            ElementType::Int64 => to_numpy::<i64>(py, &a.shape, bytes),
        };
        arrays.set_item(&a.name, array)?;
    }
    let meta = PyDict::new(py);
    for (k, v) in &snap.meta {
        meta.set_item(k, v)?;
    }
    let Snapshot { books, .. } = snap;
    let books = Bound::new(py, PyBooks { inner: books })?;
    PyTuple::new(py, [books.into_any(), arrays.into_any(), meta.into_any()])
}

/// A checked snapshot's summary for `drift bank inspect` (no arrays returned).
#[pyfunction]
fn read_snapshot_summary<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let snap = py.detach(|| snapshot::load(&path, None)).map_err(py_err)?;
    let (books, layout) = (&snap.books, &snap.layout);
    let d = PyDict::new(py);
    d.set_item("path", path.to_string_lossy())?;
    d.set_item("format_version", FORMAT_VERSION)?;
    d.set_item("file_bytes", snap.buffer.len())?;
    d.set_item("header_bytes", snap.header_bytes)?;
    d.set_item("array_bytes", layout.array_bytes())?;
    d.set_item("N", layout.capacity)?;
    d.set_item("d", layout.dim)?;
    d.set_item("m", layout.support)?;
    let dtypes = PyDict::new(py);
    dtypes.set_item("keys", layout.keys_dtype.name())?;
    dtypes.set_item("support", layout.support_dtype.name())?;
    dtypes.set_item("bias", layout.bias_dtype.name())?;
    dtypes.set_item("counts", layout.counts_dtype.name())?;
    d.set_item("dtypes", dtypes)?;
    d.set_item("used", books.len())?;
    d.set_item(
        "stats",
        stats_dict(py, &books.stats(None).map_err(py_err)?)?,
    )?;
    let tenants = PyDict::new(py);
    for (name, quota) in books.tenants() {
        let t = stats_dict(py, &books.stats(Some(name)).map_err(py_err)?)?;
        t.set_item("quota", quota)?;
        tenants.set_item(name, t)?;
    }
    d.set_item("tenants", tenants)?;
    d.set_item("draft_fingerprint", &snap.meta["draft_fingerprint"])?;
    let json = py.import("json")?;
    d.set_item(
        "config",
        json.call_method1("loads", (&snap.meta["config"],))?,
    )?;
    let extra = PyDict::new(py);
    for (k, v) in snap
        .meta
        .iter()
        .filter(|(k, _)| !snapshot::REQUIRED_META.contains(&k.as_str()))
    {
        extra.set_item(k, v)?;
    }
    d.set_item("meta", extra)?;
    d.set_item("checksum", &snap.checksum)?;
    Ok(d)
}

#[pymodule]
fn _bank(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyBooks>()?;
    m.add("BankError", py.get_type::<BankError>())?;
    m.add("TenantError", py.get_type::<TenantError>())?;
    m.add("UnknownTenant", py.get_type::<UnknownTenant>())?;
    m.add("SlotError", py.get_type::<SlotError>())?;
    m.add("QuotaError", py.get_type::<QuotaError>())?;
    m.add("SnapshotError", py.get_type::<SnapshotError>())?;
    m.add("SnapshotCorrupt", py.get_type::<SnapshotCorrupt>())?;
    m.add(
        "SnapshotVersionError",
        py.get_type::<SnapshotVersionError>(),
    )?;
    m.add(
        "SnapshotDraftMismatch",
        py.get_type::<SnapshotDraftMismatch>(),
    )?;
    m.add_function(wrap_pyfunction!(save_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(load_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(read_snapshot_summary, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::drift_retrieve, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::drift_bias_add, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::drift_ema, m)?)?;
    m.add_class::<kernels::CpuBank>()?;
    m.add_function(wrap_pyfunction!(linear::skinny_linear, m)?)?;
    m.add_function(wrap_pyfunction!(linear::read_sum, m)?)?;
    m.add_function(wrap_pyfunction!(linear::skinny_norm_linear, m)?)?;
    m.add_function(wrap_pyfunction!(linear::skinny_mlp, m)?)?;
    m.add_function(wrap_pyfunction!(linear::attend_few, m)?)?;
    m.add_function(wrap_pyfunction!(linear::rms_norm, m)?)?;
    m.add_class::<linear::DecoderPlan>()?;
    m.add("SNAPSHOT_FORMAT_VERSION", FORMAT_VERSION)?;
    Ok(())
}
