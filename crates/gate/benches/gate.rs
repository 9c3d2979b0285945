//! Gate throughput against a plain copy of the same bytes, measured in the same run.
//!
//! `cargo bench -p cordon-gate` (release build). Prints a markdown table: MB/s of the gate and
//! of the copy, and their ratio. Set `GATE_BENCH_SIZES=1` to skip the 100 MB runs.
//! The secret scans are measured on the same workloads: two live tokens (absent from the
//! text, the common case), `block_secrets`, and both.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cordon_gate::{Gate, GatePolicy, LiveTokens, OutputKind, StripPolicy, ToolMeta};
use serde_json::json;

const MB: usize = 1024 * 1024;
const META: ToolMeta<'static> = ToolMeta {
    tool: "bench",
    profile: "P1",
};

/// A small deterministic generator (xorshift), so every run gates the same bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &[
    "the",
    "sandbox",
    "limits",
    "what",
    "a",
    "compromised",
    "tool",
    "can",
    "do",
    "not",
    "says",
    "output",
    "gate",
    "returns",
    "text",
    "to",
    "model",
    "page",
    "report",
    "invoice",
    "total",
    "2026",
    "section",
];
const WORDS_CJK: &[&str] = &[
    "日本語の",
    "テキスト",
    "報告書",
    "ページ",
    "合計",
    "出力",
    "道具",
    "砂場",
    "模型",
];
const WORDS_INTL: &[&str] = &[
    "日本語の",
    "テキスト",
    "données",
    "größe",
    "отчёт",
    "страница",
    "报告",
    "页面",
    "🎉",
    "naïve",
];

fn text(size: usize, seed: u64, words: &[&str]) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut s = String::with_capacity(size + 64);
    let mut col = 0;
    while s.len() < size {
        let w = r.pick(words);
        s.push_str(w);
        col += w.len() + 1;
        if col > 72 {
            s.push('\n');
            col = 0;
        } else {
            s.push(' ');
        }
    }
    s.into_bytes()
}

/// Terminal output: a colour change every few words, some OSC titles and hyperlinks,
/// cursor movement, the odd bidi override and CRLF line ends.
fn escapes(size: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut s = String::with_capacity(size + 64);
    while s.len() < size {
        match r.next() % 8 {
            0 => s.push_str("\x1b[1;31m"),
            1 => s.push_str("\x1b[0m"),
            2 => s.push_str("\x1b]8;;http://e.example/x\x1b\\"),
            3 => s.push_str("\x1b]0;title\x07"),
            4 => s.push_str("\x1b[2K\x1b[1G"),
            5 => s.push('\u{202E}'),
            6 => s.push_str("\r\n"),
            _ => s.push_str("\x1b[38;5;208m"),
        }
        for _ in 0..3 {
            s.push_str(r.pick(WORDS));
            s.push(' ');
        }
    }
    s.into_bytes()
}

fn html_md(size: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut s = String::with_capacity(size + 64);
    while s.len() < size {
        match r.next() % 6 {
            0 => s.push_str("<p class=\"x\">"),
            1 => s.push_str("</p>\n"),
            2 => s.push_str("&amp; "),
            3 => s.push_str("[a link](https://e.example/page) "),
            4 => s.push_str("**bold** "),
            _ => s.push_str("_it_ "),
        }
        for _ in 0..4 {
            s.push_str(r.pick(WORDS));
            s.push(' ');
        }
    }
    s.into_bytes()
}

fn json_doc(size: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut items = Vec::new();
    let mut len = 2;
    let mut id = 0u64;
    while len < size {
        let name: Vec<&str> = (0..3).map(|_| r.pick(WORDS)).collect();
        let body: Vec<&str> = (0..12).map(|_| r.pick(WORDS)).collect();
        let item = json!({
            "id": id,
            "name": name.join(" "),
            "tags": [r.pick(WORDS), r.pick(WORDS)],
            "score": (r.next() % 1000) as f64 / 10.0,
            "text": body.join(" "),
        });
        len += item.to_string().len() + 1;
        items.push(item);
        id += 1;
    }
    serde_json::to_vec(&json!({"items": items})).unwrap_or_default()
}

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": {
            "type": "object",
            "required": ["id", "name", "text"],
            "additionalProperties": false,
            "properties": {
                "id": {"type": "integer", "minimum": 0},
                "name": {"type": "string", "maxLength": 200},
                "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z0-9]+$"}},
                "score": {"type": "number"},
                "text": {"type": "string"}
            }
        }}}
    })
}

/// Median of `iters` timings of `f`.
fn median(iters: usize, mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[t.len() / 2]
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / MB as f64 / d.as_secs_f64()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we need.
    let only_small = std::env::var("GATE_BENCH_SIZES").is_ok_and(|v| v == "1");
    let sizes: &[usize] = if only_small { &[MB] } else { &[MB, 100 * MB] };
    let cap = 256 * MB as u64;
    let text_gate = Gate::new(GatePolicy {
        max_bytes: cap,
        ..GatePolicy::default()
    })
    .expect("policy");
    let markup_gate = Gate::new(GatePolicy {
        max_bytes: cap,
        strip: StripPolicy {
            html: true,
            markdown: true,
            ..StripPolicy::default()
        },
        ..GatePolicy::default()
    })
    .expect("policy");
    let json_gate = Gate::new(GatePolicy {
        kind: OutputKind::Json,
        schema: Some(schema()),
        max_bytes: cap,
        ..GatePolicy::default()
    })
    .expect("policy");
    let block_gate = Gate::new(GatePolicy {
        max_bytes: cap,
        block_secrets: true,
        ..GatePolicy::default()
    })
    .expect("policy");
    let block_json_gate = Gate::new(GatePolicy {
        kind: OutputKind::Json,
        schema: Some(schema()),
        max_bytes: cap,
        block_secrets: true,
        ..GatePolicy::default()
    })
    .expect("policy");
    let none = LiveTokens::default();
    // Two tokens of the shapes the test providers mint, not in the text.
    let live = LiveTokens::new([
        (
            "API_TOKEN",
            "tok-6f1d2c3b4a5968778695a4b3c2d1e0f9",
            "cordon-ph-00112233445566778899aabbccddeeff",
        ),
        (
            "OTHER",
            "xk7Qe2Lr9TzWm4Vb8Nc1Hs6Gd3Jf5Ka0",
            "cordon-ph-ffeeddccbbaa99887766554433221100",
        ),
    ]);

    println!("| workload | size | copy MB/s | gate MB/s | gate / copy | copy time / gate time |");
    println!("|---|---|---|---|---|---|");
    for &size in sizes {
        let iters = if size > 10 * MB { 3 } else { 25 };
        let cases: Vec<(&str, Vec<u8>, &Gate, &LiveTokens)> = vec![
            (
                "plain text (ASCII)",
                text(size, 1, WORDS),
                &text_gate,
                &none,
            ),
            (
                "plain text (CJK)",
                text(size, 6, WORDS_CJK),
                &text_gate,
                &none,
            ),
            (
                "plain text (mixed scripts)",
                text(size, 2, WORDS_INTL),
                &text_gate,
                &none,
            ),
            (
                "text full of escape sequences",
                escapes(size, 3),
                &text_gate,
                &none,
            ),
            (
                "HTML + markdown passes on",
                html_md(size, 4),
                &markup_gate,
                &none,
            ),
            ("JSON with a schema", json_doc(size, 5), &json_gate, &none),
            (
                "plain text (ASCII), 2 live tokens",
                text(size, 1, WORDS),
                &text_gate,
                &live,
            ),
            (
                "plain text (ASCII), block_secrets",
                text(size, 1, WORDS),
                &block_gate,
                &none,
            ),
            (
                "plain text (ASCII), 2 live tokens + block_secrets",
                text(size, 1, WORDS),
                &block_gate,
                &live,
            ),
            (
                "plain text (mixed scripts), 2 live tokens + block_secrets",
                text(size, 2, WORDS_INTL),
                &block_gate,
                &live,
            ),
            (
                "JSON with a schema, 2 live tokens + block_secrets",
                json_doc(size, 5),
                &block_json_gate,
                &live,
            ),
        ];
        let only = std::env::var("GATE_BENCH_ONLY").unwrap_or_default();
        for (name, data, gate, tokens) in cases.into_iter().filter(|c| c.0.contains(only.as_str()))
        {
            let copy = median(iters, || {
                let mut v = Vec::with_capacity(data.len());
                v.extend_from_slice(black_box(&data));
                black_box(v);
            });
            // Warm up once (and check the gate accepts the workload).
            if let Err(e) = gate.check_scanned(&META, &data, tokens) {
                eprintln!("{name}: refused: {e}");
                continue;
            }
            let gated = median(iters, || {
                black_box(gate.check_scanned(&META, black_box(&data), tokens).ok());
            });
            let (c, g) = (mbps(data.len(), copy), mbps(data.len(), gated));
            println!(
                "| {name} | {} MB | {c:.0} | {g:.0} | {:.3} | {:.1}x |",
                data.len() / MB,
                g / c,
                gated.as_secs_f64() / copy.as_secs_f64()
            );
        }
    }
}
