//! A CPU bank's state and per-call algorithms, with no Python types: strided row views of the
//! iteration's arrays ([`Rows`]), the proposal's recorded retrievals and their batch-major order
//! ([`Recorded`]), and [`CpuBank`]: a draft step (retrieval fused with the bias add, recorded)
//! and an iteration's whole update ([`crate::kernels::observe`]) from those records.
//!
//! The bank's extent (hi, n_valid) is owned by its [`Books`] ([`Books::extent`]); the binding
//! (`rust/src/kernels.rs`) reads tensor layouts, slices the arrays and maps errors.

use std::ops::Range;

use crate::kernels::{self, BankArrays, Observed, Positions, Retrieved, Rule, Support};
use crate::{BankError, Books, Result};

/// The shape of strided float32 rows, in elements: [R, X], or the first `per` rows of each
/// batch of [B, T, X] (row r = (r / per, r % per)). The draft step's h and z are views
/// `x[:, -1]` of [B, T, ·] tensors, and the update reads the first k of T positions; reading
/// them in place spares a copy per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    outer: usize,
    inner: usize,
    per: usize,
    /// rows
    pub n: usize,
    /// elements per row
    pub width: usize,
    /// elements from the first to one past the last one addressed
    pub span: usize,
}

impl Layout {
    /// The rows of an array with this shape and strides (in elements): all rows of a 2-D one;
    /// the first `steps` positions of each batch of a 3-D one when `per` is Some(steps). Rows
    /// must be contiguous, strides non-negative.
    pub fn of(
        shape: &[usize],
        strides: &[isize],
        per: Option<usize>,
    ) -> std::result::Result<Layout, String> {
        if shape.len() != strides.len() {
            return Err(format!(
                "shape {shape:?} and strides {strides:?} differ in length"
            ));
        }
        if strides.iter().any(|&s| s < 0) {
            return Err("negative strides".into());
        }
        let st = |i: usize| strides[i] as usize;
        let (outer, inner, per, n, width) = match (shape.len(), per) {
            (2, _) => (shape[0] * st(0), st(0), shape[0].max(1), shape[0], shape[1]),
            (3, Some(steps)) => {
                if steps > shape[1] {
                    return Err(format!("{} positions, {steps} wanted", shape[1]));
                }
                (st(0), st(1), steps.max(1), shape[0] * steps, shape[2])
            }
            _ => {
                return Err(format!(
                    "must be a {} array, got shape {shape:?}",
                    if per.is_some() { "[B, T, X]" } else { "[Q, X]" }
                ))
            }
        };
        if width > 1 && strides.last() != Some(&1) {
            return Err("rows must be contiguous".into());
        }
        let span = if n == 0 || width == 0 {
            0
        } else {
            let r = n - 1;
            (r / per) * outer + (r % per) * inner + width
        };
        Ok(Layout {
            outer,
            inner,
            per,
            n,
            width,
            span,
        })
    }

    /// C-contiguous [len / width, width].
    pub fn packed(len: usize, width: usize) -> Layout {
        let n = len.checked_div(width).unwrap_or(0);
        Layout {
            outer: n * width,
            inner: width,
            per: n.max(1),
            n,
            width,
            span: n * width,
        }
    }
}

/// Rows of a float32 array, each row contiguous, rows at any stride (see [`Layout`]).
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    data: &'a [f32],
    layout: Layout,
}

impl<'a> Rows<'a> {
    /// `data` starts at the first element and holds at least `layout.span` elements.
    pub fn new(data: &'a [f32], layout: Layout) -> std::result::Result<Self, String> {
        if data.len() < layout.span {
            return Err(format!(
                "{} elements, the layout reads {}",
                data.len(),
                layout.span
            ));
        }
        Ok(Rows { data, layout })
    }

    /// The rows of a C-contiguous [len / width, width] slice.
    pub fn of_slice(data: &'a [f32], width: usize) -> Self {
        Rows {
            data,
            layout: Layout::packed(data.len(), width),
        }
    }

    pub fn n(&self) -> usize {
        self.layout.n
    }

    pub fn width(&self) -> usize {
        self.layout.width
    }

    /// The elements the rows address, first to last.
    pub fn data(&self) -> &'a [f32] {
        &self.data[..self.layout.span]
    }

    pub fn row(&self, r: usize) -> &'a [f32] {
        let l = &self.layout;
        let at = (r / l.per) * l.outer + (r % l.per) * l.inner;
        &self.data[at..at + l.width]
    }

    /// All rows as one [n, width] slice when they lie back to back.
    pub fn packed(&self) -> Option<&'a [f32]> {
        let l = &self.layout;
        let rows_packed = l.n <= 1 || l.inner == l.width;
        let batches_packed = l.n <= l.per || l.outer == l.per * l.width;
        (rows_packed && batches_packed).then(|| &self.data[..l.n * l.width])
    }

    /// [n, width] row-major: the slice itself when packed and `scale` is 1, else the rows copied
    /// into `into` (each divided by `scale`, as torch divides an fp32 tensor by a float).
    pub fn contiguous<'b>(&self, scale: f32, into: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self.packed() {
            Some(s) if scale == 1.0 => s,
            _ => {
                into.clear();
                for r in 0..self.layout.n {
                    into.extend(
                        self.row(r)
                            .iter()
                            .map(|&x| if scale == 1.0 { x } else { x / scale }),
                    );
                }
                into
            }
        }
    }
}

/// Where retrievals go: idx, sim, weight, each [Q, k] row-major.
pub type FoundRows<'a> = (&'a mut [i64], &'a mut [f32], &'a mut [f32]);

/// The k nearest of `keys` (rows of h's width) for each row of h, into rows 0..h.n of `found`
/// (k = its width); `valid` masks free slots.
pub fn retrieve_rows(
    h: &Rows<'_>,
    keys: &[f32],
    valid: Option<&[bool]>,
    inv_two_sigma_sq: f32,
    (idx, sim, w): FoundRows<'_>,
    scratch: &mut Vec<f32>,
) {
    let k = idx.len() / h.n().max(1);
    for row in 0..h.n() {
        let rk = row * k..(row + 1) * k;
        kernels::nearest(
            h.row(row),
            keys,
            valid,
            inv_two_sigma_sq,
            &mut idx[rk.clone()],
            &mut sim[rk.clone()],
            &mut w[rk],
            scratch,
        );
    }
}

/// out [Q, V] = z + λβ row by row, from the neighbours idx / w [Q, k] (row-major). `acc` is
/// the vocabulary-wide scratch row, left zeroed.
#[allow(clippy::too_many_arguments)]
pub fn add_bias_rows(
    z: &Rows<'_>,
    out: &mut [f32],
    idx: &[i64],
    w: &[f32],
    support: Support<'_>,
    bias: &[f32],
    gain: f32,
    acc: &mut Vec<f32>,
) {
    let (v, k) = (z.width(), idx.len() / z.n().max(1));
    if acc.len() != v {
        acc.clear();
        acc.resize(v, 0.0);
    }
    for row in 0..z.n() {
        let (rk, rv) = (row * k..(row + 1) * k, row * v..(row + 1) * v);
        out[rv.clone()].copy_from_slice(z.row(row));
        kernels::bias_add_row(
            z.row(row),
            &mut out[rv],
            &idx[rk.clone()],
            &w[rk],
            support,
            bias,
            gain,
            acc,
        );
    }
}

/// One proposal's retrievals, rows in draft order (step-major for a batch), [rows, k] each.
#[derive(Default, Debug)]
pub struct Recorded {
    pub idx: Vec<i64>,
    pub sim: Vec<f32>,
    pub weight: Vec<f32>,
    pub rows: usize,
}

impl Recorded {
    /// q more rows, empty (-1, -inf, 0); returns the first.
    pub fn push_empty(&mut self, q: usize, k: usize) -> usize {
        let r = self.rows;
        self.rows += q;
        let n = self.rows * k;
        self.idx.truncate(r * k);
        self.sim.truncate(r * k);
        self.weight.truncate(r * k);
        self.idx.resize(n, -1);
        self.sim.resize(n, f32::NEG_INFINITY);
        self.weight.resize(n, 0.0);
        r
    }

    /// The first `b * steps` rows batch-major (row (i, t) at i * steps + t).
    pub fn batch_major(&self, b: usize, steps: usize, k: usize) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
        let order = |t: usize| {
            let (i, s) = (t / steps.max(1), t % steps.max(1));
            (s * b + i) * k..(s * b + i + 1) * k
        };
        let mut out = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..b * steps {
            out.0.extend_from_slice(&self.idx[order(t)]);
            out.1.extend_from_slice(&self.sim[order(t)]);
            out.2.extend_from_slice(&self.weight[order(t)]);
        }
        out
    }
}

/// The knobs of a CPU bank's draft step and update.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    /// neighbours retrieved per position (>= 1)
    pub k: usize,
    pub inv_two_sigma_sq: f32,
    pub gain: f32,
    pub rule: Rule,
}

/// A bank's prototype arrays for reading (the draft step): keys [N, dim], valid [N], the bias
/// rows [N, width] and what they cover.
pub struct KeysView<'a> {
    pub keys: &'a [f32],
    pub valid: &'a [bool],
    pub dim: usize,
}

/// A CPU bank's per-token and per-iteration work, one call each: `retrieve` (then `add_bias`)
/// for one draft token, recorded; `observe`, the iteration's whole update with the books from
/// those records (or from given neighbours).
#[derive(Debug)]
pub struct CpuBank {
    pub knobs: Knobs,
    found: Recorded,
    scratch: Vec<f32>,
    acc: Vec<f32>,
    staged: [Vec<f32>; 3],
}

impl CpuBank {
    pub fn new(knobs: Knobs) -> Result<CpuBank> {
        if knobs.k == 0 {
            return Err(BankError::Shape("k must be at least 1".into()));
        }
        Ok(CpuBank {
            knobs,
            found: Recorded::default(),
            scratch: Vec::new(),
            acc: Vec::new(),
            staged: Default::default(),
        })
    }

    /// A new proposal: forget the last one's retrievals.
    pub fn begin(&mut self) {
        self.found.rows = 0;
    }

    pub fn recorded(&self) -> &Recorded {
        &self.found
    }

    /// One draft step's retrieval for the rows of h: the k nearest of slots [0, hi) (the books'
    /// extent), appended to the record. Returns the recorded rows, or None when the bank is
    /// empty (the rows are then recorded empty).
    pub fn retrieve(
        &mut self,
        bank: &KeysView<'_>,
        (hi, n_valid): (usize, usize),
        h: &Rows<'_>,
    ) -> Option<Range<usize>> {
        let (q, k) = (h.n(), self.knobs.k);
        let r0 = self.found.push_empty(q, k);
        if n_valid == 0 {
            return None;
        }
        let keys = &bank.keys[..hi * bank.dim];
        let valid = (n_valid < hi).then(|| &bank.valid[..hi]);
        let rows = r0 * k..(r0 + q) * k;
        let f = &mut self.found;
        retrieve_rows(
            h,
            keys,
            valid,
            self.knobs.inv_two_sigma_sq,
            (
                &mut f.idx[rows.clone()],
                &mut f.sim[rows.clone()],
                &mut f.weight[rows.clone()],
            ),
            &mut self.scratch,
        );
        Some(r0..r0 + q)
    }

    /// out [Q, V] = z + λβ from the recorded retrievals of `rows` (what `retrieve` returned).
    pub fn add_bias(
        &mut self,
        rows: Range<usize>,
        z: &Rows<'_>,
        out: &mut [f32],
        support: Support<'_>,
        bias: &[f32],
    ) {
        let k = self.knobs.k;
        let (f, r) = (&self.found, rows.start * k..rows.end * k);
        add_bias_rows(
            z,
            out,
            &f.idx[r.clone()],
            &f.weight[r],
            support,
            bias,
            self.knobs.gain,
            &mut self.acc,
        );
    }

    /// One iteration's whole update (`kernels::observe`), in place. h [P, d], logp, logq [P, V]
    /// as rows (log-probabilities at `temperature`, divided here; unnormalised will do). The
    /// neighbours are `given`, or the recorded draft steps' for P = b · steps positions
    /// (batch-major: position (i, t) is row i · steps + t).
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        books: &mut Books,
        tenant: &str,
        bank: &mut BankArrays<'_>,
        valid: &mut [bool],
        (h, logp, logq): (&Rows<'_>, &Rows<'_>, &Rows<'_>),
        steps: usize,
        temperature: f32,
        given: Option<Retrieved<'_>>,
    ) -> Result<Observed> {
        let p = h.n();
        let bad = |m: String| Err(BankError::Shape(m));
        if h.width() != bank.dim || logp.n() != p || logq.n() != p || logp.width() != logq.width() {
            return bad(format!(
                "h [{p}, {}], logp [{}, {}], logq [{}, {}] and keys [.., {}] disagree",
                h.width(),
                logp.n(),
                logp.width(),
                logq.n(),
                logq.width(),
                bank.dim
            ));
        }
        if temperature.is_nan() || temperature <= 0.0 {
            return bad("temperature must be positive".into());
        }
        let k = self.knobs.k;
        let reordered;
        let found = match given {
            Some(g) => g,
            None => {
                if p > self.found.rows || (steps != 0 && p % steps != 0) || (steps == 0 && p != 0) {
                    return bad(format!(
                        "{p} positions, {} draft rows recorded",
                        self.found.rows
                    ));
                }
                let b = p.checked_div(steps).unwrap_or(0);
                if b <= 1 {
                    Retrieved {
                        idx: &self.found.idx[..p * k],
                        sim: &self.found.sim[..p * k],
                        weight: &self.found.weight[..p * k],
                        k,
                    }
                } else {
                    reordered = self.found.batch_major(b, steps, k);
                    Retrieved {
                        idx: &reordered.0,
                        sim: &reordered.1,
                        weight: &reordered.2,
                        k,
                    }
                }
            }
        };
        let [sh, sp, sq] = &mut self.staged;
        let x = Positions {
            h: h.contiguous(1.0, sh),
            logp: logp.contiguous(temperature, sp),
            logq: logq.contiguous(temperature, sq),
            vocab: logp.width(),
        };
        kernels::observe(books, tenant, bank, valid, &x, &found, &self.knobs.rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        tau: 0.9,
        eta: 0.5,
        adaptive: false,
        used_weight: 0.99, // only a near-exact neighbour counts as used (keeps the LRU order readable)
    };

    fn knobs(k: usize) -> Knobs {
        Knobs {
            k,
            inv_two_sigma_sq: 2.0,
            gain: 1.0,
            rule: RULE,
        }
    }

    #[test]
    fn strided_rows_read_the_first_steps_of_each_batch_in_place() {
        // [B = 2, T = 3, X = 2] at strides (8, 2, 1): batch 1 starts at element 8 (padding 6..8)
        let data: Vec<f32> = (0..14).map(|i| i as f32).collect();
        let layout = Layout::of(&[2, 3, 2], &[8, 2, 1], Some(2)).unwrap();
        assert_eq!((layout.n, layout.width, layout.span), (4, 2, 8 + 2 + 2));
        let rows = Rows::new(&data, layout).unwrap();
        let got: Vec<&[f32]> = (0..4).map(|r| rows.row(r)).collect();
        assert_eq!(
            got,
            [&[0.0, 1.0][..], &[2.0, 3.0], &[8.0, 9.0], &[10.0, 11.0]]
        );
        assert!(rows.packed().is_none());
        let mut into = Vec::new();
        assert_eq!(
            rows.contiguous(2.0, &mut into),
            [0.0, 0.5, 1.0, 1.5, 4.0, 4.5, 5.0, 5.5]
        );
        // a view x[:, -1] of [B, T, X]: 2-D [B, X] with row stride T·X
        let last = Rows::new(&data[4..], Layout::of(&[2, 2], &[8, 1], None).unwrap()).unwrap();
        assert_eq!(
            (last.row(0), last.row(1)),
            (&[4.0, 5.0][..], &[12.0, 13.0][..])
        );
        // packed rows are the slice itself
        let packed = Rows::of_slice(&data[..6], 2);
        assert_eq!(packed.packed(), Some(&data[..6]));
        assert!(std::ptr::eq(
            packed.contiguous(1.0, &mut into).as_ptr(),
            data.as_ptr()
        ));
    }

    #[test]
    fn layouts_refuse_what_they_cannot_read() {
        assert!(Layout::of(&[2, 3], &[3, 2], None)
            .unwrap_err()
            .contains("contiguous"));
        assert!(Layout::of(&[2, 3], &[-3, 1], None)
            .unwrap_err()
            .contains("negative"));
        assert!(Layout::of(&[2, 3, 4], &[12, 4, 1], Some(4))
            .unwrap_err()
            .contains("3 positions, 4 wanted"));
        assert!(Layout::of(&[2, 3, 4], &[12, 4, 1], None)
            .unwrap_err()
            .contains("[Q, X]"));
        let l = Layout::of(&[3, 4], &[4, 1], None).unwrap();
        assert!(Rows::new(&[0.0; 11], l).is_err() && Rows::new(&[0.0; 12], l).is_ok());
    }

    #[test]
    fn recorded_rows_come_out_batch_major() {
        // 2 draft steps for a batch of 3: rows step-major (t0: i0 i1 i2, t1: i0 i1 i2), k = 1
        let mut r = Recorded::default();
        assert_eq!(r.push_empty(3, 1), 0);
        assert_eq!(r.push_empty(3, 1), 3);
        r.idx = vec![0, 10, 20, 1, 11, 21];
        r.sim = r.idx.iter().map(|&x| x as f32).collect();
        r.weight = r.sim.clone();
        let (i, s, w) = r.batch_major(3, 2, 1);
        assert_eq!(i, [0, 1, 10, 11, 20, 21]);
        assert_eq!(s, [0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
        assert_eq!(w, s);
        assert_eq!(r.batch_major(3, 1, 1).0, [0, 10, 20]); // the first step only
    }

    /// A bank of n slots, d = 2, support m = 2 over V = 3.
    struct Arrays {
        keys: Vec<f32>,
        support: Vec<i64>,
        bias: Vec<f32>,
        counts: Vec<i64>,
        valid: Vec<bool>,
    }

    impl Arrays {
        fn new(n: usize) -> Arrays {
            Arrays {
                keys: vec![0.0; n * 2],
                support: vec![0; n * 2],
                bias: vec![0.0; n * 2],
                counts: vec![0; n],
                valid: vec![false; n],
            }
        }

        fn observe(
            &mut self,
            bank: &mut CpuBank,
            books: &mut Books,
            h: &[f32],
            steps: usize,
        ) -> Observed {
            let logits: Vec<f32> = (0..h.len() / 2).flat_map(|_| [0.0f32, 1.0, 2.0]).collect();
            let mut arrays = BankArrays {
                keys: &mut self.keys,
                support: Some(&mut self.support),
                bias: &mut self.bias,
                counts: &mut self.counts,
                dim: 2,
            };
            let (hr, lr) = (Rows::of_slice(h, 2), Rows::of_slice(&logits, 3));
            bank.observe(
                books,
                "t",
                &mut arrays,
                &mut self.valid,
                (&hr, &lr, &lr),
                steps,
                1.0,
                None,
            )
            .unwrap()
        }

        fn step(&self, bank: &mut CpuBank, books: &Books, h: &[f32]) -> Option<Range<usize>> {
            let (hi, n) = books.extent();
            let view = KeysView {
                keys: &self.keys,
                valid: &self.valid,
                dim: 2,
            };
            bank.retrieve(&view, (hi as usize, n as usize), &Rows::of_slice(h, 2))
        }
    }

    #[test]
    fn allocation_fills_slots_in_order_then_evicts_the_least_recently_used() {
        let mut books = Books::new(3, None).unwrap();
        let mut bank = CpuBank::new(knobs(1)).unwrap();
        let mut a = Arrays::new(3);
        assert_eq!(books.extent(), (0, 0));
        // an empty bank: the step records empty rows; every position allocates, in order
        bank.begin();
        assert!(a.step(&mut bank, &books, &[1.0, 0.0, 0.0, 1.0]).is_none());
        let done = a.observe(&mut bank, &mut books, &[1.0, 0.0, 0.0, 1.0], 2);
        assert_eq!(done.allocations, [(0, 0), (1, 1)]);
        assert_eq!((done.newly_valid.clone(), done.evicted), (vec![0, 1], 0));
        assert_eq!(books.extent(), (2, 2));
        assert_eq!(a.valid, [true, true, false]);
        assert_eq!(&a.keys[..4], [1.0, 0.0, 0.0, 1.0]);
        // slot 1 matched (similarity 1 >= τ): updated, touched; a new direction takes slot 2
        bank.begin();
        let s = 0.5f32.sqrt();
        assert_eq!(a.step(&mut bank, &books, &[0.0, 1.0]), Some(0..1));
        assert_eq!(a.step(&mut bank, &books, &[-1.0, 0.0]), Some(1..2));
        assert_eq!(bank.recorded().idx, [1, 1]); // [-1, 0]: nearest is slot 1 (similarity 0 < τ)
        let done = a.observe(&mut bank, &mut books, &[0.0, 1.0, -1.0, 0.0], 2);
        assert_eq!(
            (done.matched.clone(), done.rates.clone()),
            (vec![(0, 1)], vec![0.5])
        );
        assert_eq!(done.allocations, [(1, 2)]);
        assert_eq!(books.extent(), (3, 3));
        assert_eq!(a.counts, [1, 2, 1]);
        // full: the next allocation evicts the least recently used slot, 0 (1 and 2 were used since)
        bank.begin();
        a.step(&mut bank, &books, &[s, -s]);
        let done = a.observe(&mut bank, &mut books, &[s, -s], 1);
        assert_eq!(
            (
                done.allocations.clone(),
                done.evicted,
                done.newly_valid.clone()
            ),
            (vec![(0, 0)], 1, vec![])
        );
        assert_eq!(books.extent(), (3, 3));
    }

    #[test]
    fn the_extent_limits_the_scan_and_the_mask_covers_released_slots() {
        let mut books = Books::new(4, None).unwrap();
        let mut bank = CpuBank::new(knobs(2)).unwrap();
        let mut a = Arrays::new(4);
        bank.begin();
        a.step(&mut bank, &books, &[1.0, 0.0, 0.0, 1.0]); // empty: recorded empty
        a.observe(&mut bank, &mut books, &[1.0, 0.0, 0.0, 1.0], 2); // slots 0, 1
        assert_eq!(books.extent(), (2, 2));
        books.release(0).unwrap();
        a.valid[0] = false;
        assert_eq!(books.extent(), (2, 1)); // hi stays: [0, hi) is scanned under the mask
        bank.begin();
        a.step(&mut bank, &books, &[1.0, 0.0]);
        assert_eq!(bank.recorded().idx, [1, -1]); // slot 0 masked; slots >= hi never scanned
    }

    #[test]
    fn observe_reads_batch_major_positions_from_step_major_records() {
        // batch of 2, 2 draft steps: recorded rows are (t0: i0 i1), (t1: i0 i1); the update's
        // positions are batch-major (i0: t0 t1), (i1: t0 t1)
        let mut books = Books::new(8, None).unwrap();
        let mut bank = CpuBank::new(knobs(1)).unwrap();
        let mut a = Arrays::new(8);
        bank.begin();
        a.step(&mut bank, &books, &[1.0, 0.0, 0.0, 1.0]);
        a.observe(&mut bank, &mut books, &[1.0, 0.0, 0.0, 1.0], 2); // slot 0 = [1, 0], slot 1 = [0, 1]
        bank.begin();
        a.step(&mut bank, &books, &[1.0, 0.0, 0.0, 1.0]); // t0: i0 -> 0, i1 -> 1
        a.step(&mut bank, &books, &[0.0, 1.0, 1.0, 0.0]); // t1: i0 -> 1, i1 -> 0
        assert_eq!(bank.recorded().idx, [0, 1, 1, 0]);
        // batch-major h: i0 = ([1, 0], [0, 1]), i1 = ([0, 1], [1, 0]): each matches its record
        let done = a.observe(
            &mut bank,
            &mut books,
            &[1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0],
            2,
        );
        assert_eq!(done.matched, [(0, 0), (1, 1), (2, 1), (3, 0)]);
        assert!(done.allocations.is_empty());
        assert_eq!(&a.counts[..2], [3, 3]);
    }
}
