//! A realistic long session for `condense demo`: a pi v3 session file with a dozen user prompts and
//! hundreds of tool calls, some with huge outputs, some failing, some repeating an earlier output. It is
//! generated from a fixed seed, so every machine gets the same bytes.

use std::fmt::Write as _;

/// Size knobs of the generated session.
#[derive(Debug, Clone, Copy)]
pub struct DemoConfig {
    /// User prompts (user-turn-groups).
    pub prompts: usize,
    /// Tool calls per prompt.
    pub calls_per_prompt: usize,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig { prompts: 12, calls_per_prompt: 30 }
    }
}

/// A small deterministic generator (xorshift64) for generated sessions and tests: the same seed gives the
/// same sequence on every machine. The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn json(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn file_body(rng: &mut Rng, path: &str, lines: usize) -> String {
    let mut s = String::new();
    for i in 1..=lines {
        let _ = match rng.below(6) {
            0 => writeln!(s, "{i:>6}\t// {path}: handles case {} of the request pipeline", rng.below(900)),
            1 => writeln!(s, "{i:>6}\tpub fn step_{}(ctx: &mut Context) -> Result<(), Error> {{", rng.below(400)),
            2 => writeln!(s, "{i:>6}\t    let value = ctx.lookup(\"key_{}\")?.unwrap_or_default();", rng.below(300)),
            3 => writeln!(s, "{i:>6}\t    if value.len() > {} {{ return Err(Error::TooLong(value.len())); }}", rng.below(5000)),
            4 => writeln!(s, "{i:>6}\t    ctx.metrics.record(\"stage\", {});", rng.below(100)),
            _ => writeln!(s, "{i:>6}\t}}"),
        };
    }
    s
}

/// Generates the session as pi v3 JSONL text.
pub fn generate(cfg: DemoConfig) -> String {
    let mut rng = Rng(0x00C0_FFEE_D15E_A5E5);
    let mut out = String::new();
    let mut n = 0u64;
    let mut parent = String::from("null");
    let mut ts = 1_780_000_000_000u64;
    out.push_str("{\"type\":\"session\",\"version\":3,\"id\":\"demo-session\",\"timestamp\":\"2026-06-01T09:00:00.000Z\",\"cwd\":\"/work/app\"}\n");
    let mut line = |out: &mut String, body: String, parent: &mut String| {
        n += 1;
        let id = format!("{n:08x}");
        let _ = writeln!(out, "{{\"type\":\"message\",\"id\":\"{id}\",\"parentId\":{parent},\"timestamp\":\"2026-06-01T09:00:00.000Z\",\"message\":{body}}}");
        *parent = format!("\"{id}\"");
    };
    let files = ["src/server.rs", "src/router.rs", "src/db/pool.rs", "src/auth/session.rs", "tests/api.rs", "Cargo.toml"];
    let mut earlier: Vec<String> = Vec::new();
    let mut call = 0u64;
    for p in 0..cfg.prompts {
        let prompt = format!(
            "Task {}: the request pipeline fails under load in {}. Find the cause, fix it, and make the tests pass.",
            p + 1,
            files[p % files.len()]
        );
        ts += 60_000;
        line(&mut out, format!("{{\"role\":\"user\",\"content\":[{{\"type\":\"text\",\"text\":{}}}],\"timestamp\":{ts}}}", json(&prompt)), &mut parent);
        for c in 0..cfg.calls_per_prompt {
            call += 1;
            let id = format!("toolu_demo_{call:05}");
            ts += 1500;
            let kind = rng.below(10);
            let (name, args, output, is_error) = match kind {
                0..=3 => {
                    let f = files[rng.below(files.len() as u64) as usize];
                    let lines = if rng.below(12) == 0 { 2500 } else { 40 + rng.below(300) as usize };
                    ("read", format!("{{\"path\":{}}}", json(f)), file_body(&mut rng, f, lines), false)
                }
                4..=6 => {
                    let failing = rng.below(5) == 0;
                    let mut o = String::new();
                    for i in 0..(20 + rng.below(200)) {
                        let _ = writeln!(o, "test api::case_{i} ... {}", if failing && i % 17 == 3 { "FAILED" } else { "ok" });
                    }
                    if failing {
                        o.push_str("error: test failed, to rerun pass `--test api`\nProcess exited with code 101\n");
                    }
                    ("bash", "{\"command\":\"cargo test --test api\"}".to_string(), o, failing)
                }
                7 if !earlier.is_empty() => {
                    // The agent reads something it has already seen: an exact repeat of an earlier output.
                    let o = earlier[rng.below(earlier.len() as u64) as usize].clone();
                    ("read", "{\"path\":\"src/server.rs\"}".to_string(), o, false)
                }
                8 => {
                    let mut o = String::new();
                    for i in 0..(5 + rng.below(60)) {
                        let _ = writeln!(o, "{}:{}:    let value = ctx.lookup(\"key_{}\")?;", files[(i % 6) as usize], 10 + i * 7, rng.below(300));
                    }
                    ("grep", "{\"pattern\":\"ctx.lookup\",\"path\":\"src\"}".to_string(), o, false)
                }
                _ => {
                    let bad = rng.below(4) == 0;
                    let old = "x".repeat(if bad { 900 } else { 60 });
                    let args = format!("{{\"path\":\"src/router.rs\",\"oldText\":{},\"newText\":\"fixed\"}}", json(&old));
                    let o = if bad { "Error: oldText not found in src/router.rs".to_string() } else { "Applied 1 edit to src/router.rs".to_string() };
                    ("edit", args, o, bad)
                }
            };
            if output.len() > 1000 && earlier.len() < 20 {
                earlier.push(output.clone());
            }
            let thinking = if c % 4 == 0 { format!("{{\"type\":\"thinking\",\"thinking\":{}}},", json("Look at the failing stage before changing code.")) } else { String::new() };
            line(
                &mut out,
                format!("{{\"role\":\"assistant\",\"content\":[{thinking}{{\"type\":\"toolCall\",\"id\":\"{id}\",\"name\":\"{name}\",\"arguments\":{args}}}],\"model\":\"demo-model\",\"stopReason\":\"toolUse\",\"timestamp\":{ts}}}"),
                &mut parent,
            );
            line(
                &mut out,
                format!("{{\"role\":\"toolResult\",\"toolCallId\":\"{id}\",\"toolName\":\"{name}\",\"content\":[{{\"type\":\"text\",\"text\":{}}}],\"isError\":{is_error},\"timestamp\":{ts}}}", json(&output)),
                &mut parent,
            );
        }
        let reply = format!("Done with task {}: the failing stage was fixed and the tests pass.", p + 1);
        line(
            &mut out,
            format!("{{\"role\":\"assistant\",\"content\":[{{\"type\":\"text\",\"text\":{}}}],\"model\":\"demo-model\",\"stopReason\":\"stop\",\"timestamp\":{ts}}}", json(&reply)),
            &mut parent,
        );
    }
    out
}
