//! numpy in / out for `drift_bank_core::kernels` (DRIFT's CPU path). Shapes are checked here;
//! the arithmetic lives in the core. Arrays must be C-contiguous (the Python side passes views
//! of contiguous torch tensors), and the bank arrays are written in place.

use drift_bank_core::kernels::{self, BankArrays, Positions, Retrieved, Rule, Support};
use numpy::{
    PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1,
    PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

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
    let support = match support {
        Some(s) => {
            check(dims2(s.shape()) == dims2(bias.shape()), || {
                "support and bias shapes differ".into()
            })?;
            Support::Sparse {
                ids: contiguous("support", s.as_slice())?,
                m: width,
            }
        }
        None => {
            check(width == v, || {
                format!("a full-vocabulary bias needs {v} columns, has {width}")
            })?;
            Support::Full
        }
    };
    Ok((support, contiguous("bias", bias.as_slice())?))
}

/// (idx, sim, weight) [Q, k].
type Found<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray2<f32>>,
);

/// What the bias add needs besides the neighbours: support, bias, z, out, λ.
type BiasArgs<'a> = (Support<'a>, &'a [f32], &'a [f32], &'a mut [f32], f32);

fn new_found<'py>(py: Python<'py>, q: usize, k: usize) -> Found<'py> {
    (
        PyArray2::<i64>::zeros(py, [q, k], false),
        PyArray2::<f32>::zeros(py, [q, k], false),
        PyArray2::<f32>::zeros(py, [q, k], false),
    )
}

/// Where retrievals go: idx, sim, weight, each [Q, k] row-major.
type FoundSlices<'a> = (&'a mut [i64], &'a mut [f32], &'a mut [f32]);

/// Retrieval for each query row, then (when `bias` is given) the bias add into `out`.
fn draft_rows(
    keys: &Keys<'_>,
    h: &[f32],
    k: usize,
    inv_two_sigma_sq: f32,
    (i, s, w): FoundSlices<'_>,
    mut bias: Option<BiasArgs<'_>>,
) {
    thread_local! {
        // reused across calls: the similarities [hi] and the vocabulary-wide accumulator, which
        // the bias add leaves zeroed (a fresh 4-500 KB buffer per draft token is measurable)
        static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    SCRATCH.with_borrow_mut(|(scratch, acc)| {
        let d = keys.dim;
        let q = h.len() / d.max(1);
        for row in 0..q {
            let rk = row * k..(row + 1) * k;
            kernels::nearest(
                &h[row * d..(row + 1) * d],
                keys.keys,
                keys.valid,
                inv_two_sigma_sq,
                &mut i[rk.clone()],
                &mut s[rk.clone()],
                &mut w[rk.clone()],
                scratch,
            );
            if let Some((support, b, z, out, gain)) = bias.as_mut() {
                let v = z.len() / q;
                if acc.len() != v {
                    acc.clear();
                    acc.resize(v, 0.0);
                }
                let rv = row * v..(row + 1) * v;
                kernels::bias_add_row(
                    &z[rv.clone()],
                    &mut out[rv],
                    &i[rk.clone()],
                    &w[rk],
                    *support,
                    b,
                    *gain,
                    acc,
                );
            }
        }
    });
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
        let slices = (
            contiguous("idx", i.as_slice_mut())?,
            contiguous("sim", s.as_slice_mut())?,
            contiguous("weight", w.as_slice_mut())?,
        );
        draft_rows(
            &keys,
            contiguous("h", h.as_slice())?,
            k,
            inv_two_sigma_sq,
            slices,
            None,
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
        o.copy_from_slice(z);
        let mut acc = vec![0f32; v];
        for row in 0..q {
            let (rk, rv) = (row * k..(row + 1) * k, row * v..(row + 1) * v);
            kernels::bias_add_row(
                &z[rv.clone()],
                &mut o[rv],
                &idx[rk.clone()],
                &w[rk],
                support,
                b,
                gain,
                &mut acc,
            );
        }
    }
    Ok(out)
}

/// One draft step for Q queries: retrieval over slots [0, hi) into idx/sim/weight [Q, k], then
/// out [Q, V] = z + λβ; every output is the caller's array, written in place (no allocation on
/// the per-token path).
#[pyfunction]
#[pyo3(signature = (keys, valid, support, bias, h, z, hi, inv_two_sigma_sq, gain, idx, sim, weight, out))]
#[allow(clippy::too_many_arguments)]
pub fn drift_draft_step<'py>(
    keys: PyReadonlyArray2<'py, f32>,
    valid: Option<PyReadonlyArray1<'py, bool>>,
    support: Option<PyReadonlyArray2<'py, i64>>,
    bias: PyReadonlyArray2<'py, f32>,
    h: PyReadonlyArray2<'py, f32>,
    z: PyReadonlyArray2<'py, f32>,
    hi: usize,
    inv_two_sigma_sq: f32,
    gain: f32,
    mut idx: PyReadwriteArray2<'py, i64>,
    mut sim: PyReadwriteArray2<'py, f32>,
    mut weight: PyReadwriteArray2<'py, f32>,
    mut out: PyReadwriteArray2<'py, f32>,
) -> PyResult<()> {
    let keys_v = key_views(&keys, &valid, hi)?;
    let ([q, dh], [qz, v], [qi, k]) = (dims2(h.shape()), dims2(z.shape()), dims2(idx.shape()));
    check(
        dh == keys_v.dim && q == qz && qi == q && dims2(out.shape()) == [q, v],
        || {
            format!(
                "h [{q}, {dh}], z [{qz}, {v}], idx [{qi}, {k}], out and keys [.., {}] disagree",
                keys_v.dim
            )
        },
    )?;
    check(
        dims2(sim.shape()) == [q, k] && dims2(weight.shape()) == [q, k],
        || "idx, sim and weight differ in shape".into(),
    )?;
    check(dims2(bias.shape())[0] == dims2(keys.shape())[0], || {
        "bias and keys disagree on N".into()
    })?;
    let (support, b) = bias_views(&support, &bias, v)?;
    let z = contiguous("z", z.as_slice())?;
    let slices = (
        contiguous("idx", idx.as_slice_mut())?,
        contiguous("sim", sim.as_slice_mut())?,
        contiguous("weight", weight.as_slice_mut())?,
    );
    let o = contiguous("out", out.as_slice_mut())?;
    o.copy_from_slice(z);
    let bias = (gain != 0.0).then_some((support, b, z, o, gain));
    draft_rows(
        &keys_v,
        contiguous("h", h.as_slice())?,
        k,
        inv_two_sigma_sq,
        slices,
        bias,
    );
    Ok(())
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

struct Bank<'py> {
    keys: PyReadwriteArray2<'py, f32>,
    support: Option<PyReadwriteArray2<'py, i64>>,
    bias: PyReadwriteArray2<'py, f32>,
    counts: PyReadwriteArray1<'py, i64>,
}

struct Inputs<'py> {
    h: PyReadonlyArray2<'py, f32>,
    logp: PyReadonlyArray2<'py, f32>,
    logq: PyReadonlyArray2<'py, f32>,
}

/// Checks shapes, then runs `f` on the core's views.
fn with_views<R>(
    bank: &mut Bank<'_>,
    x: &Inputs<'_>,
    f: impl FnOnce(&mut BankArrays<'_>, &Positions<'_>) -> R,
) -> PyResult<R> {
    let ([n, d], [p, dh]) = (dims2(bank.keys.shape()), dims2(x.h.shape()));
    let ([pp, v], [pq, vq]) = (dims2(x.logp.shape()), dims2(x.logq.shape()));
    check(d == dh && p == pp && p == pq && v == vq, || {
        format!("h [{p}, {dh}], logp [{pp}, {v}], logq [{pq}, {vq}] and keys [{n}, {d}] disagree")
    })?;
    let [nb, width] = dims2(bank.bias.shape());
    check(nb == n && bank.counts.len() == n, || {
        "bias, counts and keys disagree on N".into()
    })?;
    match &bank.support {
        Some(s) => check(dims2(s.shape()) == [n, width] && width <= v, || {
            "bad support shape".into()
        })?,
        None => check(width == v, || {
            format!("a full-vocabulary bias needs {v} columns")
        })?,
    }
    let positions = Positions {
        h: contiguous("h", x.h.as_slice())?,
        logp: contiguous("logp", x.logp.as_slice())?,
        logq: contiguous("logq", x.logq.as_slice())?,
        vocab: v,
    };
    let mut arrays = BankArrays {
        keys: contiguous("keys", bank.keys.as_slice_mut())?,
        support: match bank.support.as_mut() {
            Some(s) => Some(contiguous("support", s.as_slice_mut())?),
            None => None,
        },
        bias: contiguous("bias", bank.bias.as_slice_mut())?,
        counts: contiguous("counts", bank.counts.as_slice_mut())?,
        dim: d,
    };
    Ok(f(&mut arrays, &positions))
}

type ObserveResult = (usize, usize, usize, Vec<(usize, usize)>, Vec<usize>);

/// One iteration's whole update with the books (`drift_bank_core::kernels::observe`), in place.
/// idx/sim/weight [P, k] are the draft step's retrievals. Returns (updated, refreshed, evicted,
/// allocations [(position, slot)] in order, slots that became valid).
#[pyfunction]
#[pyo3(signature = (books, tenant, keys, support, bias, counts, valid, h, logp, logq, idx, sim, weight,
                    tau, eta, adaptive, used_weight))]
#[allow(clippy::too_many_arguments)]
pub fn drift_observe<'py>(
    mut books: PyRefMut<'py, crate::PyBooks>,
    tenant: &str,
    keys: PyReadwriteArray2<'py, f32>,
    support: Option<PyReadwriteArray2<'py, i64>>,
    bias: PyReadwriteArray2<'py, f32>,
    counts: PyReadwriteArray1<'py, i64>,
    mut valid: PyReadwriteArray1<'py, bool>,
    h: PyReadonlyArray2<'py, f32>,
    logp: PyReadonlyArray2<'py, f32>,
    logq: PyReadonlyArray2<'py, f32>,
    idx: PyReadonlyArray2<'py, i64>,
    sim: PyReadonlyArray2<'py, f32>,
    weight: PyReadonlyArray2<'py, f32>,
    tau: f64,
    eta: f64,
    adaptive: bool,
    used_weight: f64,
) -> PyResult<ObserveResult> {
    let n = dims2(keys.shape())[0];
    let [p, k] = dims2(idx.shape());
    check(
        dims2(sim.shape()) == [p, k] && dims2(weight.shape()) == [p, k],
        || "idx, sim and weight differ in shape".into(),
    )?;
    check(dims2(h.shape())[0] == p, || {
        format!("idx has {p} rows, h {}", dims2(h.shape())[0])
    })?;
    check(valid.len() == n, || "valid and keys disagree on N".into())?;
    check(books.inner.capacity() as usize == n, || {
        "the books' capacity is not the bank size".into()
    })?;
    let idx_s = contiguous("idx", idx.as_slice())?;
    check(idx_s.iter().all(|&s| s < n as i64), || {
        "a neighbour id is out of range".into()
    })?;
    let found = Retrieved {
        idx: idx_s,
        sim: contiguous("sim", sim.as_slice())?,
        weight: contiguous("weight", weight.as_slice())?,
        k,
    };
    let valid = contiguous("valid", valid.as_slice_mut())?;
    let rule = Rule {
        tau,
        eta,
        adaptive,
        used_weight,
    };
    let mut bank = Bank {
        keys,
        support,
        bias,
        counts,
    };
    let x = Inputs { h, logp, logq };
    let done = with_views(&mut bank, &x, |b, x| {
        kernels::observe(&mut books.inner, tenant, b, valid, x, &found, &rule)
    })?
    .map_err(crate::py_err)?;
    Ok((
        done.updated,
        done.refreshed,
        done.evicted,
        done.allocations,
        done.newly_valid,
    ))
}
