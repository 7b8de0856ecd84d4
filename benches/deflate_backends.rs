//! The permessage-deflate backend, chosen by measurement (docs/architecture.md,
//! "permessage-deflate"): flate2 on zlib-rs (what tether uses), miniz_oxide, and libdeflate's
//! one-shot API, each compressing and inflating one message on its own the way RFC 7692 with
//! no context takeover does (raw DEFLATE, sync flush, `00 00 ff ff` stripped and put back),
//! for a ~1 KiB JSON order-book snapshot and a ~100-byte trade tick.
//!
//! `cargo bench --bench deflate_backends [LEVEL]` (LEVEL 1-9, default 6). Prints, per backend
//! and message, the compressed size and the median over 7 rounds of ns per compress and per
//! inflate. One thread; the box's other load shows in the figures, so compare within a run.

use std::hint::black_box;
use std::time::Instant;

const TAIL: [u8; 4] = [0, 0, 0xff, 0xff];

/// A ~1 KiB order book: 20 levels a side of price and size strings.
fn book() -> Vec<u8> {
    let level = |i: u64, side: i64| {
        let px = 9_732_150 + side * (50 + i as i64 * 50 + (i % 7) as i64);
        format!("[\"{}.{:02}\",\"{}.{:05}\"]", px / 100, px % 100, (i * 7) % 9, (i * 104_729) % 100_000)
    };
    let bids: Vec<String> = (0..20).map(|i| level(i, -1)).collect();
    let asks: Vec<String> = (0..20).map(|i| level(i, 1)).collect();
    format!(
        "{{\"type\":\"snapshot\",\"symbol\":\"BTC-USD\",\"seq\":1,\"ts\":1765000000037,\"bids\":[{}],\"asks\":[{}]}}",
        bids.join(","),
        asks.join(",")
    )
    .into_bytes()
}

/// A ~100-byte trade tick.
fn tick() -> Vec<u8> {
    br#"{"type":"trade","symbol":"BTC-USD","px":"97321.50","sz":"0.01250","side":"buy","ts":1765000000123}"#.to_vec()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `compress` and `inflate` (after checking they round-trip) and prints one line.
fn run(
    name: &str,
    data: &[u8],
    iters: u32,
    mut compress: impl FnMut(&[u8]) -> Vec<u8>,
    mut inflate: impl FnMut(&[u8]) -> Vec<u8>,
) {
    let z = compress(data);
    assert_eq!(inflate(&z), data, "{name} round trip");
    let (mut c, mut d) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..iters {
            black_box(compress(black_box(data)));
        }
        c.push(t.elapsed().as_nanos() as f64 / f64::from(iters));
        let t = Instant::now();
        for _ in 0..iters {
            black_box(inflate(black_box(&z)));
        }
        d.push(t.elapsed().as_nanos() as f64 / f64::from(iters));
    }
    println!(
        "{name:22} {:5} B -> {:5} B   compress {:7.0} ns   inflate {:7.0} ns",
        data.len(),
        z.len(),
        median(c),
        median(d)
    );
}

fn main() {
    let level: u32 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(6).clamp(1, 9);
    for (label, data, iters) in [("1 KiB snapshot", book(), 20_000u32), ("tick", tick(), 50_000)] {
        println!("-- {label}, level {level}");
        let mut zc = flate2::Compress::new(flate2::Compression::new(level), false);
        let mut zd = flate2::Decompress::new(false);
        run(
            "flate2 + zlib-rs",
            &data,
            iters,
            |m| {
                zc.reset();
                let mut o = Vec::with_capacity(m.len() + 64);
                zc.compress_vec(m, &mut o, flate2::FlushCompress::Sync).unwrap();
                o.truncate(o.len() - 4);
                o
            },
            |z| {
                zd.reset(false);
                let mut i = z.to_vec();
                i.extend_from_slice(&TAIL);
                let mut o = Vec::with_capacity(4096);
                zd.decompress_vec(&i, &mut o, flate2::FlushDecompress::Sync).unwrap();
                o
            },
        );
        use miniz_oxide::deflate::core::{compress, create_comp_flags_from_zip_params, CompressorOxide, TDEFLFlush};
        use miniz_oxide::inflate::stream::{inflate, InflateState};
        let mut mc = CompressorOxide::new(create_comp_flags_from_zip_params(level as i32, 0, 0));
        let mut md = InflateState::new(miniz_oxide::DataFormat::Raw);
        run(
            "miniz_oxide",
            &data,
            iters,
            |m| {
                mc.reset();
                let mut o = vec![0u8; m.len() + 64];
                let (_, _, n) = compress(&mut mc, m, &mut o, TDEFLFlush::Sync);
                o.truncate(n - 4);
                o
            },
            |z| {
                md.reset(miniz_oxide::DataFormat::Raw);
                let mut i = z.to_vec();
                i.extend_from_slice(&TAIL);
                let mut o = vec![0u8; 4096];
                let r = inflate(&mut md, &i, &mut o, miniz_oxide::MZFlush::Sync);
                o.truncate(r.bytes_written);
                o
            },
        );
        // One-shot: a final block, no sync flush (RFC 7692 §7.2.3.4 allows BFINAL); inflating
        // needs the whole message and an output buffer of the bound up front.
        let mut lc = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(level as i32).unwrap());
        let mut ld = libdeflater::Decompressor::new();
        run(
            "libdeflate one-shot",
            &data,
            iters,
            |m| {
                let mut o = vec![0u8; lc.deflate_compress_bound(m.len())];
                let n = lc.deflate_compress(m, &mut o).unwrap();
                o.truncate(n);
                o
            },
            |z| {
                let mut o = vec![0u8; 4096];
                let n = ld.deflate_decompress(z, &mut o).unwrap();
                o.truncate(n);
                o
            },
        );
    }
}
