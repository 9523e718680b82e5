//! `condense verify`: every value decoded, every blob re-hashed, every session rendered and checked.

use anyhow::Result;
use condense_engine::Store;
use condense_render::{check, Projection};
use serde_json::json;
use std::process::ExitCode;

pub(crate) fn verify(store: &Store, json_out: bool) -> Result<ExitCode> {
    let report = store.log().verify()?;
    let mut rows = Vec::new();
    let mut bad = 0;
    for info in store.sessions()? {
        let session = store.session(&info.name)?;
        // A: one fresh fold of the whole log. B: the warm path, folded in turn-sized steps with a render
        // after each, as a live host would. They must agree byte for byte.
        let fresh = session.projection_at(info.head)?;
        let mut live = Projection::new();
        let mut steps = 0u64;
        store.log().for_each(info.id, 1, info.head, |env| {
            live.apply(env.seq, &env.body);
            if env.seq % 64 == 0 {
                let _ = live.render();
                steps += 1;
            }
            Ok(())
        })?;
        let rendered = fresh.render();
        let violations = check(&rendered.messages);
        // C: the session's warm projection, which may have taken in events appended since the head was
        // read (a server with traffic): it is compared with a fresh fold up to where it stands.
        let warm = session.projection()?;
        let warm_same = if warm.seq() == info.head { bytes_of(&fresh) == bytes_of(&warm) } else { bytes_of(&session.projection_at(warm.seq())?) == bytes_of(&warm) };
        let same = bytes_of(&fresh) == bytes_of(&live) && warm_same;
        if !same || !violations.is_empty() {
            bad += 1;
        }
        rows.push(json!({
            "session": info.name, "events": info.head, "messages": rendered.messages.len(), "identical": same,
            "violations": violations.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
            "synthetic_results": rendered.report.synthetic_results.len(),
            "orphan_results": rendered.report.orphan_results.len(),
            "empty_assistants": rendered.report.empty_assistants,
            "failed_turns": rendered.report.failed_turns,
            "duplicate_calls": rendered.report.duplicate_calls,
        }));
        if !json_out && (!same || !violations.is_empty()) {
            outln!("FAIL {}: identical={same}", info.name);
            for v in violations.iter().take(5) {
                outln!("  {v}");
            }
        }
    }
    // An import that began and never finished: the session holds only part of its file.
    let incomplete = store.incomplete_imports()?;
    if !json_out {
        for name in &incomplete {
            outln!("INCOMPLETE {name}: its import stopped part-way; import the same file again to finish it");
        }
    }
    let bad = bad + incomplete.len();
    if json_out {
        outln!("{}", serde_json::to_string_pretty(&json!({
            "sessions": report.sessions, "events": report.events, "blobs": report.blobs, "failed": bad,
            "incomplete_imports": incomplete, "results": rows,
        }))?);
    } else {
        outln!("verified {} sessions, {} events, {} blobs: {} failed", report.sessions, report.events, report.blobs, bad);
    }
    Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}


/// The bytes a render is compared by.
fn bytes_of(p: &Projection) -> Vec<u8> {
    serde_json::to_vec(&condense_formats::export::neutral(&p.render().messages)).expect("JSON of a context")
}
