//! Wall time of one decoder step (`layer::decoder_step`) on SmolLM2-135M's shapes (30 layers,
//! synthetic weights, a 200-position prefix) for s = 1, 4, 8 new positions, beside its linear
//! layers alone (the same 210 weights through `skinny::linear`), on one thread or `threads`, the
//! fastest of 7 (a 240 MB read between reps evicts the weights from the caches):
//! `cargo run --release -p drift-bank-core --example decoder_step_time [threads]`.
use drift_bank_core::layer::{decoder_step, DecoderShape, LayerWeights, StepCache};
use drift_bank_core::skinny::{linear, Problem};
use std::time::Instant;
fn main() {
    let threads: usize = std::env::args().nth(1).map_or(1, |s| s.parse().unwrap());
    let (d, f, kvh, hd, heads, nl, cap, start) = (576usize, 1536usize, 3usize, 64usize, 9usize, 30usize, 256usize, 200usize);
    let mk = |n: usize, s: usize| -> Vec<f32> { (0..n).map(|i| (((i * 31 + s) % 97) as f32 - 48.0) * 0.002).collect() };
    let sizes = [d, d * d, kvh * hd * d, kvh * hd * d, d * d, d, f * d, f * d, d * f];
    let ws: Vec<Vec<Vec<f32>>> = (0..nl).map(|l| sizes.iter().enumerate().map(|(j, &n)| if j == 0 || j == 5 { vec![1.0; n] } else { mk(n, l * 9 + j) }).collect()).collect();
    let layers: Vec<LayerWeights> = ws.iter().map(|w| LayerWeights { input_norm: &w[0], q: &w[1], k: &w[2], v: &w[3], o: &w[4], post_norm: &w[5], gate: &w[6], up: &w[7], down: &w[8] }).collect();
    let fnorm = vec![1.0f32; d];
    let mut kv = mk(nl * 2 * kvh * cap * hd, 5);
    let shape = DecoderShape { heads, kv_heads: kvh, head_dim: hd, eps: 1e-5, scale: 0.125 };
    let big = vec![1f32; 60_000_000]; // 240 MB
    for s in [1usize, 4, 8] {
        let cos = vec![1f32; s * hd]; let sin = vec![0f32; s * hd];
        let len = start + s;
        let mask: Vec<f32> = (0..s * len).map(|i| if i % len <= start + i / len { 0.0 } else { -1e30 }).collect();
        let (mut bs, mut bl) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            std::hint::black_box(big.iter().sum::<f32>());
            let mut h = mk(s * d, 3); let mut out = vec![0f32; s * d];
            let t = Instant::now();
            decoder_step(&mut h, &layers, &fnorm, shape, (&cos, &sin), StepCache { data: &mut kv, capacity: cap, start },
                if s > 1 { Some(&mask) } else { None }, &[], &mut [], &mut out, threads).unwrap();
            bs = bs.min(t.elapsed().as_secs_f64());
            std::hint::black_box(big.iter().sum::<f32>());
            let x = mk(s * f, 1); let mut y = vec![0f32; s * f];
            let t = Instant::now();
            for w in &ws { for (j, &(n, k)) in [(d, d), (kvh * hd, d), (kvh * hd, d), (d, d), (f, d), (f, d), (d, f)].iter().enumerate() {
                let p = Problem::new(&x[..s * k], &w[j + 1 + (j >= 4) as usize], None, k).unwrap(); linear(&p, &mut y[..s * n], threads); } }
            bl = bl.min(t.elapsed().as_secs_f64());
        }
        println!("x{threads} s {s}: decoder_step {:.2} ms, its linears alone {:.2} ms", bs * 1e3, bl * 1e3);
    }
}
