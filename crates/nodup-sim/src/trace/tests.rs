//! Round trips and corruption of the trace format.

use super::*;
use rand::{Rng, SeedableRng};

fn sample(n: usize, seed: u64) -> Vec<Event> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pool: Vec<Line> = (0..12)
        .map(|_| {
            let mut l = ZERO_LINE;
            rng.fill(&mut l[..]);
            l
        })
        .collect();
    (0..n)
        .map(|_| {
            let line = match rng.gen_range(0..4) {
                0 => rng.gen(),
                _ => rng.gen_range(0..1000u64),
            };
            match rng.gen_range(0..5) {
                0 => Event::read(line),
                1 => Event::write(line, ZERO_LINE),
                2 => {
                    let mut l = ZERO_LINE;
                    rng.fill(&mut l[..]);
                    Event::write(line, l)
                }
                _ => Event::write(line, pool[rng.gen_range(0..pool.len())]),
            }
        })
        .collect()
}

fn encode(events: &[Event], window: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = TraceWriter::new(&mut out, FLAG_SYNTHETIC, window).unwrap();
    for e in events {
        w.write(e).unwrap();
    }
    let counts = w.finish().unwrap();
    assert_eq!(counts.events, events.len() as u64);
    out
}

fn decode(bytes: &[u8]) -> crate::error::Result<Vec<Event>> {
    TraceReader::new(bytes, "t")?.read_all()
}

#[test]
fn round_trip_with_small_and_default_windows() {
    let ev = sample(40_000, 1);
    for window in [1, 4, DEFAULT_WINDOW] {
        let bytes = encode(&ev, window);
        assert_eq!(decode(&bytes).unwrap(), ev, "window {window}");
    }
    // Repeats make duplicates cheap: 12 hot contents cost a few bytes after the first literal.
    let hot: Vec<Event> = (0..10_000u64)
        .map(|i| Event::write(i, [(i % 12) as u8 + 1; 64]))
        .collect();
    assert!(encode(&hot, DEFAULT_WINDOW).len() < 10_000 * 5);
    let small = encode(&ev, 4);
    let r = TraceReader::new(&small[..], "t").unwrap();
    assert_eq!(r.flags(), FLAG_SYNTHETIC);
    let empty = encode(&[], 4);
    assert_eq!(decode(&empty).unwrap(), vec![]);
}

#[test]
fn every_truncation_and_bit_flip_is_an_error() {
    let ev = sample(300, 2);
    let bytes = encode(&ev, 8);
    for cut in 0..bytes.len() {
        let e = decode(&bytes[..cut]).expect_err("truncated trace accepted");
        let m = e.to_string();
        assert!(
            m.contains("truncated") || m.contains("not a nodup sim trace"),
            "cut {cut}: {m}"
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..2000 {
        let mut b = bytes.clone();
        let i = rng.gen_range(0..b.len());
        b[i] ^= 1 << rng.gen_range(0..8);
        assert!(decode(&b).is_err(), "flip at {i} accepted");
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(decode(&extra)
        .unwrap_err()
        .to_string()
        .contains("after the end"));
    let mut v2 = bytes.clone();
    v2[8] = 2;
    let crc = crc32c::crc32c(&v2[..28]);
    v2[28..32].copy_from_slice(&crc.to_le_bytes());
    assert!(decode(&v2).unwrap_err().to_string().contains("version 2"));
    assert!(decode(b"hello")
        .unwrap_err()
        .to_string()
        .contains("not a nodup sim trace"));
}

#[test]
fn reader_streams_in_batches() {
    let ev = sample(5000, 4);
    let bytes = encode(&ev, 16);
    let mut r = TraceReader::new(&bytes[..], "t").unwrap();
    let mut got = Vec::new();
    loop {
        let n = r.next_batch(&mut got, 333).unwrap();
        if n == 0 {
            break;
        }
        assert!(n <= 333);
    }
    assert_eq!(got, ev);
    assert_eq!(r.counts().events, 5000);
    assert_eq!(r.bytes_read(), bytes.len() as u64);
}
