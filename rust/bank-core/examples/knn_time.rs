//! Times the CPU retrieval (N=4096, d=96: the small zoo's draft) and a vocabulary-wide
//! log-sum-exp (V=4096): `cargo run --release
//! -p drift-bank-core --example knn_time`.
use drift_bank_core::kernels::{dot, dots, nearest, row_log_sum_exp};
use std::time::Instant;

fn main() {
    let (n, d, k, reps) = (4096usize, 96usize, 4usize, 2000u32);
    let keys: Vec<f32> = (0..n * d)
        .map(|i| ((i * 7919 % 1000) as f32) / 1000.0 - 0.5)
        .collect();
    let h: Vec<f32> = (0..d).map(|i| (i as f32).sin()).collect();
    let (mut idx, mut sim, mut w) = (vec![0i64; k], vec![0f32; k], vec![0f32; k]);
    let mut scratch = Vec::new();
    let mut out = vec![0f32; n];
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            nearest(
                &h,
                &keys,
                None,
                8.0,
                &mut idx,
                &mut sim,
                &mut w,
                &mut scratch,
            );
        }
        let a = t.elapsed() / reps;
        let t = Instant::now();
        for _ in 0..reps {
            dots(&keys, &h, &mut out);
        }
        let b = t.elapsed() / reps;
        let t = Instant::now();
        let mut s = 0f32;
        for _ in 0..reps {
            for r in keys.chunks_exact(d) {
                s += dot(r, &h);
            }
        }
        let c = t.elapsed() / reps;
        let row: Vec<f32> = (0..4096)
            .map(|i| ((i * 37 % 101) as f32) * 0.2 - 9.0)
            .collect();
        let t = Instant::now();
        let mut z = 0f32;
        for _ in 0..reps {
            z += row_log_sum_exp(&row);
        }
        println!("row_log_sum_exp(4096) {:?} ({z})", t.elapsed() / reps);
        println!("nearest {a:?}  blocked dots {b:?}  row-by-row dots {c:?} ({s})");
    }
}
