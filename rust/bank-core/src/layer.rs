//! The pieces of a Llama decoder layer around its linear layers, fused with them: so that a
//! one-token step crosses from Python into the kernel three times a layer instead of a dozen.
//!
//! - [`norm_linears`]: RMSNorm of x, then several weights' outputs side by side in one buffer
//!   (q, k and v), or one weight's outputs added into a residual stream (o_proj).
//! - [`mlp`]: h += down(silu(gate(n)) · up(n)), n = RMSNorm(h), in place.
//!
//! Numerics: RMSNorm is x · (1 / sqrt(mean(x²) + eps)) · w with the mean accumulated in f64
//! over each row in order, SiLU is g / (1 + exp(-g)); both per row, so a row's outputs stay
//! bitwise the same scored alone or among others, as the skinny GEMM's are ([`crate::skinny`]).
//! They may differ from PyTorch's fused kernels by float32 rounding.

use crate::skinny::{linear_into, Chunks, Dest, Problem};

/// out[m] = RMSNorm(x[m]) with weight w [k] (x, out: [m, k]).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let k = w.len();
    assert!(k > 0 && x.len() % k == 0 && out.len() == x.len(), "rms_norm: x, w and out disagree");
    for (row, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
        let ss: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let inv = 1.0 / ((ss / k as f64) as f32 + eps).sqrt();
        for ((o, &v), &g) in o.iter_mut().zip(row).zip(w) {
            *o = g * (v * inv);
        }
    }
}

/// The outputs of `weights` ([n_i, k] each) for x [m, k] (RMSNormed first where `norm` is
/// given: its weight [k] and eps), side by side in y [m, Σ n_i]; `add`: added into y (a
/// residual stream). `next`: the weight read after these (the prefetch stream runs on into it).
#[allow(clippy::too_many_arguments)]
pub fn norm_linears(x: &[f32], k: usize, norm: Option<(&[f32], f32)>, weights: &[&[f32]], y: &mut [f32], add: bool, next: Option<&[f32]>, threads: usize) -> Result<(), String> {
    if k == 0 || x.len() % k != 0 || norm.is_some_and(|(w, _)| w.len() != k) {
        return Err(format!("x ({}) and the norm are not rows of K = {k}", x.len()));
    }
    let m = x.len() / k;
    match norm {
        Some((nw, eps)) => {
            let mut xn = vec![0f32; x.len()];
            rms_norm(x, nw, eps, &mut xn);
            linears_of(&xn, k, weights, y, m, add, next, threads)
        }
        None => linears_of(x, k, weights, y, m, add, next, threads),
    }
}

#[allow(clippy::too_many_arguments)]
fn linears_of(x: &[f32], k: usize, weights: &[&[f32]], y: &mut [f32], m: usize, add: bool, next: Option<&[f32]>, threads: usize) -> Result<(), String> {
    let mut widths = Vec::with_capacity(weights.len());
    for (i, w) in weights.iter().enumerate() {
        if w.len() % k != 0 {
            return Err(format!("weight {i} ({} values) is not whole rows of K = {k}", w.len()));
        }
        widths.push(w.len() / k);
    }
    let ld: usize = widths.iter().sum();
    if y.len() != m * ld {
        return Err(format!("out has {} values, want {m} x {ld}", y.len()));
    }
    let mut col = 0;
    for (i, (w, n)) in weights.iter().zip(widths).enumerate() {
        let p = Problem::new(x, w, None, k)?;
        let p = match weights.get(i + 1).copied().or(next) {
            Some(then) => p.then(then),
            None => p,
        };
        linear_into(&p, y, Dest { ld, col, add }, threads);
        col += n;
    }
    Ok(())
}

/// h [m, d] += down(silu(gate(n)) · up(n)) with n = RMSNorm(h) (norm weight [d], eps); gate and
/// up [f, d], down [d, f]. `next`: the weight read after down (the prefetch stream runs on into it).
#[allow(clippy::too_many_arguments)]
pub fn mlp(h: &mut [f32], norm: (&[f32], f32), gate: &[f32], up: &[f32], down: &[f32], next: Option<&[f32]>, threads: usize) -> Result<(), String> {
    let d = norm.0.len();
    if d == 0 || h.len() % d != 0 || gate.len() % d != 0 || gate.len() != up.len() || down.len() != gate.len() {
        return Err(format!("mlp: h {}, norm {d}, gate {}, up {}, down {} disagree", h.len(), gate.len(), up.len(), down.len()));
    }
    let (m, f) = (h.len() / d, gate.len() / d);
    if m == 0 {
        return Ok(());
    }
    let mut xn = vec![0f32; h.len()];
    rms_norm(h, norm.0, norm.1, &mut xn);
    let mut gu = vec![0f32; m * 2 * f];
    linears_of(&xn, d, &[gate, up], &mut gu, m, false, Some(down), threads)?;
    let mut act = vec![0f32; m * f];
    for (a, row) in act.chunks_exact_mut(f).zip(gu.chunks_exact(2 * f)) {
        let (g, u) = row.split_at(f);
        for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
            *a = g / (1.0 + (-g).exp()) * u;
        }
    }
    let p = Problem::new(&act, down, None, f)?;
    let p = match next {
        Some(then) => p.then(then),
        None => p,
    };
    linear_into(&p, h, Dest { ld: d, col: 0, add: true }, threads);
    Ok(())
}

/// One decoder layer's weights (torch's [out, in] matrices, row-major).
#[derive(Clone, Copy)]
pub struct LayerWeights<'a> {
    pub input_norm: &'a [f32],
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub o: &'a [f32],
    pub post_norm: &'a [f32],
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
}

/// A decoder's attention shape: query heads, KV heads, head dim; RMSNorm's eps (every norm's);
/// the attention's score scale.
#[derive(Clone, Copy, Debug)]
pub struct DecoderShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub scale: f32,
}

/// One sequence's KV cache, every layer in one buffer: [layers, 2 (keys, values), kv_heads,
/// capacity, head_dim]; positions below `start` are committed, the step writes start .. start + s.
pub struct StepCache<'a> {
    pub data: &'a mut [f32],
    pub capacity: usize,
    pub start: usize,
}

/// A whole decoder step over s new positions of one sequence, every layer in one call (so that
/// a few-token step crosses from Python into the kernel once, not a dozen times a layer):
/// per layer RMSNorm + q/k/v, the rotary embedding (x·cos + rotate_half(x)·sin; cos/sin
/// [s, head_dim]), the keys and values written into the cache, attention over the committed
/// prefix and the new positions (`mask` [s, start + s] additive; None: no mask, for s = 1),
/// h += o·Woᵀ, then the MLP; `out` = the final RMSNorm of h (weight `final_norm`).
/// h [s, d] is the residual stream, updated in place; before each layer in `record` (ascending)
/// h is copied into the next [s, d] block of `recorded`.
///
/// Every operation is per position (the skinny GEMM's rows are independent, attention's masked
/// keys add exact zeros), so a position's outputs are bitwise the same whether it is scored
/// alone or among others.
#[allow(clippy::too_many_arguments)]
pub fn decoder_step(
    h: &mut [f32],
    layers: &[LayerWeights<'_>],
    final_norm: &[f32],
    shape: DecoderShape,
    rope: (&[f32], &[f32]),
    cache: StepCache<'_>,
    mask: Option<&[f32]>,
    record: &[usize],
    recorded: &mut [f32],
    out: &mut [f32],
    threads: usize,
) -> Result<(), String> {
    let DecoderShape { heads, kv_heads, head_dim: hd, eps, scale } = shape;
    let d = final_norm.len();
    if d == 0 || h.len() % d != 0 || out.len() != h.len() || hd == 0 || hd % 2 != 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(format!("decoder_step: h {} / out {} over d {d}, {heads} heads over {kv_heads} KV heads of {hd}", h.len(), out.len()));
    }
    let s = h.len() / d;
    let (cos, sin) = rope;
    let StepCache { data: kv, capacity: cap, start } = cache;
    let len = start + s;
    let per_layer = 2 * kv_heads * cap * hd;
    if cos.len() != s * hd || sin.len() != s * hd {
        return Err(format!("decoder_step: cos/sin {} / {}, want {s} x {hd}", cos.len(), sin.len()));
    }
    if kv.len() != layers.len() * per_layer || len > cap {
        return Err(format!("decoder_step: cache {} values for {} layers x 2 x {kv_heads} x {cap} x {hd}, positions to {len}", kv.len(), layers.len()));
    }
    if mask.is_some_and(|m| m.len() != s * len) || (mask.is_none() && s > 1) {
        return Err(format!("decoder_step: a mask of {s} x {len} is needed for {s} positions"));
    }
    if recorded.len() != record.len() * s * d || record.windows(2).any(|w| w[0] >= w[1]) || record.last().is_some_and(|&l| l >= layers.len()) {
        return Err(format!("decoder_step: record {record:?} (ascending, below {}) into {} values", layers.len(), recorded.len()));
    }
    let (nq, nk) = (heads * hd, kv_heads * hd);
    let ld = nq + 2 * nk;
    let mut qkv = vec![0f32; s * ld];
    let mut o = vec![0f32; s * nq];
    let mut rot = vec![0f32; hd];
    let mut next = record.iter().peekable();
    let mut slot = 0;
    for (l, w) in layers.iter().enumerate() {
        if next.next_if_eq(&&l).is_some() {
            recorded[slot * s * d..(slot + 1) * s * d].copy_from_slice(h);
            slot += 1;
        }
        norm_linears(h, d, Some((w.input_norm, eps)), &[w.q, w.k, w.v], &mut qkv, false, Some(w.o), threads)?;
        for (t, row) in qkv.chunks_exact_mut(ld).enumerate() {
            let (c, sn) = (&cos[t * hd..(t + 1) * hd], &sin[t * hd..(t + 1) * hd]);
            for x in row[..nq + nk].chunks_exact_mut(hd) {
                rotate(x, c, sn, &mut rot);
            }
        }
        let layer = &mut kv[l * per_layer..(l + 1) * per_layer];
        for (t, row) in qkv.chunks_exact(ld).enumerate() {
            for kh in 0..kv_heads {
                let at = (kh * cap + start + t) * hd;
                layer[at..at + hd].copy_from_slice(&row[nq + kh * hd..nq + (kh + 1) * hd]);
                let at = per_layer / 2 + at;
                layer[at..at + hd].copy_from_slice(&row[nq + nk + kh * hd..nq + nk + (kh + 1) * hd]);
            }
        }
        let (keys, values) = layer.split_at(per_layer / 2);
        let view = |data, strides| View { data, strides };
        let kv_strides = [per_layer / 2, cap * hd, hd];
        attend(view(&qkv[..], [s * ld, ld, hd]), view(keys, kv_strides), view(values, kv_strides), mask.map(|m| (m, 0)),
               [1, s, heads, kv_heads, len, hd], scale, &mut o, threads)?;
        norm_linears(&o, nq, None, &[w.o], h, true, Some(w.gate), threads)?;
        mlp(h, (w.post_norm, eps), w.gate, w.up, w.down, layers.get(l + 1).map(|n| n.q), threads)?;
    }
    rms_norm(h, final_norm, eps, out);
    Ok(())
}

/// x [head_dim] rotated in place: x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1); the
/// operations of `lean.LeanDecoder._rope` in its order (x·cos, then the product added).
#[inline(always)]
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], tmp: &mut [f32]) {
    let h = x.len() / 2;
    tmp.copy_from_slice(x);
    for i in 0..h {
        x[i] = tmp[i] * cos[i] + -tmp[i + h] * sin[i];
        x[i + h] = tmp[i + h] * cos[i + h] + tmp[i] * sin[i + h];
    }
}

/// e^x for x <= 0 (a softmax's shifted scores), branch-free so that a loop of it vectorises:
/// x = n·ln 2 + t (Cody-Waite in two parts), e^t by its degree-7 Taylor polynomial on |t| <=
/// ln 2 / 2, times 2^n through the exponent bits; within 2 ulp of `f32::exp` on [-87, 0], and
/// exactly 0 below -87 (a masked position).
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    let live = (x >= -87.0) as u32 as f32;
    let x = x.clamp(-87.0, 0.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let t = (x - n * 0.693_359_4) + n * 2.121_944_4e-4;
    let p = 1.0 + t * (1.0 + t * (0.5 + t * (1.0 / 6.0 + t * (1.0 / 24.0 + t * (1.0 / 120.0 + t * (1.0 / 720.0 + t * (1.0 / 5040.0)))))));
    pow2(n) * p * live
}

/// 2^n for an integer n in [-126, 0], from n + 127 in the low mantissa bits of 1.5·2^23 + n +
/// 127 (exact: an integer below 2^23): the bits of `(n as i32 + 127) << 23` without the
/// saturating conversion, which the compiler does not vectorise.
#[inline(always)]
fn pow2(n: f32) -> f32 {
    f32::from_bits((n + 127.0 + 12_582_912.0).to_bits() << 23)
}

/// A strided view of [rows, heads or queries, ..., head_dim] float32 values, head_dim contiguous:
/// element (a, b, c, t) at a·s0 + b·s1 + c·s2 + t.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub strides: [usize; 3],
}

impl View<'_> {
    #[inline(always)]
    fn at(&self, a: usize, b: usize, c: usize, d: usize) -> &[f32] {
        let o = a * self.strides[0] + b * self.strides[1] + c * self.strides[2];
        &self.data[o..o + d]
    }

    /// Positions 0 .. n of (a, b) as one contiguous [n, d] block, where they are one.
    #[inline(always)]
    fn rows(&self, a: usize, b: usize, n: usize, d: usize) -> Option<&[f32]> {
        let o = a * self.strides[0] + b * self.strides[1];
        (self.strides[2] == d && n > 0).then(|| &self.data[o..o + n * d])
    }
}

/// Attention of few queries: out[r, i, h] = softmax_j(q[r, i, h]·k[r, h/g, j]·scale + mask[r, i, j]) · v[r, h/g, j]
/// over j < len, g = hq / hkv (grouped KV heads read in place, never repeated). q: (row, query,
/// head) strides; keys/values: (row, kv head, position) strides; mask: additive [.., s, len]
/// values with a row stride (0: one mask for every row); out [r, s, hq, d] contiguous.
/// Each output is computed by the same operations whatever the other queries or rows, and on
/// whichever thread: on `threads` > 1 the (row, KV head) pairs' queries are cut into pieces that
/// the caller and the skinny GEMM's pool share, where the work is large enough to pay for it.
#[allow(clippy::too_many_arguments)]
pub fn attend(q: View<'_>, keys: View<'_>, values: View<'_>, mask: Option<(&[f32], usize)>, dims: [usize; 6], scale: f32, out: &mut [f32], threads: usize) -> Result<(), String> {
    let [r, s, hq, hkv, len, d] = dims;
    if hkv == 0 || hq % hkv != 0 || out.len() != r * s * hq * d {
        return Err(format!("attend: {hq} query heads over {hkv} KV heads, out {} for {r}x{s}x{hq}x{d}", out.len()));
    }
    let nq = s * (hq / hkv); // the queries that read one KV head of a row
    if r * nq == 0 {
        return Ok(());
    }
    let pieces = if threads > 1 && r * s * hq * len >= SHARE_SCORES { (2 * threads).div_ceil(r * hkv).min(nq) } else { 1 };
    let job = Attend {
        q: Raw::of(q),
        keys: Raw::of(keys),
        values: Raw::of(values),
        mask: mask.map(|(m, stride)| (m.as_ptr(), m.len(), stride)),
        dims,
        scale,
        out: (out.as_mut_ptr(), out.len()),
        per: nq.div_ceil(pieces),
        pieces: nq.div_ceil(nq.div_ceil(pieces)),
    };
    let chunks = r * hkv * job.pieces;
    if chunks == 1 || threads <= 1 {
        for c in 0..chunks {
            // SAFETY: the operands are borrowed for this call; each chunk writes its own outputs
            unsafe { job.chunk(c) };
        }
    } else {
        crate::skinny::share(job, chunks, threads);
    }
    Ok(())
}

/// Query-key pairs (r · s · hq · len) from which `attend` shares its work among threads: below
/// it (one query a row over a 200-position prefix: about 10 µs a layer) the hand-over costs more
/// than the second thread brings.
const SHARE_SCORES: usize = 4096;

/// A slice as a pointer and a length, for a job the pool's threads run (see `skinny::share`).
#[derive(Clone, Copy)]
struct Raw {
    data: (*const f32, usize),
    strides: [usize; 3],
}

impl Raw {
    fn of(v: View<'_>) -> Self {
        Raw { data: (v.data.as_ptr(), v.data.len()), strides: v.strides }
    }

    /// # Safety
    /// The slice this was made of is alive and unchanged.
    unsafe fn view<'a>(self) -> View<'a> {
        View { data: std::slice::from_raw_parts(self.data.0, self.data.1), strides: self.strides }
    }
}

/// One `attend` call: chunk c is queries [per·p, per·(p + 1)) of (row, KV head) c / pieces,
/// p = c mod pieces.
struct Attend {
    q: Raw,
    keys: Raw,
    values: Raw,
    mask: Option<(*const f32, usize, usize)>,
    dims: [usize; 6],
    scale: f32,
    out: (*mut f32, usize),
    per: usize,
    pieces: usize,
}

// SAFETY: the pointers are read (and `out` written, each output by one chunk) only while the
// `attend` call that made them waits, its borrows alive
unsafe impl Send for Attend {}
unsafe impl Sync for Attend {}

impl Chunks for Attend {
    unsafe fn chunk(&self, c: usize) {
        let [_, s, hq, hkv, _, _] = self.dims;
        let (unit, piece) = (c / self.pieces, c % self.pieces);
        let nq = s * (hq / hkv);
        let (q0, q1) = ((piece * self.per).min(nq), ((piece + 1) * self.per).min(nq));
        if q0 == q1 {
            return;
        }
        let mask = self.mask.map(|(m, len, stride)| (std::slice::from_raw_parts(m, len), stride));
        let out = std::slice::from_raw_parts_mut(self.out.0, self.out.1);
        let args = (self.q.view(), self.keys.view(), self.values.view(), mask, self.dims, self.scale);
        let at = (unit / hkv, unit % hkv, q0, q1);
        // the same code with 256-bit vectors where the CPU has them (no fused multiply-add is
        // formed without fast-math: the same bits either way)
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked at run time)
            return unit_avx2(args, at, out);
        }
        unit_body(args, at, out)
    }
}

/// `attend`'s operands: q, keys, values, mask, dims, scale.
type AttendArgs<'a> = (View<'a>, View<'a>, View<'a>, Option<(&'a [f32], usize)>, [usize; 6], f32);

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn unit_avx2(args: AttendArgs<'_>, at: (usize, usize, usize, usize), out: &mut [f32]) {
    unit_body(args, at, out)
}

/// Queries [q0, q1) of KV head kh of a row (query qi: position qi / g, head kh·g + qi mod g),
/// into their outputs (written by this call alone).
#[inline(always)]
fn unit_body((q, keys, values, mask, dims, scale): AttendArgs<'_>, (row, kh, q0, q1): (usize, usize, usize, usize), out: &mut [f32]) {
    let [_, s, hq, hkv, len, d] = dims;
    let g = hq / hkv;
    let nq = q1 - q0;
    let mut p = vec![0f32; nq * len];
    let mut acc = vec![0f32; nq * d];
    let mut qs = vec![0f32; nq * d];                 // those queries, contiguous and scaled
    for (qi, dst) in (q0..q1).zip(qs.chunks_exact_mut(d)) {
        for (x, &v) in dst.iter_mut().zip(q.at(row, qi / g, kh * g + qi % g, d)) {
            *x = v * scale;
        }
    }
    // the scores: eight keys at a time where a head's keys are contiguous rows (the same bits as
    // one `dot` each, `kernels::dots`), in blocks of keys that stay in L1 while every query reads them
    match keys.rows(row, kh, len, d) {
        Some(rows) => {
            let block = (KEY_BLOCK_BYTES / (4 * d)).max(8);
            for j0 in (0..len).step_by(block) {
                let j1 = (j0 + block).min(len);
                for (qv, pr) in qs.chunks_exact(d).zip(p.chunks_exact_mut(len)) {
                    crate::kernels::dots(&rows[j0 * d..j1 * d], qv, &mut pr[j0..j1]);
                }
            }
        }
        None => {
            for j in 0..len {
                let kj = keys.at(row, kh, j, d);
                for (qv, pr) in qs.chunks_exact(d).zip(p.chunks_exact_mut(len)) {
                    pr[j] = crate::kernels::dot(qv, kj);
                }
            }
        }
    }
    for (qi, pr) in (q0..q1).zip(p.chunks_exact_mut(len)) {
        if let Some((m, stride)) = mask {
            let i = qi / g;
            for (x, &b) in pr.iter_mut().zip(&m[row * stride + i * len..row * stride + (i + 1) * len]) {
                *x += b;
            }
        }
        let top = lanes(pr, f32::NEG_INFINITY, f32::max, |l| l.into_iter().fold(f32::NEG_INFINITY, f32::max));
        for x in pr.iter_mut() {
            *x = exp_neg(*x - top);
        }
        let sum = lanes(pr, 0.0, |a, b| a + b, |l| ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7])));
        let inv = 1.0 / sum;
        for x in pr.iter_mut() {
            *x *= inv;
        }
    }
    // o = Σ_j p_j · v_j, in order of j for every query
    match (d, values.rows(row, kh, len, d)) {
        (64, Some(rows)) => weighted_sums::<64>(&mut acc, &p, rows.as_chunks().0),
        (128, Some(rows)) => weighted_sums::<128>(&mut acc, &p, rows.as_chunks().0),
        _ => {
            for (o, pr) in acc.chunks_exact_mut(d).zip(p.chunks_exact(len)) {
                o.fill(0.0);
                for (j, &w) in pr.iter().enumerate() {
                    for (o, &v) in o.iter_mut().zip(values.at(row, kh, j, d)) {
                        *o += w * v;
                    }
                }
            }
        }
    }
    for (qi, a) in (q0..q1).zip(acc.chunks_exact(d)) {
        let (i, h) = (qi / g, kh * g + qi % g);
        out[((row * s + i) * hq + h) * d..((row * s + i) * hq + h + 1) * d].copy_from_slice(a);
    }
}

/// Bytes of keys per block of the scores (L1 is 32 KB or more on the CPUs this runs on).
const KEY_BLOCK_BYTES: usize = 16 << 10;

/// Bytes of values per block of the weighted sums: every query's sum goes through a block while
/// it sits in L1 (one query at a time over all the values read them from L2, 8.1× one query's
/// time for 8 queries instead of the arithmetic's 8×, docs/engine.md).
const VALUE_BLOCK_BYTES: usize = 16 << 10;

/// out[q] = Σ_j w[q][j] · v[j] over j in order for each query q (separate multiply and add, as
/// the generic loop), over blocks of j that stay in L1 while every query adds them, a query's D
/// sums in a local array the compiler keeps in registers within a block: each sum takes the
/// same operations in the same order as one query alone, so the bits are the generic loop's.
#[inline(always)]
fn weighted_sums<const D: usize>(out: &mut [f32], w: &[f32], v: &[[f32; D]]) {
    let len = v.len();
    out.fill(0.0);
    let block = (VALUE_BLOCK_BYTES / (4 * D)).max(8);
    for j0 in (0..len).step_by(block) {
        let j1 = (j0 + block).min(len);
        for (o, wq) in out.as_chunks_mut::<D>().0.iter_mut().zip(w.chunks_exact(len)) {
            let mut acc = *o;
            for (&wj, vj) in wq[j0..j1].iter().zip(&v[j0..j1]) {
                for t in 0..D {
                    acc[t] += wj * vj[t];
                }
            }
            *o = acc;
        }
    }
}

/// x reduced by `op` in 8 lanes (lane j mod 8 takes x[j], in order), the lanes then by `last`:
/// a reduction that vectorises, and whose lanes a trailing run of identity elements leaves as
/// they were (a position's masked keys, whatever their number, change nothing).
#[inline(always)]
fn lanes(x: &[f32], identity: f32, op: impl Fn(f32, f32) -> f32, last: impl Fn([f32; 8]) -> f32) -> f32 {
    let mut acc = [identity; 8];
    let (body, tail) = x.as_chunks::<8>();
    for c in body {
        for l in 0..8 {
            acc[l] = op(acc[l], c[l]);
        }
    }
    for (l, &v) in tail.iter().enumerate() {
        acc[l] = op(acc[l], v);
    }
    last(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn matvec(x: &[f32], w: &[f32], k: usize) -> Vec<f64> {
        let n = w.len() / k;
        x.chunks_exact(k)
            .flat_map(|r| (0..n).map(move |j| (0..k).map(|t| r[t] as f64 * w[j * k + t] as f64).sum::<f64>()))
            .collect()
    }

    fn norm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let k = w.len();
        x.chunks_exact(k)
            .flat_map(|r| {
                let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / k as f64;
                let inv = 1.0 / (ms + eps as f64).sqrt();
                r.iter().zip(w).map(move |(&v, &g)| (v as f64 * inv * g as f64) as f32).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn norm_then_side_by_side_matches_the_reference() {
        let (m, k) = (3, 40);
        let (x, nw, wq, wk) = (data(m * k, 1), data(k, 2), data(24 * k, 3), data(8 * k, 4));
        let mut y = vec![f32::NAN; m * 32];
        norm_linears(&x, k, Some((&nw, 1e-5)), &[&wq, &wk], &mut y, false, None, 1).unwrap();
        let xn = norm_ref(&x, &nw, 1e-5);
        let (q, kk) = (matvec(&xn, &wq, k), matvec(&xn, &wk, k));
        for r in 0..m {
            for j in 0..24 {
                assert!((y[r * 32 + j] as f64 - q[r * 24 + j]).abs() < 1e-4);
            }
            for j in 0..8 {
                assert!((y[r * 32 + 24 + j] as f64 - kk[r * 8 + j]).abs() < 1e-4);
            }
        }
        // add: the residual stream gains exactly the outputs
        let mut h = data(m * 24, 9);
        let before = h.clone();
        norm_linears(&x, k, Some((&nw, 1e-5)), &[&wq], &mut h, true, None, 2).unwrap();
        for i in 0..m * 24 {
            assert!((h[i] as f64 - (before[i] as f64 + q[i])).abs() < 1e-4);
        }
    }

    #[test]
    fn mlp_matches_the_reference_and_rows_are_independent() {
        let (d, f) = (32, 48);
        let (nw, g, u, dn) = (data(d, 5), data(f * d, 6), data(f * d, 7), data(d * f, 8));
        let h0 = data(4 * d, 10);
        let mut h = h0.clone();
        mlp(&mut h, (&nw, 1e-6), &g, &u, &dn, None, 1).unwrap();
        let xn = norm_ref(&h0, &nw, 1e-6);
        let (gg, uu) = (matvec(&xn, &g, d), matvec(&xn, &u, d));
        let act: Vec<f32> = gg.iter().zip(&uu).map(|(&a, &b)| (a / (1.0 + (-a).exp()) * b) as f32).collect();
        let down = matvec(&act, &dn, f);
        for i in 0..4 * d {
            assert!((h[i] as f64 - (h0[i] as f64 + down[i])).abs() < 1e-3, "{i}");
        }
        // the last row alone gives the same bits
        let mut one = h0[3 * d..].to_vec();
        mlp(&mut one, (&nw, 1e-6), &g, &u, &dn, None, 1).unwrap();
        assert!(one.iter().zip(&h[3 * d..]).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn shapes_that_disagree_are_refused() {
        let mut y = vec![0f32; 6];
        assert!(norm_linears(&[0.0; 7], 4, Some((&[1.0; 4], 1e-6)), &[&[0.0; 8]], &mut y, false, None, 1).is_err());
        assert!(norm_linears(&[0.0; 8], 4, None, &[&[0.0; 8]], &mut y, false, None, 1).is_err());
        assert!(mlp(&mut [0.0; 8], (&[1.0; 4], 1e-6), &[0.0; 8], &[0.0; 4], &[0.0; 8], None, 1).is_err());
    }

    #[test]
    fn attend_matches_a_softmax_reference() {
        // head dims 64 and 128 take the register-held weighted sums, 8 the generic loop
        for d in [8, 64, 128] {
            attend_against_a_reference(d);
        }
    }

    #[test]
    fn attend_gives_the_same_bits_on_any_thread_count() {
        // large enough to be shared (r·s·hq·len >= SHARE_SCORES), 8·3 queries a KV head cut unevenly
        let (r, s, hq, hkv, len, d) = (2, 8, 9, 3, 61, 64);
        assert!(r * s * hq * len >= SHARE_SCORES);
        let (q, k, v, m) = (data(r * s * hq * d, 31), data(r * hkv * len * d, 32), data(r * hkv * len * d, 33), data(r * s * len, 34));
        let kv = [hkv * len * d, len * d, d];
        let run = |threads: usize| {
            let mut out = vec![0f32; r * s * hq * d];
            fn view(data: &[f32], strides: [usize; 3]) -> View<'_> {
                View { data, strides }
            }
            attend(view(&q, [s * hq * d, hq * d, d]), view(&k, kv), view(&v, kv), Some((&m, s * len)), [r, s, hq, hkv, len, d], 0.125, &mut out, threads).unwrap();
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        assert!(one.iter().all(|&b| b != 0));
        for threads in [2, 3, 5] {
            assert_eq!(run(threads), one, "{threads} threads");
        }
    }

    fn attend_against_a_reference(d: usize) {
        let (r, s, hq, hkv, len) = (2, 3, 4, 2, 5);
        let (q, k, v, m) = (data(r * s * hq * d, 11), data(r * hkv * len * d, 12), data(r * hkv * len * d, 13), data(r * s * len, 14));
        let view = |data: &'static [f32], st: [usize; 3]| View { data, strides: st };
        let (q, k, v, m): (&'static [f32], &'static [f32], &'static [f32], &'static [f32]) =
            (q.leak(), k.leak(), v.leak(), m.leak());
        let mut out = vec![0f32; r * s * hq * d];
        let kv = [hkv * len * d, len * d, d];
        attend(view(q, [s * hq * d, hq * d, d]), view(k, kv), view(v, kv), Some((m, s * len)), [r, s, hq, hkv, len, d], 0.3, &mut out, 1).unwrap();
        for row in 0..r {
            for i in 0..s {
                for h in 0..hq {
                    let kh = h / (hq / hkv);
                    let sc: Vec<f64> = (0..len)
                        .map(|j| {
                            let dot: f64 = (0..d).map(|t| q[((row * s + i) * hq + h) * d + t] as f64 * k[((row * hkv + kh) * len + j) * d + t] as f64).sum();
                            dot * 0.3 + m[(row * s + i) * len + j] as f64
                        })
                        .collect();
                    let top = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = sc.iter().map(|x| (x - top).exp()).sum();
                    for t in 0..d {
                        let want: f64 = (0..len).map(|j| (sc[j] - top).exp() / z * v[((row * hkv + kh) * len + j) * d + t] as f64).sum();
                        assert!((out[((row * s + i) * hq + h) * d + t] as f64 - want).abs() < 1e-5);
                    }
                }
            }
        }
    }

    #[test]
    fn blocked_weighted_sums_are_the_generic_loops_bits() {
        // 300 positions: several value blocks at both head dims; 5 queries
        for d in [64usize, 128] {
            let (nq, len) = (5, 300);
            let (w, v) = (data(nq * len, 21), data(len * d, 22));
            let mut blocked = vec![0f32; nq * d];
            match d {
                64 => weighted_sums::<64>(&mut blocked, &w, v.as_chunks().0),
                _ => weighted_sums::<128>(&mut blocked, &w, v.as_chunks().0),
            }
            for q in 0..nq {
                let mut o = vec![0f32; d];
                for j in 0..len {
                    for t in 0..d {
                        o[t] += w[q * len + j] * v[j * d + t];
                    }
                }
                assert_eq!(blocked[q * d..(q + 1) * d].iter().map(|x| x.to_bits()).collect::<Vec<_>>(), o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "d {d}, query {q}");
            }
        }
    }

    /// A decoder of `n` random layers (d 16, 4 heads over 2 KV heads of 4, MLP 24) as owned buffers.
    fn decoder(n: usize) -> (Vec<[Vec<f32>; 9]>, Vec<f32>, DecoderShape) {
        let (d, f, hd) = (16, 24, 4);
        let shape = DecoderShape { heads: 4, kv_heads: 2, head_dim: hd, eps: 1e-5, scale: 0.5 };
        let sizes = [d, 4 * hd * d, 2 * hd * d, 2 * hd * d, d * 4 * hd, d, f * d, f * d, d * f];
        let layers = (0..n).map(|l| std::array::from_fn(|i| data(sizes[i], 100 + 10 * l as u64 + i as u64))).collect();
        (layers, data(d, 99), shape)
    }

    fn weights(layers: &[[Vec<f32>; 9]]) -> Vec<LayerWeights<'_>> {
        layers
            .iter()
            .map(|w| LayerWeights { input_norm: &w[0], q: &w[1], k: &w[2], v: &w[3], o: &w[4], post_norm: &w[5], gate: &w[6], up: &w[7], down: &w[8] })
            .collect()
    }

    /// cos/sin [s, hd] for positions start.. (any values: the step takes them as given)
    fn rope_at(start: usize, s: usize, hd: usize) -> (Vec<f32>, Vec<f32>) {
        let angle = |p: usize, i: usize| p as f32 * (1.0 + (i % (hd / 2)) as f32) * 0.1;
        let at = |f: fn(f32) -> f32| (start..start + s).flat_map(|p| (0..hd).map(move |i| f(angle(p, i)))).collect();
        (at(f32::cos), at(f32::sin))
    }

    fn causal(start: usize, s: usize) -> Vec<f32> {
        (0..s).flat_map(|i| (0..start + s).map(move |j| if j <= start + i { 0.0 } else { f32::MIN })).collect()
    }

    /// Runs positions start .. start + s of `x` through the decoder over `cache`; returns out.
    fn run(layers: &[LayerWeights<'_>], fin: &[f32], shape: DecoderShape, cache: &mut [f32], cap: usize, x: &[f32], start: usize, s: usize) -> Vec<f32> {
        let d = fin.len();
        let mut h = x[start * d..(start + s) * d].to_vec();
        let (cos, sin) = rope_at(start, s, shape.head_dim);
        let mask = (s > 1).then(|| causal(start, s));
        let mut out = vec![0f32; s * d];
        let step = StepCache { data: cache, capacity: cap, start };
        decoder_step(&mut h, layers, fin, shape, (&cos, &sin), step, mask.as_deref(), &[], &mut [], &mut out, 1).unwrap();
        out
    }

    #[test]
    fn a_decoder_step_matches_a_float64_llama_forward() {
        let (owned, fin, shape) = decoder(2);
        let layers = weights(&owned);
        let (d, hd, nq, nkv, t) = (16, 4, 4, 2, 5);
        let x = data(t * d, 7);
        let cap = 8;
        let mut cache = vec![0f32; 2 * 2 * nkv * cap * hd];
        let got = run(&layers, &fin, shape, &mut cache, cap, &x, 0, t);
        // the reference: every position at once, in f64
        let (cos, sin) = rope_at(0, t, hd);
        let f64s = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let norm = |h: &[f64], w: &[f32]| -> Vec<f64> {
            h.chunks_exact(d).flat_map(|r| {
                let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-5).sqrt();
                r.iter().zip(w).map(move |(v, &g)| v * inv * g as f64).collect::<Vec<_>>()
            }).collect()
        };
        let lin = |x: &[f64], w: &[f32], k: usize| -> Vec<f64> {
            let n = w.len() / k;
            x.chunks_exact(k).flat_map(|r| (0..n).map(move |j| (0..k).map(|i| r[i] * w[j * k + i] as f64).sum::<f64>())).collect()
        };
        let rot = |v: &mut [f64], p: usize| {
            for hh in v.chunks_exact_mut(hd) {
                let c = hh.to_vec();
                for i in 0..hd {
                    let other = if i < hd / 2 { -c[i + hd / 2] } else { c[i - hd / 2] };
                    hh[i] = c[i] * cos[p * hd + i] as f64 + other * sin[p * hd + i] as f64;
                }
            }
        };
        let mut h = f64s(&x);
        for w in &layers {
            let xn = norm(&h, w.input_norm);
            let (mut q, mut k, v) = (lin(&xn, w.q, d), lin(&xn, w.k, d), lin(&xn, w.v, d));
            for p in 0..t {
                rot(&mut q[p * nq * hd..(p + 1) * nq * hd], p);
                rot(&mut k[p * nkv * hd..(p + 1) * nkv * hd], p);
            }
            let mut o = vec![0f64; t * nq * hd];
            for p in 0..t {
                for head in 0..nq {
                    let kh = head / (nq / nkv);
                    let qv = &q[(p * nq + head) * hd..][..hd];
                    let sc: Vec<f64> = (0..=p).map(|j| (0..hd).map(|i| qv[i] * k[(j * nkv + kh) * hd + i]).sum::<f64>() * 0.5).collect();
                    let top = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = sc.iter().map(|a| (a - top).exp()).sum();
                    for i in 0..hd {
                        o[(p * nq + head) * hd + i] = (0..=p).map(|j| (sc[j] - top).exp() / z * v[(j * nkv + kh) * hd + i]).sum();
                    }
                }
            }
            for (a, b) in h.iter_mut().zip(lin(&o, w.o, nq * hd)) {
                *a += b;
            }
            let xn = norm(&h, w.post_norm);
            let (g, u) = (lin(&xn, w.gate, d), lin(&xn, w.up, d));
            let act: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| a / (1.0 + (-a).exp()) * b).collect();
            for (a, b) in h.iter_mut().zip(lin(&act, w.down, 24)) {
                *a += b;
            }
        }
        let want = norm(&h, &fin);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()), "{i}: {a} vs {b}");
        }
    }

    #[test]
    fn a_position_scored_alone_or_among_others_gives_the_same_bits() {
        let (owned, fin, shape) = decoder(3);
        let layers = weights(&owned);
        let (d, cap) = (16, 16);
        let x = data(10 * d, 8);
        let size = 3 * 2 * 2 * cap * 4;
        // a prefix of 4, then positions 4..9 at once, against one at a time
        let mut together = vec![0f32; size];
        run(&layers, &fin, shape, &mut together, cap, &x, 0, 4);
        let mut alone = together.clone();
        let all = run(&layers, &fin, shape, &mut together, cap, &x, 4, 6);
        for p in 4..10 {
            let one = run(&layers, &fin, shape, &mut alone, cap, &x, p, 1);
            assert!(one.iter().zip(&all[(p - 4) * d..(p - 3) * d]).all(|(a, b)| a.to_bits() == b.to_bits()), "position {p}");
        }
        assert!(alone.iter().zip(&together).all(|(a, b)| a.to_bits() == b.to_bits()), "the caches differ");
        // recorded layer inputs: layer 0's input is the embedding itself
        let mut h = x[..2 * d].to_vec();
        let (cos, sin) = rope_at(0, 2, 4);
        let (mut rec, mut out) = (vec![0f32; 2 * 2 * d], vec![0f32; 2 * d]);
        let mut cache = vec![0f32; size];
        let step = StepCache { data: &mut cache, capacity: cap, start: 0 };
        decoder_step(&mut h, &layers, &fin, shape, (&cos, &sin), step, Some(&causal(0, 2)), &[0, 2], &mut rec, &mut out, 1).unwrap();
        assert_eq!(&rec[..2 * d], &x[..2 * d]);
        assert!(rec[2 * d..] != h[..] && rec[2 * d..] != x[..2 * d]);
        // a step past the cache's capacity, or several positions without a mask, is refused
        let step = StepCache { data: &mut cache, capacity: cap, start: cap };
        assert!(decoder_step(&mut h, &layers, &fin, shape, (&cos, &sin), step, Some(&causal(cap, 2)), &[], &mut [], &mut out, 1).is_err());
        let step = StepCache { data: &mut cache, capacity: cap, start: 0 };
        assert!(decoder_step(&mut h, &layers, &fin, shape, (&cos, &sin), step, None, &[], &mut [], &mut out, 1).is_err());
    }

    #[test]
    fn exp_neg_is_within_two_ulp_and_zero_when_masked() {
        for i in 0..86_990 {
            let x = -(i as f32) * 1e-3;
            let (a, b) = (exp_neg(x), x.exp());
            assert!((a - b).abs() <= 2.0 * f32::EPSILON * b.max(f32::MIN_POSITIVE), "{x}: {a} vs {b}");
        }
        for n in -126..=0 {
            assert_eq!(pow2(n as f32).to_bits(), ((n + 127) as u32) << 23, "2^{n}");
        }
        assert_eq!(exp_neg(-3.0e38), 0.0);
        assert_eq!(exp_neg(0.0), 1.0);
    }
}
