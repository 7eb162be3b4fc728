//! Skinny GEMM: y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias), fp32, for few rows (M = tokens × batch
//! rows, 1..16), reading each weight once per call whatever M.
//!
//! On a CPU a forward that scores a handful of tokens is a read of the weights: at M ≤ 16 the
//! arithmetic is a small fraction of the time the memory takes to stream W. General GEMMs
//! switch kernels with M (PyTorch's at 4 rows) and pay for it; this one keeps the cost flat.
//!
//! Layout: W in its original row-major [N, K] layout, never packed (the drafts' weights are
//! updated in place, a packed copy would go stale). The dot-product form: a block of [`ROWS`]
//! weight rows is streamed once and every x row is dotted against it, [`GROUP`] x rows per pass
//! while the block sits in L1 (x itself stays in L1: 16 × 576 × 4 B). Threads split N.
//!
//! Numerics, stated once: each output y[m, n] is one dot product computed by the same sequence
//! of operations whatever M, the block it falls in or the thread that runs it: on AVX-512, one
//! 16-lane accumulator with fused multiply-adds over K in steps of 16 (the tail masked),
//! then `_mm512_reduce_add_ps`; on AVX2+FMA the same with 8 lanes; portable: 8 partial sums,
//! no fused multiply-add. So a row's outputs are bitwise identical scored alone or among any
//! other rows, on any thread count. The bias is added after the dot product. Results differ
//! between instruction sets (and from PyTorch's) by rounding only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Weight rows streamed together.
pub const ROWS: usize = 4;
/// x rows dotted against a weight block per pass (more rows: another pass over the block in L1).
pub const GROUP: usize = 4;

/// Which kernel the machine runs (detected once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    /// x rows per pass in a call of `m` rows: [`GROUP`], except on AVX2 past GROUP rows.
    /// AVX2 has 16 vector registers, all of them the 4 × 4 block's accumulators: in a single
    /// pass that hides under the weights' read, but once a block takes two passes or more a
    /// 4 × 3 block (12 accumulators) runs faster per row (docs/engine.md). (AVX-512's 32 would
    /// hold a 2 × 8 block, one pass for 8 rows: on a Zen 5 core it computes as fast as two
    /// passes of 4 × 4 from L2, but reads 8 rows from memory in 1.6× their time.)
    pub fn group(self, m: usize) -> usize {
        match self {
            Isa::Avx2 if m > GROUP => 3,
            _ => GROUP,
        }
    }
}

/// The best kernel this machine supports.
pub fn detected() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

/// How the AVX-512 kernel asks for the weights ahead: non-temporal, or into L2 (`_MM_HINT_T1`).
/// The same address-order stream either way; the hint is the one thing that differs by core.
/// On a Zen 5 core NTA reads fastest; on a Zen 4 core NTA costs a quarter more time than T1
/// at one row and half as much again at four (docs/engine.md), so NTA only on AMD family 0x1A.
pub fn nta_stream() -> bool {
    static NTA: OnceLock<bool> = OnceLock::new();
    *NTA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let (v, f) = (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1));
            let amd = (v.ebx, v.edx, v.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163); // "AuthenticAMD"
            let family = ((f.eax >> 8) & 0xf) + if (f.eax >> 8) & 0xf == 0xf { (f.eax >> 20) & 0xff } else { 0 };
            amd && family >= 0x1a
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The operands of one call, shapes checked by [`Problem::new`].
#[derive(Clone, Copy)]
pub struct Problem<'a> {
    pub x: &'a [f32],            // [m, k]
    pub w: &'a [f32],            // [n, k]
    pub bias: Option<&'a [f32]>, // [n]
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The weight the caller reads next, if known: the prefetch stream runs on into its first
    /// rows instead of stopping at W's end (see [`Problem::then`]).
    pub next: Option<&'a [f32]>,
}

impl<'a> Problem<'a> {
    pub fn new(x: &'a [f32], w: &'a [f32], bias: Option<&'a [f32]>, k: usize) -> Result<Self, String> {
        if k == 0 {
            return Err("K must be >= 1".into());
        }
        if x.len() % k != 0 || w.len() % k != 0 {
            return Err(format!("x ({}) and w ({}) must be whole rows of K = {k}", x.len(), w.len()));
        }
        let (m, n) = (x.len() / k, w.len() / k);
        if let Some(b) = bias {
            if b.len() != n {
                return Err(format!("bias has {} entries, W {n} rows", b.len()));
            }
        }
        Ok(Self { x, w, bias, m, n, k, next: None })
    }

    /// This call followed by a read of `next` (the next weight of a forward): its last blocks
    /// ask for `next`'s first rows, so that the next call does not start on a cold stream. On a
    /// Zen 5 core it saved about 0.4 ms of SmolLM2-135M's 13.7 ms decoder step at one row (210
    /// weights, each a new stream otherwise).
    pub fn then(mut self, next: &'a [f32]) -> Self {
        self.next = Some(next);
        self
    }

}

/// y [m, n] (row-major) for `p` on `threads` threads (1: the calling thread only; more: the
/// caller and a persistent pool of threads - 1 workers share the weight rows).
pub fn linear(p: &Problem<'_>, y: &mut [f32], threads: usize) {
    linear_with(detected(), p, y, threads);
}

/// [`linear`] with a chosen kernel (tests compare the kernels).
pub fn linear_with(isa: Isa, p: &Problem<'_>, y: &mut [f32], threads: usize) {
    assert_eq!(y.len(), p.m * p.n, "y must be [m, n]");
    into_with(isa, p, Out(y.as_mut_ptr()), Dest { ld: p.n, col: 0, add: false }, threads);
}

/// Where a call's outputs go in a row-major buffer of `ld` columns: y[m, col + n] for output
/// (m, n), written (`add` false) or added to (`add` true: a residual stream). Several weights
/// write side by side into one buffer (q, k and v into one [m, n_q + n_k + n_v]).
#[derive(Clone, Copy, Debug)]
pub struct Dest {
    pub ld: usize,
    pub col: usize,
    pub add: bool,
}

/// `p`'s outputs into y at `dest` (see [`Dest`]); y must hold rows 0..m of `dest.ld` columns.
pub fn linear_into(p: &Problem<'_>, y: &mut [f32], dest: Dest, threads: usize) {
    if p.m > 0 {
        assert!(dest.col + p.n <= dest.ld && y.len() >= (p.m - 1) * dest.ld + dest.col + p.n, "y too small for dest");
    }
    into_with(detected(), p, Out(y.as_mut_ptr()), dest, threads);
}

fn into_with(isa: Isa, p: &Problem<'_>, out: Out, dest: Dest, threads: usize) {
    if p.m == 0 || p.n == 0 {
        return;
    }
    let chunks = chunk_count(p, threads);
    if chunks <= 1 || threads <= 1 {
        // one thread means the caller's alone, whatever the weight's size
        // SAFETY: columns [0, n) of the destination are written by this call alone
        unsafe { rows(isa, p, 0, p.n, out, dest) };
        return;
    }
    let task = Task {
        isa,
        x: Out(p.x.as_ptr() as *mut f32),
        w: Out(p.w.as_ptr() as *mut f32),
        bias: p.bias.map(|b| Out(b.as_ptr() as *mut f32)),
        next: p.next.map(|w| (Out(w.as_ptr() as *mut f32), w.len())),
        m: p.m,
        n: p.n,
        k: p.k,
        out,
        dest,
        step: p.n.div_ceil(chunks).next_multiple_of(ROWS),
    };
    share(task, chunks, threads);
}

/// Work cut into chunks that any thread may take, one at a time, in any order.
pub(crate) trait Chunks: Send + Sync {
    /// Do chunk `c`.
    ///
    /// # Safety
    /// Called once per chunk, while the operands the job points to are alive (see [`share`]).
    unsafe fn chunk(&self, c: usize);
}

/// Run `job`'s `chunks` chunks on the caller and the pool of `threads - 1` workers; return once
/// every chunk is done. The caller works too, so no thread waits for a pool worker that a busy
/// machine has not scheduled yet (a worker that starts late finds nothing left and touches nothing).
pub(crate) fn share<J: Chunks + 'static>(job: J, chunks: usize, threads: usize) {
    let shared = Arc::new(Shared { job, chunks, next: AtomicUsize::new(0), done: AtomicUsize::new(0) });
    pool(threads - 1).post(Arc::clone(&shared) as Arc<dyn Work>);
    // SAFETY: see `Shared::work`
    unsafe { shared.work() };
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < chunks {
        if spins < 1 << 10 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// What the pool's workers are given.
trait Work: Send + Sync {
    /// # Safety
    /// See [`Shared::work`].
    unsafe fn work(&self);
}

/// A job's chunks claimed through `next`, counted in `done` once done.
struct Shared<J> {
    job: J,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl<J: Chunks> Work for Shared<J> {
    /// Claim and do chunks until none is left.
    ///
    /// # Safety
    /// The operands behind the job's pointers are alive and unchanged until `done` reaches
    /// `chunks` (the caller of [`share`] waits for that); a chunk is claimed by one thread only,
    /// and a claim past the last chunk touches nothing.
    unsafe fn work(&self) {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return;
            }
            self.job.chunk(c);
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Chunk c of `step` items out of `len`: [start, end), empty past the last.
fn piece(c: usize, step: usize, len: usize) -> (usize, usize) {
    let start = (c * step).min(len);
    (start, (start + step).min(len))
}

/// One linear call's operands: chunks of `step` weight rows.
struct Task {
    isa: Isa,
    x: Out,
    w: Out,
    bias: Option<Out>,
    next: Option<(Out, usize)>,
    m: usize,
    n: usize,
    k: usize,
    out: Out,
    dest: Dest,
    step: usize,
}

impl Chunks for Task {
    unsafe fn chunk(&self, c: usize) {
        let (start, end) = piece(c, self.step, self.n);
        if start < end {
            let p = Problem {
                x: std::slice::from_raw_parts(self.x.0, self.m * self.k),
                w: std::slice::from_raw_parts(self.w.0, self.n * self.k),
                bias: self.bias.map(|b| std::slice::from_raw_parts(b.0 as *const f32, self.n)),
                m: self.m,
                n: self.n,
                k: self.k,
                next: self.next.map(|(w, len)| std::slice::from_raw_parts(w.0 as *const f32, len)),
            };
            rows(self.isa, &p, start, end, self.out, self.dest);
        }
    }
}

/// The sum of `w`'s elements (in no fixed order) on `threads` threads, shared as [`linear`]
/// shares a weight: a streaming read at the bandwidth the kernels' own threads reach, which the
/// weight-read floor is measured by (`drift_cli.engine.floor`).
pub fn read(w: &[f32], threads: usize) -> f32 {
    const CHUNK: usize = 1 << 16; // floats a piece
    let chunks = if threads <= 1 { 1 } else { w.len().div_ceil(CHUNK).clamp(1, threads * 4) };
    if chunks <= 1 {
        return sum(w);
    }
    let mut parts = vec![0f32; chunks];
    let job = Read { w: Out(w.as_ptr() as *mut f32), len: w.len(), step: w.len().div_ceil(chunks), parts: Out(parts.as_mut_ptr()) };
    share(job, chunks, threads);
    parts.iter().sum()
}

/// [`read`]'s pieces: `step` floats each, piece c's sum into parts[c].
struct Read {
    w: Out,
    len: usize,
    step: usize,
    parts: Out,
}

impl Chunks for Read {
    unsafe fn chunk(&self, c: usize) {
        let (start, end) = piece(c, self.step, self.len);
        *self.parts.0.add(c) = sum(std::slice::from_raw_parts(self.w.0.add(start), end - start));
    }
}

/// A slice's sum in 64 independent lanes (four 16-lane vectors where the machine has them).
fn sum(w: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if detected() == Isa::Avx512 {
        // SAFETY: AVX-512F is present (detected)
        return unsafe { sum_512(w) };
    }
    sum_lanes(w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_512(w: &[f32]) -> f32 {
    sum_lanes(w)
}

#[inline(always)]
fn sum_lanes(w: &[f32]) -> f32 {
    let mut acc = [0f32; 64];
    let (body, tail) = w.as_chunks::<64>();
    for c in body {
        for l in 0..64 {
            acc[l] += c[l];
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// How many pieces N is cut into: one per thread, more on large weights (the threads of a
/// shared machine do not all run at the same speed).
fn chunk_count(p: &Problem<'_>, threads: usize) -> usize {
    let blocks = p.n.div_ceil(ROWS);
    let per = if p.n * p.k >= 1 << 20 { 4 } else { 1 };
    let want = if p.n * p.k < 1 << 14 { 1 } else { threads * per };
    want.min(blocks).max(1)
}

/// The pool of `workers` threads (made once per size, kept for the process).
fn pool(workers: usize) -> &'static Pool {
    static POOLS: OnceLock<Mutex<HashMap<usize, &'static Pool>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    pools.entry(workers.max(1)).or_insert_with(|| Pool::start(workers.max(1)))
}

/// How long an idle worker spins for the next call before it sleeps. A forward's linear calls
/// come tens of microseconds apart, so within a forward (and between the steps of a decode loop)
/// the workers never sleep: a sleeping thread takes a futex wake-up (tens of µs on a loaded
/// machine) to start, which on ~210 calls of ~0.1 ms each cost more than the second core brought.
const SPIN: Duration = Duration::from_micros(500);

/// Workers that spin on a generation counter for the next posted [`Task`], then sleep on a
/// condition variable. Posting is lock-free while they spin: bump the generation, and wake the
/// sleepers only if some sleep.
struct Pool {
    generation: AtomicU64,
    task: Mutex<Option<Arc<dyn Work>>>,
    sleepers: AtomicUsize,
    wake: Condvar,
}

impl Pool {
    fn start(workers: usize) -> &'static Pool {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            generation: AtomicU64::new(0),
            task: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
        }));
        for i in 0..workers {
            std::thread::Builder::new()
                .name(format!("drift-linear-{i}"))
                .spawn(move || pool.serve())
                .expect("a thread for the skinny GEMM's pool");
        }
        pool
    }

    /// Offer `task` to the workers (the caller works on it too and waits for its chunks).
    fn post(&self, task: Arc<dyn Work>) {
        #[cfg(test)]
        tests::POSTED.with(|c| c.set(c.get() + 1));
        *self.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // taking the lock orders this wake-up after a sleeper's last look at the generation
            let _guard = self.task.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
    }

    fn serve(&self) {
        let mut seen = 0u64;
        loop {
            let since = Instant::now();
            let mut polls = 0u32;
            while self.generation.load(Ordering::SeqCst) == seen {
                std::hint::spin_loop();
                polls = polls.wrapping_add(1);
                if polls % 256 == 0 && since.elapsed() > SPIN {
                    self.sleep(seen);
                }
            }
            seen = self.generation.load(Ordering::SeqCst);
            let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(task) = task {
                // SAFETY: see `Shared::work` (a job whose chunks are all claimed is left untouched)
                unsafe { task.work() };
            }
        }
    }

    fn sleep(&self, seen: u64) {
        let mut guard = self.task.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.generation.load(Ordering::SeqCst) == seen {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// y's base pointer, shared by the threads (each writes its own columns).
#[derive(Clone, Copy)]
struct Out(*mut f32);
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// Weight rows [n0, n1) against every x row, into the destination's columns col + n0..col + n1.
///
/// # Safety
/// y (at `out`) must hold m rows of `dest.ld` columns, those columns written by no one else meanwhile.
unsafe fn rows(isa: Isa, p: &Problem<'_>, n0: usize, n1: usize, out: Out, dest: Dest) {
    let mut n = n0;
    while n < n1 {
        let r = ROWS.min(n1 - n);
        let mut m = 0;
        while m < p.m {
            let g = isa.group(p.m).min(p.m - m);
            let mut dots = [[0f32; GROUP]; ROWS];
            block(isa, p, n, r, m, g, &mut dots);
            for (i, row) in dots.iter().enumerate().take(r) {
                let b = p.bias.map_or(0.0, |b| b[n + i]);
                for (j, d) in row.iter().enumerate().take(g) {
                    let v = if p.bias.is_some() { d + b } else { *d };
                    let o = out.0.add((m + j) * dest.ld + dest.col + n + i);
                    *o = if dest.add { *o + v } else { v };
                }
            }
            m += g;
        }
        n += r;
    }
}

/// dots[i][j] = W[n + i] · x[m + j] for i < r, j < g, asking for a block further on as it goes,
/// in every pass over the block: the memory stream runs ahead of the arithmetic instead of
/// alternating with it (a pass that finds its block in L1 still keeps the stream going; with
/// the hint in the first pass only, 8 rows cost 1.2× what they do now on a Zen 3 core). How far
/// ahead: on AVX-512, the next block where a call takes one pass (m ≤ GROUP) and the block two
/// on where it takes more; on AVX2, two on (measured on a Zen 5 and a Zen 3 core, docs/engine.md).
#[inline(always)]
fn block(isa: Isa, p: &Problem<'_>, n: usize, r: usize, m: usize, g: usize, dots: &mut [[f32; GROUP]; ROWS]) {
    let k = p.k;
    let w = &p.w[n * k..(n + r) * k];
    let x = &p.x[m * k..(m + g) * k];
    // the block `ahead` on (W is row-major: the next block starts r·k floats on), past W's end
    // in the next weight where there is one; a prefetch is a hint, never a fault, wherever it points
    let ahead = if isa == Isa::Avx512 && p.m <= GROUP { 1 } else { 2 };
    let off = (n + ahead * r) * k;
    let pf = match p.next {
        Some(next) if off >= p.w.len() => next.as_ptr().wrapping_add(off - p.w.len()),
        _ => p.w.as_ptr().wrapping_add(off),
    };
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::dispatch_512(w, r, x, g, k, pf, nta_stream(), dots) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dispatch_256(w, r, x, g, k, pf, false, dots) },
        _ => {
            let _ = pf;
            portable(w, r, x, g, k, dots)
        }
    }
}

/// The portable kernel: every pair by [`crate::kernels::dot`] (8 partial sums, no FMA).
fn portable(w: &[f32], r: usize, x: &[f32], g: usize, k: usize, dots: &mut [[f32; GROUP]; ROWS]) {
    for i in 0..r {
        for j in 0..g {
            dots[i][j] = crate::kernels::dot(&w[i * k..(i + 1) * k], &x[j * k..(j + 1) * k]);
        }
    }
}

/// The plain reference (f64 accumulation): what the tests compare against.
pub fn naive(p: &Problem<'_>) -> Vec<f32> {
    let mut y = vec![0f32; p.m * p.n];
    for m in 0..p.m {
        for n in 0..p.n {
            let s: f64 = (0..p.k).map(|t| p.x[m * p.k + t] as f64 * p.w[n * p.k + t] as f64).sum();
            y[m * p.n + n] = (s + p.bias.map_or(0.0, |b| b[n] as f64)) as f32;
        }
    }
    y
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{GROUP, ROWS};
    use std::arch::x86_64::*;

    /// The (r, g) block kernel with both sizes as constants (accumulators stay in registers).
    macro_rules! dispatch {
        ($name:ident, $kernel:ident, $feat:literal) => {
            #[target_feature(enable = $feat)]
            pub unsafe fn $name(w: &[f32], r: usize, x: &[f32], g: usize, k: usize, pf: *const f32, nta: bool, d: &mut [[f32; GROUP]; ROWS]) {
                let (w, x) = (w.as_ptr(), x.as_ptr());
                match (r, g) {
                    (4, 4) => $kernel::<4, 4>(w, x, k, pf, nta, d),
                    (4, 3) => $kernel::<4, 3>(w, x, k, pf, nta, d),
                    (4, 2) => $kernel::<4, 2>(w, x, k, pf, nta, d),
                    (4, 1) => $kernel::<4, 1>(w, x, k, pf, nta, d),
                    (3, 4) => $kernel::<3, 4>(w, x, k, pf, nta, d),
                    (3, 3) => $kernel::<3, 3>(w, x, k, pf, nta, d),
                    (3, 2) => $kernel::<3, 2>(w, x, k, pf, nta, d),
                    (3, 1) => $kernel::<3, 1>(w, x, k, pf, nta, d),
                    (2, 4) => $kernel::<2, 4>(w, x, k, pf, nta, d),
                    (2, 3) => $kernel::<2, 3>(w, x, k, pf, nta, d),
                    (2, 2) => $kernel::<2, 2>(w, x, k, pf, nta, d),
                    (2, 1) => $kernel::<2, 1>(w, x, k, pf, nta, d),
                    (1, 4) => $kernel::<1, 4>(w, x, k, pf, nta, d),
                    (1, 3) => $kernel::<1, 3>(w, x, k, pf, nta, d),
                    (1, 2) => $kernel::<1, 2>(w, x, k, pf, nta, d),
                    _ => $kernel::<1, 1>(w, x, k, pf, nta, d),
                }
            }
        };
    }
    dispatch!(dispatch_512, block_512, "avx512f");
    dispatch!(dispatch_256, block_256, "avx2,fma");

    /// R weight rows (at w, stride k) against G x rows (at x, stride k): 16 lanes, one
    /// accumulator per pair, FMA over K, masked tail, fixed reduction; the R·k floats at pf
    /// (a block further on) prefetched as the loop goes, R lines an iteration in address order, one sequential
    /// stream (a hint: never faults), non-temporal where `nta` (see [`super::nta_stream`]), else
    /// into L2. Against asking for the block two on row by row into L2 (R streams side by side,
    /// as the AVX2 kernel does), one Zen 5 core scores 1 row of SmolLM2-135M in 15.6 ms instead
    /// of 16.9 with NTA, 4 in 16.7 instead of 20.9.
    #[target_feature(enable = "avx512f")]
    unsafe fn block_512<const R: usize, const G: usize>(w: *const f32, x: *const f32, k: usize, pf: *const f32, nta: bool, d: &mut [[f32; GROUP]; ROWS]) {
        let mut acc = [[_mm512_setzero_ps(); G]; R];
        let full = k / 16 * 16;
        let mut t = 0;
        while t < full {
            let mut xs = [_mm512_setzero_ps(); G];
            for j in 0..G {
                xs[j] = _mm512_loadu_ps(x.add(j * k + t));
            }
            for i in 0..R {
                let line = pf.wrapping_add(t * R + i * 16) as *const i8;
                if nta {
                    _mm_prefetch::<_MM_HINT_NTA>(line)
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(line)
                }
            }
            for i in 0..R {
                let wv = _mm512_loadu_ps(w.add(i * k + t));
                for j in 0..G {
                    acc[i][j] = _mm512_fmadd_ps(wv, xs[j], acc[i][j]);
                }
            }
            t += 16;
        }
        if t < k {
            let mask: __mmask16 = ((1u32 << (k - t)) - 1) as __mmask16;
            let mut xs = [_mm512_setzero_ps(); G];
            for j in 0..G {
                xs[j] = _mm512_maskz_loadu_ps(mask, x.add(j * k + t));
            }
            for i in 0..R {
                let wv = _mm512_maskz_loadu_ps(mask, w.add(i * k + t));
                for j in 0..G {
                    acc[i][j] = _mm512_fmadd_ps(wv, xs[j], acc[i][j]);
                }
            }
        }
        if R * G <= 4 {
            for i in 0..R {
                for j in 0..G {
                    d[i][j] = _mm512_reduce_add_ps(acc[i][j]);
                }
            }
            return;
        }
        // up to 16 accumulators reduced side by side (zeros fill the rest)
        let mut all = [_mm512_setzero_ps(); 16];
        for i in 0..R {
            for j in 0..G {
                all[i * G + j] = acc[i][j];
            }
        }
        let sums = reduce16(all);
        for (i, row) in d.iter_mut().enumerate().take(R) {
            for (j, dij) in row.iter_mut().enumerate().take(G) {
                let f = i * G + j;
                *dij = sums[4 * (f % 4) + f / 4];
            }
        }
    }

    /// `_mm512_reduce_add_ps` of 16 vectors at once, the same additions of the same operands
    /// (so the same bits), in 45 instructions instead of 128. Its tree adds lane l to lane l + 8,
    /// then to l + 4, l + 2 and l + 1; each level here adds two vectors' halves (quarters, pairs,
    /// neighbours) gathered side by side. Vector a's sum lands in lane 4·(a mod 4) + a / 4.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn reduce16(a: [__m512; 16]) -> [f32; 16] {
        // 256-bit halves: lanes [a.lo, b.lo] + [a.hi, b.hi]
        let h: [__m512; 8] = std::array::from_fn(|k| {
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a[2 * k], a[2 * k + 1]), _mm512_shuffle_f32x4::<0xEE>(a[2 * k], a[2 * k + 1]))
        });
        // 128-bit quarters: each 128-bit lane one vector's four partial sums
        let q: [__m512; 4] = std::array::from_fn(|m| {
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(h[2 * m], h[2 * m + 1]), _mm512_shuffle_f32x4::<0xDD>(h[2 * m], h[2 * m + 1]))
        });
        // pairs (l + 2) within each 128-bit lane, then neighbours (l + 1)
        let p: [__m512; 2] = std::array::from_fn(|n| {
            _mm512_add_ps(_mm512_shuffle_ps::<0x44>(q[2 * n], q[2 * n + 1]), _mm512_shuffle_ps::<0xEE>(q[2 * n], q[2 * n + 1]))
        });
        let f = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(p[0], p[1]), _mm512_shuffle_ps::<0xDD>(p[0], p[1]));
        let mut out = [0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), f);
        out
    }

    /// The AVX2+FMA kernel: as [`block_512`] with 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_256<const R: usize, const G: usize>(w: *const f32, x: *const f32, k: usize, pf: *const f32, _nta: bool, d: &mut [[f32; GROUP]; ROWS]) {
        let mut acc = [[_mm256_setzero_ps(); G]; R];
        let full = k / 8 * 8;
        let mut t = 0;
        while t < full {
            let mut xs = [_mm256_setzero_ps(); G];
            for j in 0..G {
                xs[j] = _mm256_loadu_ps(x.add(j * k + t));
            }
            if t % 16 == 0 {
                for i in 0..R {
                    _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(i * k + t) as *const i8);
                }
            }
            for i in 0..R {
                let wv = _mm256_loadu_ps(w.add(i * k + t));
                for j in 0..G {
                    acc[i][j] = _mm256_fmadd_ps(wv, xs[j], acc[i][j]);
                }
            }
            t += 8;
        }
        if t < k {
            let lanes: [i32; 8] = std::array::from_fn(|l| if l < k - t { -1 } else { 0 });
            let mask = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
            let mut xs = [_mm256_setzero_ps(); G];
            for j in 0..G {
                xs[j] = _mm256_maskload_ps(x.add(j * k + t), mask);
            }
            for i in 0..R {
                let wv = _mm256_maskload_ps(w.add(i * k + t), mask);
                for j in 0..G {
                    acc[i][j] = _mm256_fmadd_ps(wv, xs[j], acc[i][j]);
                }
            }
        }
        for i in 0..R {
            for j in 0..G {
                d[i][j] = hsum_256(acc[i][j]);
            }
        }
    }

    /// The 8 lanes of `v` summed in one fixed order.
    #[inline(always)]
    unsafe fn hsum_256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
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

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    #[test]
    fn matches_the_naive_reference() {
        for isa in isas() {
            for &(m, n, k) in &[(1, 1, 1), (1, 7, 5), (3, 9, 17), (5, 13, 33), (16, 37, 576), (9, 64, 100), (4, 4, 16)] {
                let (x, w, b) = (data(m * k, 1), data(n * k, 2), data(n, 3));
                for bias in [None, Some(&b[..])] {
                    let p = Problem::new(&x, &w, bias, k).unwrap();
                    for threads in [1, 2, 3] {
                        let mut y = vec![f32::NAN; m * n];
                        linear_with(isa, &p, &mut y, threads);
                        let want = naive(&p);
                        for (a, e) in y.iter().zip(&want) {
                            assert!((a - e).abs() <= 1e-5 * (k as f32).sqrt() * 4.0, "{isa:?} m{m} n{n} k{k}: {a} vs {e}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_is_bitwise_the_same_alone_or_among_others() {
        for isa in isas() {
            let (n, k) = (4099, 67);
            let (x, w, b) = (data(16 * k, 5), data(n * k, 6), data(n, 7));
            let p = Problem::new(&x, &w, Some(&b), k).unwrap();
            let mut all = vec![0f32; 16 * n];
            linear_with(isa, &p, &mut all, 2);
            for m in [1, 2, 3, 5, 8, 16] {
                let sub = Problem::new(&x[..m * k], &w, Some(&b), k).unwrap();
                let mut y = vec![0f32; m * n];
                linear_with(isa, &sub, &mut y, 1);
                for row in 0..m {
                    assert_eq!(
                        y[row * n..(row + 1) * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        all[row * n..(row + 1) * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{isa:?}: row {row} differs between M = {m} and M = 16"
                    );
                }
            }
            // the last row alone: M = 1 against its place as row 15 of 16
            let one = Problem::new(&x[15 * k..], &w, Some(&b), k).unwrap();
            let mut y = vec![0f32; n];
            linear_with(isa, &one, &mut y, 3);
            assert!(y.iter().zip(&all[15 * n..]).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    thread_local! {
        /// Tasks this thread posted to a pool.
        pub(super) static POSTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn one_thread_is_the_callers_alone() {
        // a weight large enough to be cut into chunks on several threads
        let (m, n, k) = (2, 4096, 576);
        let (x, w) = (data(m * k, 8), data(n * k, 9));
        let p = Problem::new(&x, &w, None, k).unwrap();
        let mut y = vec![0f32; m * n];
        let before = POSTED.with(|c| c.get());
        linear(&p, &mut y, 1);
        assert_eq!(POSTED.with(|c| c.get()), before, "one thread posted work to the pool");
        linear(&p, &mut y, 2);
        assert_eq!(POSTED.with(|c| c.get()), before + 1);
    }

    #[test]
    fn the_pool_serves_calls_back_to_back_and_after_its_workers_sleep() {
        let (m, n, k) = (3, 2053, 576);
        let (x, w) = (data(m * k, 10), data(n * k, 11));
        let p = Problem::new(&x, &w, None, k).unwrap();
        let mut want = vec![0f32; m * n];
        linear(&p, &mut want, 1);
        for round in 0..3 {
            for _ in 0..200 {
                let mut y = vec![f32::NAN; m * n];
                linear(&p, &mut y, 2);
                assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "round {round}");
            }
            // longer than the workers spin: the next call must wake them (or do the work itself)
            std::thread::sleep(SPIN * 4);
        }
    }

    #[test]
    fn naming_the_next_weight_changes_no_output() {
        for isa in isas() {
            let (n, k) = (523, 61);
            let (x, w, next) = (data(9 * k, 12), data(n * k, 13), data(7 * k, 14));
            for m in [1, 4, 9] {
                let p = Problem::new(&x[..m * k], &w, None, k).unwrap();
                let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
                linear_with(isa, &p, &mut a, 2);
                linear_with(isa, &p.then(&next), &mut b, 2);
                assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} m{m}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_prefetch_hint_changes_no_output() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let k = 45; // two full 16-lane steps and a masked tail
        let (x, w) = (data(4 * k, 15), data(12 * k, 16));
        for (r, g) in [(4, 4), (3, 2), (1, 1)] {
            let (mut a, mut b) = ([[0f32; GROUP]; ROWS], [[0f32; GROUP]; ROWS]);
            let pf = w[4 * k..].as_ptr();
            // SAFETY: the CPU has AVX-512F (checked above); w and x hold r and g rows of k
            unsafe {
                x86::dispatch_512(&w[..r * k], r, &x[..g * k], g, k, pf, true, &mut a);
                x86::dispatch_512(&w[..r * k], r, &x[..g * k], g, k, pf, false, &mut b);
            }
            assert!(a.iter().flatten().zip(b.iter().flatten()).all(|(a, b)| a.to_bits() == b.to_bits()), "({r}, {g})");
            assert!(a[0][0] != 0.0);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_sums_at_once_are_one_at_a_times_bits() {
        use std::arch::x86_64::{_mm512_loadu_ps, _mm512_reduce_add_ps};
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        // values of mixed sign and magnitude, so that another order of the additions rounds otherwise
        let v: Vec<f32> = data(16 * 16 * 50, 17).iter().enumerate().map(|(i, x)| x * [1.0, 1e4, 1e-3, 3e7][i % 4]).collect();
        for c in v.chunks_exact(256) {
            // SAFETY: the CPU has AVX-512F (checked above); each chunk holds 16 vectors of 16
            unsafe {
                let a: [_; 16] = std::array::from_fn(|i| _mm512_loadu_ps(c[16 * i..].as_ptr()));
                let got = x86::reduce16(a);
                for (i, &ai) in a.iter().enumerate() {
                    assert_eq!(got[4 * (i % 4) + i / 4].to_bits(), _mm512_reduce_add_ps(ai).to_bits(), "vector {i}");
                }
            }
        }
    }

    #[test]
    fn read_sums_every_element_on_any_thread_count() {
        for len in [0usize, 1, 63, 64, 65, 1 << 16, (1 << 18) + 77] {
            let w: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
            let want: f64 = w.iter().map(|&v| v as f64).sum();
            for threads in [1, 2, 3] {
                assert_eq!(read(&w, threads) as f64, want, "len {len}, {threads} threads");
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(Problem::new(&[0.0; 6], &[0.0; 8], None, 4).is_err());
        assert!(Problem::new(&[0.0; 8], &[0.0; 8], Some(&[0.0; 3]), 4).is_err());
        assert!(Problem::new(&[0.0; 8], &[0.0; 8], None, 0).is_err());
        let p = Problem::new(&[], &[0.0; 8], None, 4).unwrap();
        linear(&p, &mut [], 2);
    }
}
