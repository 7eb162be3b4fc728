//! torch in / out for the skinny GEMM (`drift_bank_core::skinny`): layout checks and the GIL
//! released around the core's call. No arithmetic here.

use drift_bank_core::skinny::{self, Problem};
use pyo3::exceptions::PyValueError;
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
