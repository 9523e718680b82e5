//! `condense history`: commit an archive, and the model's three recovery tools from the command line.
//! `archives`, `search` and `read` call the same engine entry the model's tool calls reach
//! (`Session::history_tool`), so the command prints exactly the reply the model reads; `read` without
//! `--archive` looks through earlier archives as the tool does.

use crate::cli::History;
use crate::shared::session_of;
use anyhow::{bail, Result};
use condense_engine::Store;
use serde_json::json;
use std::process::ExitCode;

pub(crate) fn history(store: &Store, verb: History) -> Result<ExitCode> {
    let (session, tool, arguments) = match verb {
        History::Archive { session } => {
            let id = session_of(store, &session)?.archive_now()?;
            outln!("archive {id} committed");
            return Ok(ExitCode::SUCCESS);
        }
        History::Archives { session, page } => (session, "history_archives", json!({ "page": page })),
        History::Search { session, keywords, archive } => (session, "history_search", json!({ "keywords": keywords, "archive": archive })),
        History::Read { session, entry, offset, archive } => (session, "history_read", json!({ "id": entry, "offset": offset, "archive": archive })),
    };
    let answer = session_of(store, &session)?.history_tool(tool, &arguments.to_string())?;
    if answer.is_error {
        // What the model would read as an error result is, on the command line, a usage error.
        bail!("{}", answer.text);
    }
    outln!("{}", answer.text);
    Ok(ExitCode::SUCCESS)
}
