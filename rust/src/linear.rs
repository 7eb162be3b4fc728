//! torch in / out for the skinny GEMM (`drift_bank_core::skinny`): layout checks and the GIL
//! released around the core's call. No arithmetic here.

use drift_bank_core::layer;
use drift_bank_core::skinny::{self, Problem};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::kernels::tensor_layout;

/// A float32 CPU tensor's elements as a slice, if it is C-contiguous; with its shape.
///
/// # Safety
/// The tensor (held by the caller for 'a) must not be resized or freed while the slice lives.
unsafe fn contiguous_f32<'a>(name: &str, t: &'a Bound<'_, PyAny>) -> PyResult<(&'a [f32], Vec<usize>)> {
    let (ptr, shape, strides) = tensor_layout(name, t)?;
    let mut want = 1isize;
    for (&d, &s) in shape.iter().zip(&strides).rev() {
        if d != 1 && s != want {
            return Err(PyValueError::new_err(format!("{name} must be contiguous")));
        }
        want *= d as isize;
    }
    let len = shape.iter().product();
    // SAFETY: a contiguous float32 tensor of `len` elements at `ptr`, alive for 'a (the caller)
    let s = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ptr as *const f32, len) } };
    Ok((s, shape))
}

/// out [..., N] = x [..., K] · weight [N, K]ᵀ (+ bias [N]), float32 CPU tensors, contiguous,
/// on `threads` threads (the caller's and a persistent pool), without the GIL.
#[pyfunction]
#[pyo3(signature = (x, weight, bias, out, threads))]
pub fn skinny_linear(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<()> {
    // SAFETY (all four): the tensors are held by the caller for the whole call
    let (xs, xshape) = unsafe { contiguous_f32("x", x)? };
    let (ws, wshape) = unsafe { contiguous_f32("weight", weight)? };
    let bs = match bias {
        Some(b) => Some(unsafe { contiguous_f32("bias", b)? }.0),
        None => None,
    };
    let (os, oshape) = unsafe { contiguous_f32("out", out)? };
    let bad = |m: String| Err(PyValueError::new_err(m));
    if wshape.len() != 2 || xshape.is_empty() {
        return bad(format!("weight must be [N, K] and x [..., K], got {wshape:?} and {xshape:?}"));
    }
    let (n, k) = (wshape[0], wshape[1]);
    let lead = &xshape[..xshape.len() - 1];
    if xshape[xshape.len() - 1] != k || oshape.len() != xshape.len() || oshape[..lead.len()] != *lead || oshape[lead.len()] != n {
        return bad(format!("x {xshape:?}, weight {wshape:?} and out {oshape:?} disagree"));
    }
    let p = Problem::new(xs, ws, bs, k).map_err(PyValueError::new_err)?;
    let (o0, o1) = (os.as_ptr() as usize, os.as_ptr() as usize + os.len() * 4);
    for s in [xs, ws, bs.unwrap_or(&[])] {
        let (s0, s1) = (s.as_ptr() as usize, s.as_ptr() as usize + s.len() * 4);
        if !s.is_empty() && !os.is_empty() && s0 < o1 && o0 < s1 {
            return bad("out overlaps an input".into());
        }
    }
    let (optr, olen) = (os.as_ptr() as usize, os.len());
    py.detach(move || {
        // SAFETY: out is a distinct (checked), contiguous float32 buffer of m·n elements that the
        // caller holds and gave to be written
        let y = unsafe { std::slice::from_raw_parts_mut(optr as *mut f32, olen) };
        skinny::linear(&p, y, threads.max(1));
    });
    Ok(())
}

/// The sum of every element of `tensors` (float32 CPU tensors, contiguous), read on `threads`
/// threads as the skinny GEMM reads a weight, without the GIL: the weight-read floor's timed read.
#[pyfunction]
#[pyo3(signature = (tensors, threads))]
pub fn read_sum(py: Python<'_>, tensors: Vec<Bound<'_, PyAny>>, threads: usize) -> PyResult<f64> {
    // SAFETY: the tensors are held by the caller (the list) for the whole call
    let spans = tensors
        .iter()
        .map(|t| unsafe { contiguous_f32("tensor", t) }.map(|(s, _)| (s.as_ptr() as usize, s.len())))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(py.detach(move || {
        spans
            .iter()
            // SAFETY: as above; only read
            .map(|&(ptr, len)| skinny::read(unsafe { std::slice::from_raw_parts(ptr as *const f32, len) }, threads.max(1)) as f64)
            .sum()
    }))
}

/// Whether two float32 slices share memory.
fn overlaps(a: &[f32], b: &[f32]) -> bool {
    let (a0, a1) = (a.as_ptr() as usize, a.as_ptr() as usize + a.len() * 4);
    let (b0, b1) = (b.as_ptr() as usize, b.as_ptr() as usize + b.len() * 4);
    !a.is_empty() && !b.is_empty() && a0 < b1 && b0 < a1
}

/// out [..., Σ N_i] = RMSNorm(x) (where `norm_weight` is given, with `eps`) · [W_1; W_2; ...]ᵀ,
/// each weight's outputs side by side (q, k, v into one buffer); `add`: added into out (a
/// residual stream). float32 CPU tensors, contiguous; out overlaps no input. Without the GIL.
#[pyfunction]
#[pyo3(signature = (x, norm_weight, eps, weights, out, add, threads))]
#[allow(clippy::too_many_arguments)]
pub fn skinny_norm_linear(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    norm_weight: Option<&Bound<'_, PyAny>>,
    eps: f32,
    weights: Vec<Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    add: bool,
    threads: usize,
) -> PyResult<()> {
    // SAFETY (all): the tensors are held by the caller for the whole call
    let (xs, xshape) = unsafe { contiguous_f32("x", x)? };
    let nw = match norm_weight {
        Some(t) => Some(unsafe { contiguous_f32("norm_weight", t)? }.0),
        None => None,
    };
    let mut ws = Vec::with_capacity(weights.len());
    for w in &weights {
        ws.push(unsafe { contiguous_f32("weight", w)? }.0);
    }
    let (os, _) = unsafe { contiguous_f32("out", out)? };
    let k = *xshape.last().ok_or_else(|| PyValueError::new_err("x must be [..., K]"))?;
    if ws.iter().chain(nw.iter()).chain([&xs]).any(|s| overlaps(s, os)) {
        return Err(PyValueError::new_err("out overlaps an input"));
    }
    let (optr, olen) = (os.as_ptr() as usize, os.len());
    py.detach(move || {
        // SAFETY: out is a distinct (checked), contiguous float32 buffer the caller gave to be written
        let y = unsafe { std::slice::from_raw_parts_mut(optr as *mut f32, olen) };
        layer::norm_linears(xs, k, nw.map(|w| (w, eps)), &ws, y, add, None, threads.max(1))
    })
    .map_err(PyValueError::new_err)
}

/// h [..., d] += down(silu(gate(n)) · up(n)), n = RMSNorm(h) (norm_weight [d], eps), in place.
/// float32 CPU tensors, contiguous; h overlaps no weight. Without the GIL.
#[pyfunction]
#[pyo3(signature = (h, norm_weight, eps, gate, up, down, threads))]
#[allow(clippy::too_many_arguments)]
pub fn skinny_mlp(
    py: Python<'_>,
    h: &Bound<'_, PyAny>,
    norm_weight: &Bound<'_, PyAny>,
    eps: f32,
    gate: &Bound<'_, PyAny>,
    up: &Bound<'_, PyAny>,
    down: &Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<()> {
    // SAFETY (all): the tensors are held by the caller for the whole call
    let (hs, _) = unsafe { contiguous_f32("h", h)? };
    let (nw, _) = unsafe { contiguous_f32("norm_weight", norm_weight)? };
    let (g, _) = unsafe { contiguous_f32("gate", gate)? };
    let (u, _) = unsafe { contiguous_f32("up", up)? };
    let (d, _) = unsafe { contiguous_f32("down", down)? };
    if [nw, g, u, d].iter().any(|s| overlaps(s, hs)) {
        return Err(PyValueError::new_err("h overlaps a weight"));
    }
    let (hptr, hlen) = (hs.as_ptr() as usize, hs.len());
    py.detach(move || {
        // SAFETY: h is a distinct (checked), contiguous float32 buffer the caller gave to be updated
        let h = unsafe { std::slice::from_raw_parts_mut(hptr as *mut f32, hlen) };
        layer::mlp(h, (nw, eps), g, u, d, None, threads.max(1))
    })
    .map_err(PyValueError::new_err)
}

/// A float32 CPU tensor of 4 dimensions whose last one is contiguous: the elements it spans as a
/// slice, its shape and its first three strides.
///
/// # Safety
/// The tensor (held by the caller for 'a) must not be resized or freed while the slice lives.
unsafe fn strided4<'a>(name: &str, t: &'a Bound<'_, PyAny>) -> PyResult<(&'a [f32], [usize; 4], [usize; 3])> {
    let (ptr, shape, strides) = tensor_layout(name, t)?;
    if shape.len() != 4 || strides[3] != 1 || strides.iter().any(|&s| s < 0) {
        return Err(PyValueError::new_err(format!("{name} must be 4-D with a contiguous last dimension")));
    }
    let span = if shape.contains(&0) { 0 } else { 1 + (0..4).map(|i| (shape[i] - 1) * strides[i] as usize).sum::<usize>() };
    // SAFETY: the elements the shape and strides address lie within [ptr, ptr + span), alive for 'a
    let s = if span == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ptr as *const f32, span) } };
    let st = [strides[0] as usize, strides[1] as usize, strides[2] as usize];
    Ok((s, [shape[0], shape[1], shape[2], shape[3]], st))
}

/// out [R, S, Hq·D] = attention of q [R, S, Hq, D] over keys/values [R, Hkv, L, D] (grouped
/// heads, read in place; strided views allowed, the last dimension contiguous), scaled by
/// `scale`, plus an additive mask ([S, L] for every row, or [R, 1, S, L]), on `threads`
/// threads (the same bits on any number). Without the GIL.
#[pyfunction]
#[pyo3(signature = (q, keys, values, mask, scale, out, threads = 1))]
#[allow(clippy::too_many_arguments)]
pub fn attend_few(
    py: Python<'_>,
    q: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    mask: Option<&Bound<'_, PyAny>>,
    scale: f32,
    out: &Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<()> {
    // SAFETY (all): the tensors are held by the caller for the whole call
    let (qs, qshape, qst) = unsafe { strided4("q", q)? };
    let (ks, kshape, kst) = unsafe { strided4("keys", keys)? };
    let (vs, vshape, vst) = unsafe { strided4("values", values)? };
    let [r, s, hq, d] = qshape;
    let [_, hkv, len, _] = kshape;
    if kshape != vshape || kshape[0] != r || kshape[3] != d {
        return Err(PyValueError::new_err(format!("q {qshape:?}, keys {kshape:?} and values {vshape:?} disagree")));
    }
    let m = match mask {
        Some(t) => {
            let (ms, mshape) = unsafe { contiguous_f32("mask", t)? };
            let stride = match mshape[..] {
                [a, b] if a == s && b == len => 0,
                [a, 1, b, c] if a == r && b == s && c == len => s * len,
                _ => return Err(PyValueError::new_err(format!("mask {mshape:?} is not [S, L] or [R, 1, S, L] for S {s}, L {len}"))),
            };
            Some((ms, stride))
        }
        None => None,
    };
    let (os, oshape) = unsafe { contiguous_f32("out", out)? };
    if oshape.iter().product::<usize>() != r * s * hq * d || [qs, ks, vs].iter().any(|x| overlaps(x, os)) {
        return Err(PyValueError::new_err("out must be [R, S, Hq·D] and overlap no input"));
    }
    let (optr, olen) = (os.as_ptr() as usize, os.len());
    py.detach(move || {
        // SAFETY: out is a distinct (checked), contiguous float32 buffer the caller gave to be written
        let y = unsafe { std::slice::from_raw_parts_mut(optr as *mut f32, olen) };
        let view = |data, strides| layer::View { data, strides };
        layer::attend(view(qs, qst), view(ks, kst), view(vs, vst), m, [r, s, hq, hkv, len, d], scale, y, threads.max(1))
    })
    .map_err(PyValueError::new_err)
}

/// out [..., d] = RMSNorm(x) with weight [d] and eps (float32 CPU tensors, contiguous, out
/// distinct from x). Without the GIL.
#[pyfunction]
#[pyo3(signature = (x, weight, eps, out))]
pub fn rms_norm(py: Python<'_>, x: &Bound<'_, PyAny>, weight: &Bound<'_, PyAny>, eps: f32, out: &Bound<'_, PyAny>) -> PyResult<()> {
    // SAFETY (all): the tensors are held by the caller for the whole call
    let (xs, _) = unsafe { contiguous_f32("x", x)? };
    let (ws, _) = unsafe { contiguous_f32("weight", weight)? };
    let (os, _) = unsafe { contiguous_f32("out", out)? };
    if ws.is_empty() || xs.len() % ws.len() != 0 || os.len() != xs.len() || overlaps(xs, os) || overlaps(ws, os) {
        return Err(PyValueError::new_err("rms_norm: x [..., d], weight [d] and a distinct out like x"));
    }
    let (optr, olen) = (os.as_ptr() as usize, os.len());
    py.detach(move || {
        // SAFETY: out is a distinct (checked), contiguous float32 buffer the caller gave to be written
        let y = unsafe { std::slice::from_raw_parts_mut(optr as *mut f32, olen) };
        layer::rms_norm(xs, ws, eps, y)
    });
    Ok(())
}

/// A Llama decoder's weights, held, for `drift_bank_core::layer::decoder_step`: a whole
/// few-token step of one sequence in one call (Python side: drift_cli/engine/lean.py).
///
/// The weights are read at every step (OSD updates a draft's in place), never copied. Each
/// tensor's address is recorded at construction and compared at every step: a weight that moved
/// (`param.data = ...`, a reload) makes `step` return False without computing, and the caller
/// builds a new plan.
#[pyclass(module = "drift_cli._bank", name = "DecoderPlan")]
pub struct DecoderPlan {
    held: Vec<Py<PyAny>>,       // per layer: input norm, q, k, v, o, post norm, gate, up, down; then the final norm
    spans: Vec<(usize, usize)>, // each one's (address, elements) as checked
    shape: layer::DecoderShape,
}

/// The tensors a step writes or reads, checked distinct where one is written.
fn check_distinct(written: &[(&str, &[f32])], read: &[(&str, &[f32])]) -> PyResult<()> {
    for (i, (a, x)) in written.iter().enumerate() {
        for (b, y) in written[i + 1..].iter().chain(read) {
            if overlaps(x, y) {
                return Err(PyValueError::new_err(format!("{a} overlaps {b}")));
            }
        }
    }
    Ok(())
}

#[pymethods]
impl DecoderPlan {
    /// weights: 9 per layer (input norm [d], q [Hq·D, d], k and v [Hkv·D, d], o [d, Hq·D], post
    /// norm [d], gate and up [F, d], down [d, F]); float32 CPU tensors, contiguous.
    #[new]
    #[pyo3(signature = (weights, final_norm, heads, kv_heads, head_dim, eps, scale))]
    #[allow(clippy::too_many_arguments)]
    fn new(weights: Vec<Bound<'_, PyAny>>, final_norm: Bound<'_, PyAny>, heads: usize, kv_heads: usize, head_dim: usize, eps: f32, scale: f32) -> PyResult<Self> {
        let bad = |m: String| Err(PyValueError::new_err(m));
        if weights.is_empty() || weights.len() % 9 != 0 || kv_heads == 0 || heads % kv_heads != 0 || head_dim % 2 != 0 {
            return bad(format!("DecoderPlan: {} weights (9 a layer), {heads} heads over {kv_heads} KV heads of {head_dim}", weights.len()));
        }
        let mut spans = Vec::with_capacity(weights.len() + 1);
        let mut shapes = Vec::with_capacity(weights.len() + 1);
        for t in weights.iter().chain([&final_norm]) {
            // SAFETY: only the address and length are kept; the tensor is held by the plan
            let (s, shape) = unsafe { contiguous_f32("weight", t)? };
            spans.push((s.as_ptr() as usize, s.len()));
            shapes.push(shape);
        }
        let d = *shapes.last().and_then(|s| s.first()).unwrap_or(&0);
        let (nq, nk) = (heads * head_dim, kv_heads * head_dim);
        for (l, layer) in shapes[..weights.len()].chunks_exact(9).enumerate() {
            let f = layer[6].first().copied().unwrap_or(0);
            let want: [&[usize]; 9] = [&[d], &[nq, d], &[nk, d], &[nk, d], &[d, nq], &[d], &[f, d], &[f, d], &[d, f]];
            if layer.iter().zip(want).any(|(got, want)| got[..] != *want) || d == 0 {
                return bad(format!("DecoderPlan: layer {l}'s weights {layer:?} are not a Llama layer of d {d}"));
            }
        }
        let held = weights.iter().chain([&final_norm]).map(|t| t.clone().unbind()).collect();
        Ok(DecoderPlan { held, spans, shape: layer::DecoderShape { heads, kv_heads, head_dim, eps, scale } })
    }

    /// Whether every weight is still where the plan found it.
    fn current(&self, py: Python<'_>) -> PyResult<bool> {
        for (t, &(ptr, _)) in self.held.iter().zip(&self.spans) {
            if t.bind(py).call_method0(intern!(py, "data_ptr"))?.extract::<usize>()? != ptr {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// h [1, S, d] (updated in place) through every layer; out [1, S, d] = the final RMSNorm.
    /// cos, sin [1, S, D]; cache [layers, 2, 1, Hkv, capacity, D] (positions from `start` are
    /// written); mask [S, start + S] additive (None for S = 1); the inputs of the layers in
    /// `record` (ascending) into recorded [len(record), 1, S, d]. False (nothing computed) where
    /// a weight moved.
    #[pyo3(signature = (h, cos, sin, cache, start, mask, record, recorded, out, threads))]
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        py: Python<'_>,
        h: &Bound<'_, PyAny>,
        cos: &Bound<'_, PyAny>,
        sin: &Bound<'_, PyAny>,
        cache: &Bound<'_, PyAny>,
        start: usize,
        mask: Option<&Bound<'_, PyAny>>,
        record: Vec<usize>,
        recorded: Option<&Bound<'_, PyAny>>,
        out: &Bound<'_, PyAny>,
        threads: usize,
    ) -> PyResult<bool> {
        if !self.current(py)? {
            return Ok(false);
        }
        let DecoderPlan { spans, shape, .. } = self;
        let layers = (spans.len() - 1) / 9;
        // SAFETY (all): the tensors are held by the caller for the whole call
        let (hs, _) = unsafe { contiguous_f32("h", h)? };
        let (cs, _) = unsafe { contiguous_f32("cos", cos)? };
        let (ss, _) = unsafe { contiguous_f32("sin", sin)? };
        let (ks, kshape) = unsafe { contiguous_f32("cache", cache)? };
        let (os, _) = unsafe { contiguous_f32("out", out)? };
        let ms = match mask {
            Some(t) => Some(unsafe { contiguous_f32("mask", t)? }.0),
            None => None,
        };
        let rs = match recorded {
            Some(t) => unsafe { contiguous_f32("recorded", t)? }.0,
            None => &[][..],
        };
        if kshape.len() != 6 || kshape[0] != layers || kshape[1] != 2 || kshape[2] != 1 || kshape[3] != shape.kv_heads || kshape[5] != shape.head_dim {
            return Err(PyValueError::new_err(format!("cache {kshape:?} is not [{layers}, 2, 1, {}, capacity, {}]", shape.kv_heads, shape.head_dim)));
        }
        // SAFETY: addresses checked current just above; the plan holds the tensors
        let weight = |i: usize| unsafe { std::slice::from_raw_parts(spans[i].0 as *const f32, spans[i].1) };
        let mut read: Vec<(&str, &[f32])> = vec![("cos", cs), ("sin", ss), ("mask", ms.unwrap_or(&[]))];
        read.extend((0..spans.len()).map(|i| ("a weight", weight(i))));
        check_distinct(&[("h", hs), ("cache", ks), ("out", os), ("recorded", rs)], &read)?;
        let capacity = kshape[4];
        let mutable = |s: &[f32]| (s.as_ptr() as usize, s.len());
        let (hp, kp, op, rp) = (mutable(hs), mutable(ks), mutable(os), mutable(rs));
        let shape = *shape;
        py.detach(move || {
            let ws: Vec<layer::LayerWeights<'_>> = (0..layers)
                .map(|l| {
                    let w = |j| weight(9 * l + j);
                    layer::LayerWeights { input_norm: w(0), q: w(1), k: w(2), v: w(3), o: w(4), post_norm: w(5), gate: w(6), up: w(7), down: w(8) }
                })
                .collect();
            let written = |(p, n): (usize, usize)| -> &mut [f32] {
                // SAFETY: distinct (checked), contiguous float32 buffers the caller gave to be written
                if n == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n) } }
            };
            let cache = layer::StepCache { data: written(kp), capacity, start };
            layer::decoder_step(written(hp), &ws, weight(spans.len() - 1), shape, (cs, ss), cache, ms, &record, written(rp), written(op), threads.max(1))
        })
        .map_err(PyValueError::new_err)?;
        Ok(true)
    }
}
