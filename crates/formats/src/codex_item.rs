//! The fields of a Codex `response_item` payload the importer reads, a type of their own below both the
//! JSON-lines reader (whose fast path carries them) and the Codex importer (which reads them).

use crate::json::{present, str_of, take_str, Obj};
use serde_json::Value;

/// The fields of a `response_item` payload that the Codex importer's `History::item` reads. The fast reader parses them
/// from the line's text, without building the payload as a value; a payload read as a value (a line
/// the fast reader refused, a compaction's replacement history) is taken apart into them by
/// [`Item::of_value`], which reads a field of another type as absent, as the importer always did.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Item {
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) role: Option<String>,
    #[serde(default)]
    pub(crate) content: Option<Vec<Obj<Part>>>,
    #[serde(default)]
    pub(crate) summary: Option<Vec<Obj<SummaryPart>>>,
    #[serde(default)]
    pub(crate) encrypted_content: Option<String>,
    #[serde(default)]
    pub(crate) call_id: Option<String>,
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) status: Option<String>,
    // Present, even as `null`, each of these is taken as it is.
    #[serde(default, deserialize_with = "present")]
    pub(crate) arguments: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) input: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) action: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) output: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) tools: Option<Value>,
}

/// A part of a message's content.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Part {
    #[serde(rename = "type", default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) text: Option<String>,
    #[serde(default)]
    pub(crate) image_url: Option<String>,
}

/// A part of a reasoning item's summary.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct SummaryPart {
    #[serde(default)]
    pub(crate) text: Option<String>,
}

impl Item {
    /// The fields of a payload read as a value: a string field that holds something else is absent, a
    /// content or summary that is not an array is none, as are a part's fields that are not strings.
    pub(crate) fn of_value(mut p: Value) -> Item {
        let s = |v: &Value, key: &str| str_of(v, key).map(str::to_string);
        let content = match p.get_mut("content").map(Value::take) {
            Some(Value::Array(parts)) => Some(
                parts
                    .into_iter()
                    .map(|mut c| Obj(Part { kind: s(&c, "type"), text: take_str(&mut c, "text"), image_url: take_str(&mut c, "image_url") }))
                    .collect(),
            ),
            _ => None,
        };
        let summary = match p.get("summary") {
            Some(Value::Array(parts)) => Some(parts.iter().map(|part| Obj(SummaryPart { text: s(part, "text") })).collect()),
            _ => None,
        };
        let mut take = |key: &str| p.get_mut(key).map(Value::take);
        let (arguments, input, action, output, tools) = (take("arguments"), take("input"), take("action"), take("output"), take("tools"));
        Item {
            kind: s(&p, "type"),
            role: s(&p, "role"),
            content,
            summary,
            encrypted_content: take_str(&mut p, "encrypted_content"),
            call_id: s(&p, "call_id"),
            id: s(&p, "id"),
            name: s(&p, "name"),
            status: s(&p, "status"),
            arguments,
            input,
            action,
            output,
            tools,
        }
    }
}

