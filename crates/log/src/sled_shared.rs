//! What the sled backend's parts share: the open database with its trees, heads and subscribers
//! ([`Shared`]), and the floor of new session ids. Below both the backend (`sled_store`) and its writer
//! thread (`writer`), which each hold the same `Shared`.

use crate::{blob, manifest, Appended};
use condense_events::{Seq, SessionId};
use crossbeam_channel::Sender;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The sled database and what every part of the backend reads or updates beside it.
pub(crate) struct Shared {
    pub(crate) path: PathBuf,
    pub(crate) db: sled::Db,
    pub(crate) events: sled::Tree,
    pub(crate) sessions: sled::Tree,
    pub(crate) subscribers: Mutex<Vec<Sender<Appended>>>,
    pub(crate) heads: Mutex<BTreeMap<SessionId, Seq>>,
    pub(crate) manifest: Mutex<manifest::Manifest>,
    /// Blobs written without a sync: the writer syncs them before each flush.
    pub(crate) pending_blobs: blob::Pending,
    /// The folder of the value files (`values`).
    pub(crate) values_dir: PathBuf,
}

/// Key (in sled's default tree) of the lowest id a new session may take: one above every removed one.
pub(crate) const ID_FLOOR_KEY: &[u8] = b"condense/session-id-floor";

pub(crate) fn id_floor(shared: &Shared) -> SessionId {
    match shared.db.get(ID_FLOOR_KEY) {
        Ok(Some(v)) if v.len() == 8 => u64::from_be_bytes(v.as_ref().try_into().expect("8 bytes")),
        _ => 1,
    }
}

