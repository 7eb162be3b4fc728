//! Times the skinny GEMM over the linear layers of SmolLM2-135M (30 layers of q, k, v, o, gate,
//! up, down, then the 49,152-row head: 538 MB, read from memory as in a forward) for M rows
//! (1..16 by default, at most 17), beside one read of the same weights (wall time, fastest of 7
//! interleaved reps: run it on a quiet machine):
//! `cargo run --release -p drift-bank-core --example skinny_time [threads] [M,M,...]`.
use drift_bank_core::skinny::{linear, Problem};
use std::time::Instant;

fn read(w: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for c in w.chunks_exact(16) {
        for l in 0..16 {
            acc[l] += c[l];
        }
    }
    acc.iter().sum()
}

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(1, |s| s.parse().unwrap());
    let (d, f, kv) = (576usize, 1536usize, 192usize);
    let mut shapes = Vec::new();
    for _ in 0..30 {
        shapes.extend([(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)]);
    }
    shapes.push((49152, d));
    let ws: Vec<Vec<f32>> = shapes.iter().map(|&(n, k)| (0..n * k).map(|i| (i % 97) as f32 * 0.01).collect()).collect();
    let bytes: usize = ws.iter().map(|w| w.len() * 4).sum();
    let ms: Vec<usize> = std::env::args().nth(2).map(|v| v.split(',').map(|t| t.parse().unwrap()).collect()).unwrap_or(vec![1, 2, 3, 4, 6, 8, 12, 16]);
    assert!(ms.iter().all(|&m| (1..=17).contains(&m)), "M must be 1..17");
    let x: Vec<f32> = (0..17 * f).map(|i| (i % 13) as f32 * 0.1).collect();
    let mut y = vec![0f32; 17 * 49152];
    let mut best = vec![f64::MAX; ms.len()];
    let mut best_read = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        let s: f32 = ws.iter().map(|w| read(w)).sum();
        std::hint::black_box(s);
        best_read = best_read.min(t.elapsed().as_secs_f64());
        for (i, &m) in ms.iter().enumerate() {
            let wall = Instant::now();
            for (w, &(n, k)) in ws.iter().zip(&shapes) {
                let p = Problem::new(&x[..m * k], w, None, k).unwrap();
                linear(&p, &mut y[..m * n], threads);
            }
            let spent = wall.elapsed().as_secs_f64();
            best[i] = best[i].min(spent);
        }
    }
    let cols: Vec<String> = ms.iter().zip(&best).map(|(m, b)| format!("M{m} {:.1}", b * 1e3)).collect();
    println!("{:.0} MB x{threads}: read {:.1} ms | {}", bytes as f64 / 1e6, best_read * 1e3, cols.join(" "));
}
