//! DRIFT's arithmetic on the CPU: retrieval fused with the bias add, the EMA update and the
//! allocation of new prototypes, on plain row-major slices.
//!
//! These are the CPU path of `drift_kernels` (the PyTorch reference in
//! `drift_kernels/reference.py` is the ground truth; the Triton kernels are the GPU path). On a
//! CPU a DRIFT step is a few hundred kilo-FLOPs spread over dozens of tiny operations, so the
//! per-call cost of a tensor library, not arithmetic, decides whether DRIFT stays under a few
//! percent of an iteration; here one call does a whole draft step or a whole update.
//!
//! Numerics, stated once (the Python tests pin them against the reference):
//! - similarities are fp32 dot products (8 partial sums) times 1/max(|h|, 1e-12); the k best by
//!   (similarity desc, slot asc), so ties go to the lower slot;
//! - the bias add is bit-identical to the reference: per token, Σ_j w_j·B_j[t] accumulated in
//!   fp32 from 0 in neighbour order j = 0..k-1, divided by max(1, Σ_j w_j) (fp32, in order),
//!   scaled by λ and added to z, with no fused multiply-add;
//! - the EMA step rounds the rate as torch does a Python float (rate and 1 - rate computed in
//!   f64, then rounded to f32); log-sum-exps accumulate in f64.

/// |h| floor before dividing (a zero hidden state gives zero similarities).
pub const NORM_EPS: f32 = 1e-12;
/// Residuals are clipped to ±RESIDUAL_CLIP (the same bound as drift_kernels/reference.py).
pub const RESIDUAL_CLIP: f32 = 10.0;

const LANES: usize = 8;

/// Sums the 8 partial sums in a fixed tree, then the tail: the one reduction order of [`dot`].
#[inline(always)]
fn finish(acc: [f32; LANES], a: &[f32], b: &[f32]) -> f32 {
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

/// fp32 dot product with 8 independent partial sums (vectorises without fast-math, and gives
/// the same bits on every instruction set: no fused multiply-add, one reduction order).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        let (x, y): (&[f32; LANES], &[f32; LANES]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    finish(acc, ra, rb)
}

fn norm(x: &[f32]) -> f32 {
    dot(x, x).sqrt().max(NORM_EPS)
}

/// out[i] = keys[i]·h for every row, exactly as [`dot`] computes it.
fn dots_portable(keys: &[f32], h: &[f32], out: &mut [f32]) {
    for (row, o) in keys.chunks_exact(h.len()).zip(out) {
        *o = dot(row, h);
    }
}

/// [`dots_portable`] with 256-bit registers, eight rows at a time, then four (one partial-sum
/// chain per row would leave the adder waiting on its own latency). Lane l of a row's
/// accumulator holds the same sum as `dot`'s acc[l] (separate multiply and add, no FMA), and the
/// eight rows' accumulators are reduced together in [`finish`]'s tree (below), so the bits are
/// equal.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots_avx2(keys: &[f32], h: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_hadd_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_permute2f128_ps,
        _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let d = h.len();
    let body = d - d % LANES;
    let eights = out.len() - out.len() % 8;
    for r in (0..eights).step_by(8) {
        let base = keys.as_ptr().add(r * d);
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in (0..body).step_by(LANES) {
            let y = _mm256_loadu_ps(h.as_ptr().add(c));
            for (b, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(base.add(b * d + c)), y));
            }
        }
        // finish's tree for eight rows at once: lanes l + (l + 4) (low half + high half), then
        // (q0 + q1) and (q2 + q3) by horizontal adds, then their sum; row i lands in lane
        // [0, 4, 1, 5, 2, 6, 3, 7][i]
        let halves = |a: __m256, b: __m256| {
            _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
        };
        let (s01, s23, s45, s67) = (halves(acc[0], acc[1]), halves(acc[2], acc[3]), halves(acc[4], acc[5]), halves(acc[6], acc[7]));
        let t = _mm256_hadd_ps(_mm256_hadd_ps(s01, s23), _mm256_hadd_ps(s45, s67));
        let mut lanes = [0f32; LANES];
        _mm256_storeu_ps(lanes.as_mut_ptr(), t);
        for (b, lane) in [0, 4, 1, 5, 2, 6, 3, 7].into_iter().enumerate() {
            let row = &keys[(r + b) * d..(r + b + 1) * d];
            let mut s = lanes[lane];
            for (x, y) in row[body..].iter().zip(&h[body..]) {
                s += x * y;
            }
            out[r + b] = s;
        }
    }
    dots4_avx2(&keys[eights * d..], h, &mut out[eights..]);
}

/// [`dots_avx2`]'s remainder: four rows at a time, then one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots4_avx2(keys: &[f32], h: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    const ROWS: usize = 4;
    let d = h.len();
    let body = d - d % LANES;
    let full = out.len() - out.len() % ROWS;
    for r in (0..full).step_by(ROWS) {
        let base = keys.as_ptr().add(r * d);
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for c in (0..body).step_by(LANES) {
            let y = _mm256_loadu_ps(h.as_ptr().add(c));
            for (b, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(base.add(b * d + c)), y));
            }
        }
        for (b, a) in acc.into_iter().enumerate() {
            let mut lanes = [0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), a);
            let row = &keys[(r + b) * d..(r + b + 1) * d];
            out[r + b] = finish(lanes, &row[body..], &h[body..]);
        }
    }
    dots_portable(&keys[full * d..], h, &mut out[full..]);
}

/// keys [R, d] · h [d] -> out [R], dispatched on the CPU's vector width (same bits either way).
pub fn dots(keys: &[f32], h: &[f32], out: &mut [f32]) {
    assert_eq!(keys.len(), h.len() * out.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { dots_avx2(keys, h, out) };
    }
    dots_portable(keys, h, out)
}

/// The k nearest prototypes of one query, most similar first.
///
/// (Negated comparisons on purpose: a NaN similarity never enters the list.)
///
/// `keys` holds `keys.len() / h.len()` rows of unit keys; `valid` (same number of rows, or
/// `None` for all valid) masks free slots. Writes `idx` (-1 where fewer than k are valid),
/// `sim` (-inf there) and the Gaussian kernel weights `w` = exp(-(1 - s)² · inv_two_sigma_sq)
/// (0 there). `scratch` is resized to the number of rows.
#[allow(clippy::too_many_arguments, clippy::neg_cmp_op_on_partial_ord)]
pub fn nearest(
    h: &[f32],
    keys: &[f32],
    valid: Option<&[bool]>,
    inv_two_sigma_sq: f32,
    idx: &mut [i64],
    sim: &mut [f32],
    w: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let (d, k) = (h.len(), idx.len());
    idx.fill(-1);
    sim.fill(f32::NEG_INFINITY);
    w.fill(0.0);
    if k == 0 || d == 0 {
        return;
    }
    scratch.resize(keys.len() / d, 0.0);
    dots(keys, h, scratch);
    let scale = 1.0 / norm(h);
    let mut filled = 0usize;
    for (slot, &dp) in scratch.iter().enumerate() {
        let s = dp * scale;
        // strict comparisons: an equal similarity at a later slot never displaces an earlier one
        if !(s > sim[k - 1]) || valid.is_some_and(|v| !v[slot]) {
            continue;
        }
        let mut at = filled.min(k - 1);
        while at > 0 && s > sim[at - 1] {
            sim[at] = sim[at - 1];
            idx[at] = idx[at - 1];
            at -= 1;
        }
        sim[at] = s;
        idx[at] = slot as i64;
        filled = (filled + 1).min(k);
    }
    for j in 0..filled {
        let dist = 1.0 - sim[j];
        w[j] = (-(dist * dist) * inv_two_sigma_sq).exp();
    }
}

/// What a prototype's bias covers: `m` token ids per slot (`ids` [N, m]), or the whole vocabulary.
#[derive(Clone, Copy)]
pub enum Support<'a> {
    Sparse { ids: &'a [i64], m: usize },
    Full,
}

/// `out` = z + λβ for one row, where β is the weighted mean of the neighbours' biases.
///
/// `out` must already equal `z`; only support positions are written. `acc` is a zeroed scratch
/// row of the vocabulary's length and is left zeroed. Token ids are trusted to be < V.
#[allow(clippy::too_many_arguments)]
pub fn bias_add_row(
    z: &[f32],
    out: &mut [f32],
    idx: &[i64],
    w: &[f32],
    support: Support<'_>,
    bias: &[f32],
    gain: f32,
    acc: &mut [f32],
) {
    if idx.iter().all(|&s| s < 0) {
        return;
    }
    let mut total = 0f32;
    for &x in w {
        total += x; // j = 0..k-1 in order
    }
    let den = total.max(1.0);
    match support {
        Support::Sparse { ids, m } => {
            let live = || {
                idx.iter()
                    .zip(w)
                    .filter(|(s, _)| **s >= 0)
                    .map(|(&s, &wj)| (s as usize, wj))
            };
            for (slot, wj) in live() {
                let row = slot * m..(slot + 1) * m;
                for (&tok, &b) in ids[row.clone()].iter().zip(&bias[row]) {
                    acc[tok as usize] += wj * b;
                }
            }
            for (slot, _) in live() {
                for &tok in &ids[slot * m..(slot + 1) * m] {
                    let t = tok as usize;
                    out[t] = z[t] + gain * (acc[t] / den);
                }
            }
            for (slot, _) in live() {
                for &tok in &ids[slot * m..(slot + 1) * m] {
                    acc[tok as usize] = 0.0;
                }
            }
        }
        Support::Full => {
            let v = z.len();
            for (&slot, &wj) in idx.iter().zip(w).filter(|(s, _)| **s >= 0) {
                let row = &bias[slot as usize * v..(slot as usize + 1) * v];
                for (a, &b) in acc.iter_mut().zip(row) {
                    *a += wj * b;
                }
            }
            for ((o, &zt), a) in out.iter_mut().zip(z).zip(acc.iter_mut()) {
                *o = zt + gain * (*a / den);
                *a = 0.0;
            }
        }
    }
}

/// log Σ exp(x) of a few gathered values (f64 accumulation; an all -inf row gives -inf).
fn log_sum_exp(values: impl Iterator<Item = f32> + Clone) -> f32 {
    let top = values.clone().fold(f32::NEG_INFINITY, f32::max);
    let top = if top.is_finite() { top } else { 0.0 };
    let sum: f64 = values.map(|x| ((x - top) as f64).exp()).sum();
    (sum.ln() as f32) + top
}

/// exp(x) for x <= 0 in straight-line fp32 (vectorisable): 2^n · P(r), Cephes' polynomial,
/// within ~2 ulp of the correctly rounded value; underflows to 0 below -87.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let x = if x < -87.0 { -87.0 } else { x };
    let t = x * LOG2E + ROUND; // n = round(x·log2 e) sits in t's low mantissa bits
    let n = t - ROUND;
    let r = (x - n * 0.693_359_4) - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = p * r + c;
    }
    let p = p * (r * r) + r + 1.0;
    let bits = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32) + 127; // n + bias, integer ops only
    p * f32::from_bits((bits as u32) << 23)
}

/// Σ exp(x - top) in 16 fp32 partial sums (each term is at most 1, so a partial sum of V/16
/// terms loses at most ~V/16 ulp; in practice ~1e-6 relative at V = 128k), reduced in f64.
#[inline(always)]
fn sum_exp_portable(x: &[f32], top: f32) -> f64 {
    const W: usize = 2 * LANES;
    let mut acc = [0f32; W];
    let chunks = x.chunks_exact(W);
    let tail = chunks.remainder();
    for c in chunks {
        let c: &[f32; W] = c.try_into().unwrap();
        for l in 0..W {
            acc[l] += exp_nonpositive(c[l] - top);
        }
    }
    let mut s: f64 = acc.iter().map(|&a| a as f64).sum();
    for &v in tail {
        s += exp_nonpositive(v - top) as f64;
    }
    s
}

/// The largest value (NaN-blind; -inf for an empty or all -inf row).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        let c: &[f32; LANES] = c.try_into().unwrap();
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    tail.iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_exp_avx2(x: &[f32], top: f32) -> f64 {
    sum_exp_portable(x, top)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_max_avx2(x: &[f32]) -> f32 {
    row_max(x)
}

/// log Σ exp(x) over a whole row (a vocabulary): max, then Σ exp(x - max) in f64 lanes.
pub fn row_log_sum_exp(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        let top = unsafe { row_max_avx2(x) };
        if !top.is_finite() {
            return top;
        }
        return (unsafe { sum_exp_avx2(x, top) }.ln() as f32) + top;
    }
    let top = row_max(x);
    if !top.is_finite() {
        return top; // all -inf (or a +inf row, which the caller's clip then handles)
    }
    (sum_exp_portable(x, top).ln() as f32) + top
}

/// The ids of the m largest of `value(t)` for t < n, by (value desc, id asc), into `ids`
/// (one pass with a sorted buffer: most values fail the first comparison; a NaN never enters
/// a full buffer).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn top_ids(n: usize, value: impl Fn(usize) -> f32, ids: &mut [i64], vals: &mut Vec<f32>) {
    let m = ids.len();
    vals.clear();
    vals.resize(m, f32::NEG_INFINITY);
    let mut filled = 0usize;
    for t in 0..n {
        let v = value(t);
        if filled == m && !(v > vals[m - 1]) {
            continue;
        }
        let mut at = if filled == m { m - 1 } else { filled };
        while at > 0 && v > vals[at - 1] {
            vals[at] = vals[at - 1];
            ids[at] = ids[at - 1];
            at -= 1;
        }
        vals[at] = v;
        ids[at] = t as i64;
        filled += usize::from(filled < m);
    }
}

/// r = (log p_S - lse(log p_S)) - (log q_S - lse(log q_S)), clipped: the residual on `ids`.
fn support_residual(lp: &[f32], lq: &[f32], ids: &[i64], r: &mut [f32]) {
    let np = log_sum_exp(ids.iter().map(|&t| lp[t as usize]));
    let nq = log_sum_exp(ids.iter().map(|&t| lq[t as usize]));
    for (ri, &t) in r.iter_mut().zip(ids) {
        let t = t as usize;
        *ri = ((lp[t] - np) - (lq[t] - nq)).clamp(-RESIDUAL_CLIP, RESIDUAL_CLIP);
    }
}

/// r = normalised log p - normalised log q over the whole vocabulary, clipped.
fn full_residual(lp: &[f32], lq: &[f32], r: &mut [f32]) {
    let (np, nq) = (row_log_sum_exp(lp), row_log_sum_exp(lq));
    for ((ri, &a), &b) in r.iter_mut().zip(lp).zip(lq) {
        *ri = ((a - np) - (b - nq)).clamp(-RESIDUAL_CLIP, RESIDUAL_CLIP);
    }
}

/// First index of the maximum (as numpy's and torch's argmax; NaN-blind, 0 for an empty or all
/// -inf row): the vectorised maximum, then the first position holding it (a scalar running
/// argmax carries a dependency from element to element: several times slower over a vocabulary).
fn argmax(x: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    let top = if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        unsafe { row_max_avx2(x) }
    } else {
        row_max(x)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let top = row_max(x);
    x.iter().position(|&v| v == top).unwrap_or(0)
}

/// One prototype's EMA step: rate η_i = max(η, 1/(n_i + 1)) (or η), B ← (1 - η_i)·B + η_i·r,
/// K ← normalise((1 - η_i)·K + η_i·ĥ), n_i += 1. The rate and 1 - rate are computed in f64 and
/// rounded to f32, as torch rounds a Python float. Returns the rate η_i (f64).
pub fn ema(
    key: &mut [f32],
    bias: &mut [f32],
    count: &mut i64,
    r: &[f32],
    h: &[f32],
    eta: f64,
    adaptive: bool,
) -> f64 {
    let rate64 = if adaptive {
        eta.max(1.0 / (*count as f64 + 1.0))
    } else {
        eta
    };
    let (rate, keep) = (rate64 as f32, (1.0 - rate64) as f32);
    for (b, &ri) in bias.iter_mut().zip(r) {
        *b = keep * *b + rate * ri;
    }
    let hnorm = norm(h);
    for (k, &v) in key.iter_mut().zip(h) {
        *k = keep * *k + rate * (v / hnorm);
    }
    let knorm = norm(key);
    for k in key.iter_mut() {
        *k /= knorm;
    }
    *count += 1;
    rate64
}

/// The bank's mutable arrays, row-major: keys [N, d], support ids [N, m] (absent for a
/// full-vocabulary bank), biases [N, m or V], update counts [N].
pub struct BankArrays<'a> {
    pub keys: &'a mut [f32],
    pub support: Option<&'a mut [i64]>,
    pub bias: &'a mut [f32],
    pub counts: &'a mut [i64],
    pub dim: usize,
}

/// One iteration's inputs at the drafted positions: draft hidden states h [P, d] and the
/// target's and the draft's unbiased log-probabilities (unnormalised will do) [P, V].
pub struct Positions<'a> {
    pub h: &'a [f32],
    pub logp: &'a [f32],
    pub logq: &'a [f32],
    pub vocab: usize,
}

impl Positions<'_> {
    fn row<'b>(&self, x: &'b [f32], p: usize) -> &'b [f32] {
        &x[p * self.vocab..(p + 1) * self.vocab]
    }
}

impl BankArrays<'_> {
    fn width(&self) -> usize {
        self.bias.len() / self.counts.len()
    }

    /// The matched update, one (position, slot) pair at a time in the order given (a slot may
    /// repeat). Support refresh, residual on the refreshed support, EMA of bias and key, count.
    /// Returns how many support refreshes happened; each pair's EMA rate is appended to `rates`.
    pub fn update(
        &mut self,
        x: &Positions<'_>,
        pairs: &[(usize, usize)],
        eta: f64,
        adaptive: bool,
        rates: &mut Vec<f64>,
    ) -> usize {
        let (d, width) = (self.dim, self.width());
        let mut refreshed = 0;
        let mut r = vec![0f32; width];
        for &(p, slot) in pairs {
            let (lp, lq) = (x.row(x.logp, p), x.row(x.logq, p));
            let brow = slot * width..(slot + 1) * width;
            match self.support.as_deref_mut() {
                Some(support) => {
                    let ids = &mut support[brow.clone()];
                    let top = argmax(lp) as i64;
                    if !ids.contains(&top) {
                        let b = &mut self.bias[brow.clone()];
                        let weakest =
                            (0..width).fold(
                                0,
                                |best, t| if b[t].abs() < b[best].abs() { t } else { best },
                            );
                        ids[weakest] = top;
                        b[weakest] = 0.0;
                        refreshed += 1;
                    }
                    support_residual(lp, lq, ids, &mut r);
                }
                None => full_residual(lp, lq, &mut r),
            }
            let h = &x.h[p * d..(p + 1) * d];
            let key = &mut self.keys[slot * d..(slot + 1) * d];
            rates.push(ema(
                key,
                &mut self.bias[brow],
                &mut self.counts[slot],
                &r,
                h,
                eta,
                adaptive,
            ));
        }
        refreshed
    }

    /// New prototypes: K = ĥ, S = the top-m tokens by max(p, q) (normalised over V; ties to the
    /// lower id), B = the residual on S, n = 1. Pairs are applied in order.
    pub fn allocate(&mut self, x: &Positions<'_>, pairs: &[(usize, usize)]) {
        let (d, width, v) = (self.dim, self.width(), x.vocab);
        let mut vals = Vec::with_capacity(width);
        for &(p, slot) in pairs {
            let (lp, lq) = (x.row(x.logp, p), x.row(x.logq, p));
            let brow = slot * width..(slot + 1) * width;
            match self.support.as_deref_mut() {
                Some(support) => {
                    let (np, nq) = (row_log_sum_exp(lp), row_log_sum_exp(lq));
                    let ids = &mut support[brow.clone()];
                    top_ids(v, |t| (lp[t] - np).max(lq[t] - nq), ids, &mut vals);
                    support_residual(lp, lq, ids, &mut self.bias[brow]);
                }
                None => full_residual(lp, lq, &mut self.bias[brow]),
            }
            let h = &x.h[p * d..(p + 1) * d];
            let hnorm = norm(h);
            for (k, &val) in self.keys[slot * d..(slot + 1) * d].iter_mut().zip(h) {
                *k = val / hnorm;
            }
            self.counts[slot] = 1;
        }
    }
}

/// A retrieval's results for P positions: slot ids (-1 = none), similarities and kernel
/// weights, each [P, k] row-major, nearest first.
pub struct Retrieved<'a> {
    pub idx: &'a [i64],
    pub sim: &'a [f32],
    pub weight: &'a [f32],
    pub k: usize,
}

/// The knobs `observe` needs.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// compared in f64, as Python compares an fp32 similarity with a float
    pub tau: f64,
    pub eta: f64,
    pub adaptive: bool,
    /// a retrieved slot counts as used when its weight exceeds this (compared in f64)
    pub used_weight: f64,
}

/// What one `observe` did.
#[derive(Debug, Default, PartialEq)]
pub struct Observed {
    pub updated: usize,
    pub refreshed: usize,
    pub evicted: usize,
    /// (position, slot) for every allocation the books made, in order (a tiny bank may hand the
    /// same slot out twice; then the last position keeps it)
    pub allocations: Vec<(usize, usize)>,
    /// (position, slot) of every matched position, in order (the nearest prototype within τ)
    pub matched: Vec<(usize, usize)>,
    /// the EMA rate η_i each matched update used, in the order of `matched`
    pub rates: Vec<f64>,
    /// slots that became valid
    pub newly_valid: Vec<usize>,
}

/// Indices of the last occurrence of each distinct item, in order.
fn last_occurrences(items: &[usize]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    let mut keep: Vec<usize> = (0..items.len())
        .rev()
        .filter(|&i| seen.insert(items[i]))
        .collect();
    keep.reverse();
    keep
}

/// One iteration's DRIFT update, drafted positions in order, books included:
/// 1. position p is matched when its nearest prototype exists with similarity >= τ;
/// 2. one `touch` of the slots retrieved with weight > `used_weight` and the matched slots,
///    each once, ordered by its last use;
/// 3. the matched updates in position order ([`BankArrays::update`]);
/// 4. one allocation per other position, in order; when a slot repeats, its last position
///    writes it ([`BankArrays::allocate`]); new slots are marked in `valid`.
///
/// The same steps as `drift_kernels.reference.observe` (the specification, and the path for
/// devices), which the tests compare this with.
pub fn observe(
    books: &mut crate::Books,
    tenant: &str,
    bank: &mut BankArrays<'_>,
    valid: &mut [bool],
    x: &Positions<'_>,
    found: &Retrieved<'_>,
    rule: &Rule,
) -> crate::Result<Observed> {
    let k = found.k;
    let rows = found.idx.len() / k.max(1);
    let nearest = |p: usize| (found.idx[p * k], found.sim[p * k]);
    let is_matched = |p: usize| {
        let (slot, s) = nearest(p);
        slot >= 0 && s as f64 >= rule.tau
    };
    let matched: Vec<(usize, usize)> = (0..rows)
        .filter(|&p| is_matched(p))
        .map(|p| (p, nearest(p).0 as usize))
        .collect();
    let mut used: Vec<usize> = Vec::with_capacity(rows * k + matched.len());
    for p in 0..rows {
        for j in 0..k {
            let (slot, w) = (found.idx[p * k + j], found.weight[p * k + j]);
            if slot >= 0 && w as f64 > rule.used_weight {
                used.push(slot as usize);
            }
        }
    }
    used.extend(matched.iter().map(|&(_, slot)| slot));
    if !used.is_empty() {
        let order: Vec<u32> = last_occurrences(&used)
            .into_iter()
            .map(|i| used[i] as u32)
            .collect();
        books.touch(&order)?;
    }
    let mut out = Observed {
        updated: matched.len(),
        ..Observed::default()
    };
    out.refreshed = bank.update(x, &matched, rule.eta, rule.adaptive, &mut out.rates);
    for p in (0..rows).filter(|&p| !is_matched(p)) {
        let a = books.allocate(tenant)?;
        out.evicted += usize::from(a.evicted_from.is_some());
        out.allocations.push((p, a.slot as usize));
    }
    let slots: Vec<usize> = out.allocations.iter().map(|&(_, s)| s).collect();
    let keep: Vec<(usize, usize)> = last_occurrences(&slots)
        .into_iter()
        .map(|i| out.allocations[i])
        .collect();
    bank.allocate(x, &keep);
    for &(_, slot) in &keep {
        if !valid[slot] {
            valid[slot] = true;
            out.newly_valid.push(slot);
        }
    }
    out.matched = matched;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_sum() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.25).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - want).abs() < 1e-4);
    }

    #[test]
    fn blocked_dots_equal_dot_bit_for_bit() {
        for (rows, d) in [(9usize, 19usize), (4, 8), (7, 96), (1, 3), (13, 24), (8, 64), (21, 64), (17, 70)] {
            let keys: Vec<f32> = (0..rows * d)
                .map(|i| ((i * 7919 % 1013) as f32) / 517.0 - 1.0)
                .collect();
            let h: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut out = vec![0f32; rows];
            dots(&keys, &h, &mut out);
            dots_portable(&keys, &h, &mut out.clone());
            for (r, o) in out.iter().enumerate() {
                assert_eq!(
                    o.to_bits(),
                    dot(&keys[r * d..(r + 1) * d], &h).to_bits(),
                    "rows {rows} d {d} row {r}"
                );
            }
        }
    }

    #[test]
    fn fast_exp_and_row_log_sum_exp_are_accurate() {
        for i in 0..=1740 {
            let x = -(i as f32) * 0.05; // down to -87, where the clamp starts
            let (got, want) = (exp_nonpositive(x), (x as f64).exp());
            assert!(
                ((got as f64) - want).abs() <= want * 3e-7 + 1e-38,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp_nonpositive(-200.0), exp_nonpositive(-87.0)); // clamped, tiny
        let row: Vec<f32> = (0..4099)
            .map(|i| ((i * 37 % 101) as f32) * 0.2 - 9.0)
            .collect();
        let want = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!(((row_log_sum_exp(&row) as f64) - want).abs() < 2e-6);
        assert_eq!(row_log_sum_exp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        let scalar = |x: &[f32]| {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            best
        };
        for n in [1usize, 7, 8, 9, 33, 4099] {
            let mut x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32) * 0.01 - 3.0)
                .collect();
            assert_eq!(argmax(&x), scalar(&x), "n {n}");
            if n > 3 {
                let top = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) + 1.0;
                x[n / 3] = top; // two equal maxima: the first wins
                x[n - 1] = top;
                assert_eq!(argmax(&x), n / 3);
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 5]), 0);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 2.0]), 2);
    }

    #[test]
    fn top_ids_breaks_ties_by_the_lower_id() {
        let x = [0.5f32, 0.9, 0.5, 0.9, 0.1, 0.5];
        let mut ids = [0i64; 3];
        top_ids(x.len(), |t| x[t], &mut ids, &mut Vec::new());
        assert_eq!(ids, [1, 3, 0]);
        let mut all = [0i64; 6];
        top_ids(x.len(), |t| x[t], &mut all, &mut Vec::new());
        assert_eq!(all, [1, 3, 0, 2, 5, 4]);
    }

    #[test]
    fn nearest_orders_by_similarity_and_ties_go_to_the_lower_slot() {
        // unit keys in 2-D: slots 1 and 3 identical (a tie), slot 2 invalid
        let keys = [1.0, 0.0, 0.6, 0.8, 0.0, 1.0, 0.6, 0.8, -1.0, 0.0];
        let valid = [true, true, false, true, true];
        let (mut idx, mut sim, mut w) = ([0i64; 3], [0f32; 3], [0f32; 3]);
        nearest(
            &[0.0, 2.0],
            &keys,
            Some(&valid),
            2.0,
            &mut idx,
            &mut sim,
            &mut w,
            &mut Vec::new(),
        );
        assert_eq!(idx, [1, 3, 0]);
        assert!((sim[0] - 0.8).abs() < 1e-6 && sim[2].abs() < 1e-6);
        let want = (-(0.2f32 * 0.2) * 2.0).exp();
        assert!((w[0] - want).abs() < 1e-6 && w[0] == w[1]);
    }

    #[test]
    fn nearest_pads_when_fewer_than_k_are_valid() {
        let keys = [1.0, 0.0, 0.0, 1.0];
        let (mut idx, mut sim, mut w) = ([0i64; 4], [0f32; 4], [0f32; 4]);
        nearest(
            &[1.0, 1.0],
            &keys,
            Some(&[false, true]),
            1.0,
            &mut idx,
            &mut sim,
            &mut w,
            &mut Vec::new(),
        );
        assert_eq!(idx, [1, -1, -1, -1]);
        assert!(sim[1] == f32::NEG_INFINITY && w[1] == 0.0 && w[0] > 0.0);
    }

    #[test]
    fn bias_add_sums_colliding_tokens_in_neighbour_order() {
        // two neighbours both carrying token 2; weights sum to 1.5 > 1 so β is their weighted mean
        let ids = [2i64, 0, 2, 3];
        let bias = [1.0f32, -1.0, 0.5, 2.0];
        let z = [0.0f32; 4];
        let mut out = z;
        let mut acc = [0f32; 4];
        bias_add_row(
            &z,
            &mut out,
            &[0, 1],
            &[1.0, 0.5],
            Support::Sparse { ids: &ids, m: 2 },
            &bias,
            2.0,
            &mut acc,
        );
        let den = 1.5f32;
        assert_eq!(
            out,
            [
                2.0 * (-1.0 / den),
                0.0,
                2.0 * ((1.0 + 0.5 * 0.5) / den),
                2.0 * ((0.5 * 2.0) / den)
            ]
        );
        assert_eq!(acc, [0.0; 4]);
    }

    #[test]
    fn update_refreshes_the_weakest_entry_then_applies_the_ema() {
        let mut keys = vec![1.0f32, 0.0];
        let mut support = vec![0i64, 1];
        let mut bias = vec![0.5f32, -0.1];
        let mut counts = vec![1i64];
        let logp = [0.1f32.ln(), 0.2f32.ln(), 0.7f32.ln()]; // top token 2 is not in S
        let logq = [(1.0f32 / 3.0).ln(); 3];
        let h = [0.0f32, 3.0];
        let x = Positions {
            h: &h,
            logp: &logp,
            logq: &logq,
            vocab: 3,
        };
        let mut bank = BankArrays {
            keys: &mut keys,
            support: Some(&mut support),
            bias: &mut bias,
            counts: &mut counts,
            dim: 2,
        };
        let mut rates = Vec::new();
        assert_eq!(bank.update(&x, &[(0, 0)], 0.1, true, &mut rates), 1);
        assert_eq!(rates, [0.5]); // max(η, 1/(n + 1)) at n = 1
        assert_eq!(support, [0, 2]); // |-0.1| < |0.5|: entry 1 replaced by token 2
        let r1 = (0.1f32 / 0.8).ln() - 0.5f32.ln();
        let r2 = (0.7f32 / 0.8).ln() - 0.5f32.ln();
        assert!((bias[0] - (0.5 * 0.5 + 0.5 * r1)).abs() < 1e-6);
        assert!((bias[1] - 0.5 * r2).abs() < 1e-6);
        let s = 0.5f32.sqrt();
        assert!((keys[0] - s).abs() < 1e-6 && (keys[1] - s).abs() < 1e-6);
        assert_eq!(counts, [2]);
    }

    #[test]
    fn allocate_takes_the_top_m_of_max_p_q() {
        let mut keys = vec![0.0f32; 4];
        let mut support = vec![-1i64; 4];
        let mut bias = vec![0.0f32; 4];
        let mut counts = vec![0i64; 2];
        let logp = [0.1f32.ln(), 0.6f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let logq = [0.5f32.ln(), 0.2f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
        let h = [3.0f32, 4.0];
        let x = Positions {
            h: &h,
            logp: &logp,
            logq: &logq,
            vocab: 4,
        };
        let mut bank = BankArrays {
            keys: &mut keys,
            support: Some(&mut support),
            bias: &mut bias,
            counts: &mut counts,
            dim: 2,
        };
        bank.allocate(&x, &[(0, 1)]);
        assert_eq!(&support[2..], [1, 0]);
        assert!((keys[2] - 0.6).abs() < 1e-6 && (keys[3] - 0.8).abs() < 1e-6);
        let r = [
            (0.6f32 / 0.7).ln() - (0.2f32 / 0.7).ln(),
            (0.1f32 / 0.7).ln() - (0.5f32 / 0.7).ln(),
        ];
        assert!((bias[2] - r[0]).abs() < 1e-6 && (bias[3] - r[1]).abs() < 1e-6);
        assert_eq!(counts, [0, 1]);
    }
}
