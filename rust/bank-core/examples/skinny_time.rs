//! Times the skinny GEMM on the SmolLM2-135M shapes for M = 1..16 (fastest of interleaved reps)
//! beside a plain read of the same weights: `cargo run --release --example skinny_time [threads]`.
use drift_bank_core::skinny::{linear, Problem};
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(1, |s| s.parse().unwrap());
    for &(n, k, reps) in &[(49152usize, 576usize, 30usize), (1536, 576, 400), (576, 1536, 400), (576, 576, 1000)] {
        let w: Vec<f32> = (0..n * k).map(|i| (i % 97) as f32 * 0.01).collect();
        let ms = [1usize, 2, 3, 4, 8, 16];
        let xs: Vec<Vec<f32>> = ms.iter().map(|&m| (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect()).collect();
        let mut ys: Vec<Vec<f32>> = ms.iter().map(|&m| vec![0f32; m * n]).collect();
        let mut best = vec![f64::MAX; ms.len()];
        let mut read = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            let s: f32 = w.iter().sum();
            std::hint::black_box(s);
            read = read.min(t.elapsed().as_secs_f64());
            for (i, _) in ms.iter().enumerate() {
                let p = Problem::new(&xs[i], &w, None, k).unwrap();
                let t = Instant::now();
                linear(&p, &mut ys[i], threads);
                best[i] = best[i].min(t.elapsed().as_secs_f64());
            }
        }
        let cols: Vec<String> = ms.iter().zip(&best).map(|(m, b)| format!("M{m} {:.3}", b * 1e3)).collect();
        println!("[{n}, {k}] x{threads}: sum-read {:.3} ms | {}", read * 1e3, cols.join(" "));
    }
}
