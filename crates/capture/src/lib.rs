//! Capture: which tool results form a batch, which are protected, and the occurrence key of each.
//!
//! A batch is the results of one turn (`batchingMode: turn`) or of one agent message
//! (`agent-message`: every turn up to a final text-only reply). A result is protected when its tool is in
//! `protectedTools` or one of its call's string arguments matches a `protectedPaths` glob.
//!
//! # Example
//!
//! ```
//! use condense_capture::Capture;
//! use condense_events::{DecisionEvent, PruneConfig};
//! use condense_stage::testing::{calls, prompt, result, Recorded};
//! use condense_stage::Trigger;
//!
//! let mut log = Recorded::new(PruneConfig::default());
//! let mut capture = Capture;
//! log.message("u1", prompt("what is in src?"), &mut [&mut capture]);
//! log.message("a1", calls(&[("c1", "bash", r#"{"command":"ls src"}"#)]), &mut [&mut capture]);
//! log.message("r1", result("c1", "bash", "lib.rs\nmain.rs", false), &mut [&mut capture]);
//! let decisions = log.run(&mut [&mut capture], Trigger::Request).unwrap();
//! assert!(matches!(&decisions[0], DecisionEvent::OutputCaptured(r) if r.ref_n == 1 && r.tool == "bash" && r.occurrence == "c1@r1"));
//! // A read of a skill file is protected: it is never pruned.
//! assert!(condense_capture::is_protected(&PruneConfig::default(), "read", r#"{"path":"/w/skills/git/SKILL.md"}"#));
//! ```

use condense_events::PruneConfig;

mod stage;
pub use stage::Capture;

pub use condense_stage::{is_final_reply, json_strings, output_text, path_arguments};

/// Whether a call is protected by the configuration: its tool is protected, or one of its path arguments
/// (string values under a key naming a path or file, such as `path`, `file_path`, `filePath`, `files`)
/// matches a protected glob. A shell command that mentions a path is not a path argument.
pub fn is_protected(cfg: &PruneConfig, tool: &str, arguments: &str) -> bool {
    cfg.protected_tools.iter().any(|t| t == tool)
        || path_arguments(arguments).iter().any(|s| cfg.protected_paths.iter().any(|g| glob_match(g, s)))
}

/// Glob matching: `**` matches any run of characters including `/` (and `**/` also matches nothing),
/// `*` any run without `/`, `?` one character other than `/`.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('*') if p.get(1) == Some(&'*') => {
                let rest = if p.get(2) == Some(&'/') { &p[3..] } else { &p[2..] };
                (0..=s.len()).any(|i| go(rest, &s[i..])) || (p.get(2) == Some(&'/') && go(&p[2..], s))
            }
            Some('*') => (0..=s.len()).take_while(|&i| i == 0 || s[i - 1] != '/').any(|i| go(&p[1..], &s[i..])),
            Some('?') => s.first().is_some_and(|&c| c != '/') && go(&p[1..], &s[1..]),
            Some(&c) => s.first() == Some(&c) && go(&p[1..], &s[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    go(&p, &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let g = "**/skills/**/*.md";
        assert!(glob_match(g, "/home/u/.pi/skills/pdf/SKILL.md"));
        assert!(glob_match(g, "skills/a.md"));
        assert!(glob_match(g, "x/skills/a/b/c.md"));
        assert!(!glob_match(g, "x/skills/a/b/c.rs"));
        assert!(!glob_match(g, "x/skill/a.md"));
        assert!(glob_match("src/*.rs", "src/main.rs"));
        assert!(!glob_match("src/*.rs", "src/a/main.rs"));
        assert!(glob_match("a?c", "abc"));
    }

    #[test]
    fn protection() {
        let cfg = PruneConfig { protected_tools: vec!["todo".into()], ..PruneConfig::default() };
        assert!(is_protected(&cfg, "todo", "{}"));
        assert!(is_protected(&cfg, "read", r#"{"path":"/w/.agents/skills/git/SKILL.md"}"#));
        assert!(!is_protected(&cfg, "read", r#"{"path":"/w/src/SKILL.md"}"#));
        assert!(!is_protected(&cfg, "bash", r#"{"command":"cat /w/skills/git/SKILL.md"}"#));
        assert!(is_protected(&cfg, "multi", r#"{"files":["a.rs","/x/skills/y/z.md"]}"#));
        assert_eq!(json_strings(r#"{"a":"x\"y","b":["\u0041"]}"#), vec!["a", "x\"y", "b", "A"]);
    }

    /// Seed 000: `protectedTools` defaults to none — every tool's output is captured, the recovery tool's
    /// too (its lifetime is the grace window, not permanent protection); named, a tool is protected.
    #[test]
    fn no_tool_is_protected_by_default() {
        let d = PruneConfig::default();
        assert!(d.protected_tools.is_empty());
        for tool in [condense_events::QUERY_TOOL_NAME, "read", "bash", "todo"] {
            assert!(!is_protected(&d, tool, "{}"), "{tool}");
        }
        let named = PruneConfig { protected_tools: vec![condense_events::QUERY_TOOL_NAME.into()], ..PruneConfig::default() };
        assert!(is_protected(&named, condense_events::QUERY_TOOL_NAME, "{}"));
    }
}
