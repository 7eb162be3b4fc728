//! numpy and torch in / out for DRIFT's CPU path (`drift_bank_core::kernels` and
//! `drift_bank_core::cpu_bank`): the single ops (`drift_retrieve`, `drift_bias_add`,
//! `drift_ema`, on C-contiguous arrays) and `CpuBank`, a bank's per-token and per-iteration
//! calls on its tensors' memory. Only tensor layout reading, slicing and error mapping live
//! here; the state (recorded retrievals) and the algorithms are the core's. Bank arrays are
//! written in place.

use drift_bank_core::cpu_bank::{
    self as core, add_bias_rows, retrieve_rows, KeysView, Knobs, Layout, Rows,
};
use drift_bank_core::kernels::{self, BankArrays, Retrieved, Rule, Support};
use numpy::{
    PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1,
    PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

fn contiguous<S>(name: &str, s: Result<S, numpy::AsSliceError>) -> PyResult<S> {
    s.map_err(|_| PyValueError::new_err(format!("{name} must be C-contiguous")))
}

fn dims2(shape: &[usize]) -> [usize; 2] {
    [shape[0], shape[1]]
}

fn check(ok: bool, message: impl FnOnce() -> String) -> PyResult<()> {
    if ok {
        Ok(())
    } else {
        Err(PyValueError::new_err(message()))
    }
}

/// Read views of a bank's retrieval arrays, checked against each other.
struct Keys<'a> {
    keys: &'a [f32],           // [hi, d]
    valid: Option<&'a [bool]>, // [hi]
    dim: usize,
}

fn key_views<'a>(
    keys: &'a PyReadonlyArray2<'_, f32>,
    valid: &'a Option<PyReadonlyArray1<'_, bool>>,
    hi: usize,
) -> PyResult<Keys<'a>> {
    let [n, d] = dims2(keys.shape());
    check(hi <= n, || format!("hi {hi} exceeds the bank size {n}"))?;
    let valid = match valid {
        Some(a) => {
            let s = contiguous("valid", a.as_slice())?;
            check(s.len() == n, || {
                format!("valid has {} entries, keys {n} rows", s.len())
            })?;
            Some(&s[..hi])
        }
        None => None,
    };
    Ok(Keys {
        keys: &contiguous("keys", keys.as_slice())?[..hi * d],
        valid,
        dim: d,
    })
}

/// Read views of a bank's bias arrays for logits of width `v`.
fn bias_views<'a>(
    support: &'a Option<PyReadonlyArray2<'_, i64>>,
    bias: &'a PyReadonlyArray2<'_, f32>,
    v: usize,
) -> PyResult<(Support<'a>, &'a [f32])> {
    let [_, width] = dims2(bias.shape());
    let ids = match support {
        Some(s) => {
            check(dims2(s.shape()) == dims2(bias.shape()), || {
                "support and bias shapes differ".into()
            })?;
            Some(contiguous("support", s.as_slice())?)
        }
        None => None,
    };
    Ok((
        support_view(ids, width, v)?,
        contiguous("bias", bias.as_slice())?,
    ))
}

/// What bias rows of `width` cover for logits of width `v`: the support ids [N, width], or the
/// whole vocabulary (then `width` must be `v`).
fn support_view(ids: Option<&[i64]>, width: usize, v: usize) -> PyResult<Support<'_>> {
    match ids {
        Some(ids) => Ok(Support::Sparse { ids, m: width }),
        None => {
            check(width == v, || {
                format!("a full-vocabulary bias needs {v} columns, has {width}")
            })?;
            Ok(Support::Full)
        }
    }
}

/// (idx, sim, weight) [Q, k].
type Found<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray2<f32>>,
);

fn new_found<'py>(py: Python<'py>, q: usize, k: usize) -> Found<'py> {
    (
        PyArray2::<i64>::zeros(py, [q, k], false),
        PyArray2::<f32>::zeros(py, [q, k], false),
        PyArray2::<f32>::zeros(py, [q, k], false),
    )
}

/// Retrieval only: (idx, sim, weight) [Q, k] over slots [0, hi).
#[pyfunction]
#[pyo3(signature = (keys, valid, h, hi, k, inv_two_sigma_sq))]
pub fn drift_retrieve<'py>(
    py: Python<'py>,
    keys: PyReadonlyArray2<'py, f32>,
    valid: Option<PyReadonlyArray1<'py, bool>>,
    h: PyReadonlyArray2<'py, f32>,
    hi: usize,
    k: usize,
    inv_two_sigma_sq: f32,
) -> PyResult<Found<'py>> {
    let keys = key_views(&keys, &valid, hi)?;
    let [q, dh] = dims2(h.shape());
    check(dh == keys.dim, || {
        format!("h has {dh} columns, keys {}", keys.dim)
    })?;
    let found = new_found(py, q, k);
    {
        let (mut i, mut s, mut w) = (
            found.0.readwrite(),
            found.1.readwrite(),
            found.2.readwrite(),
        );
        let (i, s, w) = (
            contiguous("idx", i.as_slice_mut())?,
            contiguous("sim", s.as_slice_mut())?,
            contiguous("weight", w.as_slice_mut())?,
        );
        let h = Rows::of_slice(contiguous("h", h.as_slice())?, dh);
        retrieve_rows(
            &h,
            keys.keys,
            keys.valid,
            inv_two_sigma_sq,
            (i, s, w),
            &mut Vec::new(),
        );
    }
    Ok(found)
}

/// Bias add only: z [Q, V] + λβ from given neighbours (idx, weight [Q, k]) as a new array.
#[pyfunction]
#[pyo3(signature = (z, idx, weight, support, bias, gain))]
pub fn drift_bias_add<'py>(
    py: Python<'py>,
    z: PyReadonlyArray2<'py, f32>,
    idx: PyReadonlyArray2<'py, i64>,
    weight: PyReadonlyArray2<'py, f32>,
    support: Option<PyReadonlyArray2<'py, i64>>,
    bias: PyReadonlyArray2<'py, f32>,
    gain: f32,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ([q, v], [qi, k]) = (dims2(z.shape()), dims2(idx.shape()));
    check(qi == q && dims2(weight.shape()) == [q, k], || {
        "z, idx and weight disagree on Q or k".into()
    })?;
    let (support, b) = bias_views(&support, &bias, v)?;
    let n = dims2(bias.shape())[0] as i64;
    let (z, idx, w) = (
        contiguous("z", z.as_slice())?,
        contiguous("idx", idx.as_slice())?,
        contiguous("weight", weight.as_slice())?,
    );
    check(idx.iter().all(|&s| s < n), || {
        "a neighbour id is out of range".into()
    })?;
    let out = PyArray2::<f32>::zeros(py, [q, v], false);
    {
        let mut o = out.readwrite();
        let o = contiguous("out", o.as_slice_mut())?;
        let z = Rows::of_slice(z, v);
        add_bias_rows(&z, o, idx, w, support, b, gain, &mut Vec::new());
    }
    Ok(out)
}

/// The EMA step alone from given residuals [P, width], positions in order (rows of `h` pair
/// with `slots`), in place.
#[pyfunction]
#[pyo3(signature = (keys, bias, counts, slots, residual, h, eta, adaptive))]
#[allow(clippy::too_many_arguments)]
pub fn drift_ema<'py>(
    mut keys: PyReadwriteArray2<'py, f32>,
    mut bias: PyReadwriteArray2<'py, f32>,
    mut counts: PyReadwriteArray1<'py, i64>,
    slots: Vec<usize>,
    residual: PyReadonlyArray2<'py, f32>,
    h: PyReadonlyArray2<'py, f32>,
    eta: f64,
    adaptive: bool,
) -> PyResult<()> {
    let ([n, d], [nb, width]) = (dims2(keys.shape()), dims2(bias.shape()));
    let ([p, dh], [pr, wr]) = (dims2(h.shape()), dims2(residual.shape()));
    check(
        nb == n && counts.len() == n && dh == d && pr == p && wr == width && slots.len() == p,
        || "keys, bias, counts, slots, residual and h disagree".into(),
    )?;
    check(slots.iter().all(|&s| s < n), || {
        "a slot is out of range".into()
    })?;
    let (keys, bias, counts) = (
        contiguous("keys", keys.as_slice_mut())?,
        contiguous("bias", bias.as_slice_mut())?,
        contiguous("counts", counts.as_slice_mut())?,
    );
    let (h, r) = (
        contiguous("h", h.as_slice())?,
        contiguous("residual", residual.as_slice())?,
    );
    for (i, &slot) in slots.iter().enumerate() {
        kernels::ema(
            &mut keys[slot * d..(slot + 1) * d],
            &mut bias[slot * width..(slot + 1) * width],
            &mut counts[slot],
            &r[i * width..(i + 1) * width],
            &h[i * d..(i + 1) * d],
            eta,
            adaptive,
        );
    }
    Ok(())
}

/// `a` as rows (see [`Rows`]), a float32 numpy array or CPU torch tensor: all rows of a 2-D
/// one; the first `steps` positions of each batch of a 3-D one when `per` is Some(steps).
fn f32_rows<'a>(name: &str, a: &'a Bound<'_, PyAny>, per: Option<usize>) -> PyResult<Rows<'a>> {
    let elem = std::mem::size_of::<f32>() as isize;
    if let Ok(arr) = a.cast::<numpy::PyUntypedArray>() {
        let arr = arr
            .cast::<numpy::PyArrayDyn<f32>>()
            .map_err(|_| PyValueError::new_err(format!("{name} must be float32")))?;
        check(arr.strides().iter().all(|&s| s % elem == 0), || {
            format!("{name} has unaligned strides")
        })?;
        let strides: Vec<isize> = arr.strides().iter().map(|&s| s / elem).collect();
        // SAFETY (for `layout_rows`): the array's buffer holds every element its shape and
        // strides address, and `a` keeps it alive for 'a
        return unsafe { layout_rows(name, arr.data() as usize, arr.shape(), &strides, per) };
    }
    let (ptr, shape, strides) = tensor_layout(name, a)?;
    // SAFETY: as above, for a CPU tensor's storage (`a` holds the tensor)
    unsafe { layout_rows(name, ptr, &shape, &strides, per) }
}

/// A float32 CPU torch tensor's (data pointer, shape, strides in elements), read through five
/// attribute calls made from here. Warm they cost about what `Tensor.numpy()` does; with cold
/// caches, as inside the decoding loop, they are cheaper (`benchmarks/bench_cpu_step.py`
/// measures it; docs/drift.md keeps the figures).
pub(crate) fn tensor_layout(name: &str, t: &Bound<'_, PyAny>) -> PyResult<(usize, Vec<usize>, Vec<isize>)> {
    static FLOAT32: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = t.py();
    let float32 = FLOAT32.get_or_try_init(py, || -> PyResult<_> {
        Ok(py.import("torch")?.getattr("float32")?.unbind())
    })?;
    let bad = || {
        PyValueError::new_err(format!(
            "{name} must be a float32 CPU tensor or numpy array"
        ))
    };
    let dtype = t.getattr(intern!(py, "dtype")).map_err(|_| bad())?;
    if !dtype.is(float32.bind(py)) || !t.getattr(intern!(py, "is_cpu"))?.extract::<bool>()? {
        return Err(bad());
    }
    let shape: Vec<usize> = t.getattr(intern!(py, "shape"))?.extract()?;
    let strides: Vec<isize> = t.call_method0(intern!(py, "stride"))?.extract()?;
    let ptr: usize = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
    Ok((ptr, shape, strides))
}

/// Rows over the float32 elements at `ptr` with this shape and strides (in elements); the
/// layout is the core's (`Layout::of`), the slice is made here.
///
/// # Safety
/// Every element the shape and strides address from `ptr` must be readable for 'a.
unsafe fn layout_rows<'a>(
    name: &str,
    ptr: usize,
    shape: &[usize],
    strides: &[isize],
    per: Option<usize>,
) -> PyResult<Rows<'a>> {
    let layout = Layout::of(shape, strides, per)
        .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))?;
    let data: &[f32] = if layout.span == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise; the rows read lie within [ptr, ptr + span)
        unsafe { std::slice::from_raw_parts(ptr as *const f32, layout.span) }
    };
    Rows::new(data, layout).map_err(PyValueError::new_err)
}

/// A CPU bank's per-token and per-iteration work (`drift_bank_core::cpu_bank::CpuBank`), one
/// call each, on the bank tensors' own memory (numpy views of them, held here) and its books
/// (the extension's own `Books`, which own the bank's extent): `step` retrieves and adds the
/// bias for one draft token and records the retrieval; `observe` runs the iteration's whole
/// update from those records. The per-token call takes three arrays: on this path Python glue,
/// not arithmetic, was most of DRIFT's cost.
#[pyclass(module = "drift_cli._bank", name = "CpuBank", unsendable)]
pub struct CpuBank {
    arrays: Held,
    books: Py<crate::PyBooks>,
    tenant: String,
    core: core::CpuBank,
}

/// The bank tensors' numpy views, held (alive) by the `CpuBank`.
struct Held {
    keys: Py<PyArray2<f32>>,
    valid: Py<numpy::PyArray1<bool>>,
    support: Option<Py<PyArray2<i64>>>,
    bias: Py<PyArray2<f32>>,
    counts: Py<numpy::PyArray1<i64>>,
    n: usize,
    dim: usize,
    width: usize,
}

/// The bank arrays as slices (shapes re-checked: numpy lets a shape be reassigned).
struct Slices<'a> {
    keys: &'a mut [f32],
    valid: &'a mut [bool],
    support: Option<&'a mut [i64]>,
    bias: &'a mut [f32],
    counts: &'a mut [i64],
}

impl Held {
    fn slices<'a>(&'a self, py: Python<'a>) -> PyResult<Slices<'a>> {
        let (keys, bias) = (self.keys.bind(py), self.bias.bind(py));
        let (valid, counts) = (self.valid.bind(py), self.counts.bind(py));
        check(
            keys.shape() == [self.n, self.dim]
                && bias.shape() == [self.n, self.width]
                && valid.shape() == [self.n]
                && counts.shape() == [self.n],
            || "the bank arrays changed shape".into(),
        )?;
        // SAFETY: the arrays are held by `self` (alive), C-contiguous (checked at construction
        // and by `as_slice_mut`) and distinct; the GIL is held and no Python code runs while the
        // slices live, so nothing else reads or writes them meanwhile.
        unsafe {
            Ok(Slices {
                keys: contiguous("keys", keys.as_slice_mut())?,
                valid: contiguous("valid", valid.as_slice_mut())?,
                support: match &self.support {
                    Some(s) => {
                        let s = s.bind(py);
                        check(s.shape() == [self.n, self.width], || {
                            "the bank arrays changed shape".into()
                        })?;
                        Some(contiguous("support", s.as_slice_mut())?)
                    }
                    None => None,
                },
                bias: contiguous("bias", bias.as_slice_mut())?,
                counts: contiguous("counts", counts.as_slice_mut())?,
            })
        }
    }
}

/// (updated, refreshed, evicted, [(position, slot)] allocated, [(position, slot)] matched,
/// [rate] of each matched update, [slot] newly valid).
type ObserveResult = (
    usize,
    usize,
    usize,
    Vec<(usize, usize)>,
    Vec<(usize, usize)>,
    Vec<f64>,
    Vec<usize>,
);

#[pymethods]
impl CpuBank {
    #[new]
    #[pyo3(signature = (keys, valid, support, bias, counts, books, tenant, k, inv_two_sigma_sq, gain,
                        tau, eta, adaptive, used_weight))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        keys: Bound<'_, PyArray2<f32>>,
        valid: Bound<'_, numpy::PyArray1<bool>>,
        support: Option<Bound<'_, PyArray2<i64>>>,
        bias: Bound<'_, PyArray2<f32>>,
        counts: Bound<'_, numpy::PyArray1<i64>>,
        books: &Bound<'_, PyAny>,
        tenant: String,
        k: usize,
        inv_two_sigma_sq: f32,
        gain: f32,
        tau: f64,
        eta: f64,
        adaptive: bool,
        used_weight: f64,
    ) -> PyResult<Self> {
        let [n, dim] = dims2(keys.shape());
        let [nb, width] = dims2(bias.shape());
        check(nb == n && valid.len() == n && counts.len() == n, || {
            "keys, valid, bias and counts disagree on N".into()
        })?;
        if let Some(s) = &support {
            check(dims2(s.shape()) == [n, width], || {
                "support and bias shapes differ".into()
            })?;
            check(s.is_c_contiguous(), || {
                "support must be C-contiguous".into()
            })?;
        }
        check(
            keys.is_c_contiguous()
                && bias.is_c_contiguous()
                && valid.is_c_contiguous()
                && counts.is_c_contiguous(),
            || "the bank arrays must be C-contiguous".into(),
        )?;
        let books = books
            .cast::<crate::PyBooks>()
            .map_err(|_| PyValueError::new_err("a CpuBank needs the extension's own Books"))?
            .clone()
            .unbind();
        check(
            books.bind(keys.py()).borrow().inner.capacity() as usize == n,
            || "the books' capacity is not the bank size".into(),
        )?;
        let rule = Rule {
            tau,
            eta,
            adaptive,
            used_weight,
        };
        let knobs = Knobs {
            k,
            inv_two_sigma_sq,
            gain,
            rule,
        };
        Ok(Self {
            arrays: Held {
                keys: keys.unbind(),
                valid: valid.unbind(),
                support: support.map(Bound::unbind),
                bias: bias.unbind(),
                counts: counts.unbind(),
                n,
                dim,
                width,
            },
            books,
            tenant,
            core: core::CpuBank::new(knobs).map_err(crate::py_err)?,
        })
    }

    /// A new proposal: forget the last one's retrievals.
    fn begin(&mut self) {
        self.core.begin();
    }

    /// One draft step for h [Q, d], z [Q, V] (float32, rows contiguous): the k nearest of slots
    /// [0, hi) (the books' extent), recorded, then out [Q, V] = z + λβ. Returns False, leaving
    /// `out` untouched, when the logits are unchanged (an empty bank, or λ = 0).
    fn step(
        &mut self,
        h: &Bound<'_, PyAny>,
        z: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let py = h.py();
        let h = f32_rows("h", h, None)?;
        check(h.width() == self.arrays.dim, || {
            format!("h has {} columns, the keys {}", h.width(), self.arrays.dim)
        })?;
        let (hi, n_valid) = self.books.bind(py).borrow().inner.extent();
        let b = self.arrays.slices(py)?;
        let view = KeysView {
            keys: b.keys,
            valid: b.valid,
            dim: self.arrays.dim,
        };
        let rows = match self
            .core
            .retrieve(&view, (hi as usize, n_valid as usize), &h)
        {
            Some(rows) if self.core.knobs.gain != 0.0 => rows,
            _ => return Ok(false),
        };
        let z = f32_rows("z", z, None)?;
        let (q, v) = (h.n(), z.width());
        let out = out
            .cast::<PyArray2<f32>>()
            .map_err(|_| PyValueError::new_err("out must be a float32 numpy array"))?;
        check(z.n() == q && out.shape() == [q, v], || {
            format!(
                "z [{}, {v}], out {:?} and h [{q}, ..] disagree",
                z.n(),
                out.shape()
            )
        })?;
        let support = support_view(b.support.as_deref(), self.arrays.width, v)?;
        let zr = z.data().as_ptr_range();
        let or = out.data() as *const f32..unsafe { (out.data() as *const f32).add(q * v) };
        check(or.end <= zr.start || zr.end <= or.start, || {
            "out overlaps z".into()
        })?;
        // SAFETY: `out` is alive (borrowed), distinct from z (checked) and from the bank arrays
        // (the caller's buffer); the GIL is held and no Python code runs meanwhile.
        let o = unsafe { contiguous("out", out.as_slice_mut())? };
        self.core.add_bias(rows, &z, o, support, b.bias);
        Ok(true)
    }

    /// The first `steps` draft steps' retrievals for a batch of b, as (idx, sim, weight)
    /// [b·steps, k] batch-major copies.
    fn drafted<'py>(&self, py: Python<'py>, b: usize, steps: usize) -> PyResult<Found<'py>> {
        let found = self.core.recorded();
        check(b * steps <= found.rows, || {
            "fewer draft rows recorded than positions asked for".into()
        })?;
        let k = self.core.knobs.k;
        let (i, s, w) = found.batch_major(b, steps, k);
        let shape = [b * steps, k];
        Ok((
            numpy::PyArray1::from_vec(py, i).reshape(shape)?,
            numpy::PyArray1::from_vec(py, s).reshape(shape)?,
            numpy::PyArray1::from_vec(py, w).reshape(shape)?,
        ))
    }

    /// One iteration's whole update with the books (`drift_bank_core::kernels::observe`), in
    /// place. h [B, T, d], logp, logq [B, T', V] (T, T' >= steps; float32, rows contiguous):
    /// positions (i, t < steps) batch-major, log-probabilities at `temperature` (divided in the
    /// core; unnormalised will do). 2-D [P, ·] arrays are taken as they are. The neighbours are
    /// the recorded draft steps', or idx/sim/weight [P, k] (any k) when given. Returns
    /// (updated, refreshed, evicted, allocations, matched, rates): see `ObserveResult`.
    #[pyo3(signature = (h, logp, logq, steps, temperature = 1.0, idx = None, sim = None, weight = None))]
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &mut self,
        h: &Bound<'_, PyAny>,
        logp: &Bound<'_, PyAny>,
        logq: &Bound<'_, PyAny>,
        steps: usize,
        temperature: f32,
        idx: Option<PyReadonlyArray2<'_, i64>>,
        sim: Option<PyReadonlyArray2<'_, f32>>,
        weight: Option<PyReadonlyArray2<'_, f32>>,
    ) -> PyResult<ObserveResult> {
        let py = h.py();
        let (hr, pr, qr) = (
            f32_rows("h", h, Some(steps))?,
            f32_rows("logp", logp, Some(steps))?,
            f32_rows("logq", logq, Some(steps))?,
        );
        let (p, v) = (hr.n(), pr.width());
        check(
            if self.arrays.support.is_some() {
                self.arrays.width <= v
            } else {
                self.arrays.width == v
            },
            || {
                format!(
                    "bias width {} does not fit a vocabulary of {v}",
                    self.arrays.width
                )
            },
        )?;
        let given = match (&idx, &sim, &weight) {
            (Some(i), Some(s), Some(w)) => {
                let k = i.shape()[1];
                check(
                    i.shape() == [p, k] && s.shape() == [p, k] && w.shape() == [p, k],
                    || format!("idx, sim and weight must be [{p}, k] alike"),
                )?;
                let ids = contiguous("idx", i.as_slice())?;
                check(ids.iter().all(|&s| s < self.arrays.n as i64), || {
                    "a neighbour id is out of range".into()
                })?;
                Some(Retrieved {
                    idx: ids,
                    sim: contiguous("sim", s.as_slice())?,
                    weight: contiguous("weight", w.as_slice())?,
                    k,
                })
            }
            (None, None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "give idx, sim and weight together, or none",
                ))
            }
        };
        let s = self.arrays.slices(py)?;
        let mut arrays = BankArrays {
            keys: s.keys,
            support: s.support,
            bias: s.bias,
            counts: s.counts,
            dim: self.arrays.dim,
        };
        let mut books = self.books.bind(py).borrow_mut();
        let done = self
            .core
            .observe(
                &mut books.inner,
                &self.tenant,
                &mut arrays,
                s.valid,
                (&hr, &pr, &qr),
                steps,
                temperature,
                given,
            )
            .map_err(crate::py_err)?;
        Ok((
            done.updated,
            done.refreshed,
            done.evicted,
            done.allocations,
            done.matched,
            done.rates,
            done.newly_valid,
        ))
    }
}
