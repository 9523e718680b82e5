//! The condense-tool rounds: the request sent, a provider overflow answered by a checkpoint and one
//! retry, each reply recorded, condense's own tool calls answered and the request continued, as JSON or
//! as a stream the client reads as one reply.

use crate::state::{ConvRef, State};
use crate::request::read::Req;
use crate::request::conversation::with_conv;
use crate::request::upstream::send;
use crate::request::response::{api_error, engine_error, json_response, response_headers, stream_back, with_headers};
use crate::api::{self, CONTEXT_COMPACTION_FAILED};
use crate::conv::{Built, Recorded};
use crate::stream::{self, sse};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use condense_engine::EngineError;
use condense_events::{Message, Usage};
use condense_formats::wire::Api;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Sends the request, answers overflows and condense's tools, and returns the client's response.
pub(crate) async fn run_rounds(st: Arc<State>, conv: ConvRef, req: Req, rec: Recorded, body: Vec<u8>) -> Response {
    let api = req.api;
    // (Shared, not copied, with each send: a retry sends it again.)
    let mut body = bytes::Bytes::from(body);
    let mut overflowed = false;
    let resp = loop {
        let resp = match send(&st, &req, body.clone()).await {
            Ok(r) => r,
            Err(r) => return r,
        };
        if resp.status().is_success() {
            break resp;
        }
        let status = resp.status();
        let headers = response_headers(resp.headers());
        let bytes = resp.bytes().await.unwrap_or_default();
        if !api::is_overflow(status.as_u16(), &bytes) {
            st.upstream_error(status.as_u16().to_string());
            let s = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            return with_headers((s, bytes).into_response(), headers);
        }
        // The provider says the prompt is too long: record it, checkpoint, retry once.
        st.overflow();
        let text = api::error_text(&bytes);
        let (raw, internal) = (req.raw.clone(), req.internal.clone());
        let units = rec.units.clone();
        let (stop, _abandoned) = crate::request::conversation::stop_for(&conv.waiting, req.raw.items.len());
        let rebuilt = with_conv(&conv, move |c| {
            c.record_overflow(&text)?;
            c.build(api, &raw, &Recorded { units, last: None, tokens_in: 0 }, &internal, stop, false)
        })
        .await;
        match rebuilt {
            Ok(mut built) if !overflowed => {
                overflowed = true;
                body = req.upstream_body(&mut built).into();
            }
            Ok(_) => {
                return api_error(api, StatusCode::BAD_REQUEST, "invalid_request_error", &format!("{CONTEXT_COMPACTION_FAILED}: the provider rejected the request as too long after a checkpoint and one retry"));
            }
            Err(e) => return engine_error(api, &e),
        }
    };
    let event_stream = resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("text/event-stream"));
    if req.stream && !event_stream {
        // A 200 that is not an event stream (a gateway's page, a JSON reply to a streaming request): the
        // client gets it as it came, as it would without condense; nothing of it is recorded.
        st.upstream_error("not_a_stream");
        return stream_back(resp);
    }
    if req.stream {
        stream_rounds(st, conv, req, rec, resp)
    } else {
        json_rounds(st, conv, req, rec, resp).await
    }
}

/// The text that ends a reply cut by the round limit.
pub const ROUND_LIMIT_NOTE: &str = "[condense: the reply stopped after the limit of condense tool rounds for one request]";

/// What happens after one round's reply was recorded.
enum Next {
    /// The reply is the client's: answer it (ending with `note` when the round limit cut it).
    Done { note: Option<String> },
    /// condense answered its tools: send this body for the next round.
    Continue(Vec<u8>),
}

/// Records a round's reply, answers condense's calls in it, and decides whether to continue.
async fn after_round(st: &State, conv: &ConvRef, req: &Req, rec: &mut Recorded, reply: Message, usage: Option<Usage>, round: u32) -> Result<Next, EngineError> {
    st.count_usage(req.api, &usage);
    let (api, raw, internal) = (req.api, req.raw.clone(), req.internal.clone());
    let parent = rec.last.clone();
    let units = rec.units.clone();
    let max = st.cfg.max_tool_rounds;
    type Round = Result<(Built, condense_events::SessionId, crate::conv::ConvFigures), bool>;
    let (stop, _abandoned) = crate::request::conversation::stop_for(&conv.waiting, req.raw.items.len());
    let (last, next) = with_conv(conv, move |c| -> Result<(Option<String>, Option<Round>), EngineError> {
        let id = c.record_reply(parent.as_deref(), reply.clone(), usage, &internal)?;
        let calls: Vec<bool> = reply.tool_calls().map(|(_, n, _)| internal.answers(n)).collect();
        if !calls.iter().any(|x| *x) {
            return Ok((Some(id), None));
        }
        let (last, _) = c.answer_internal(&id, &reply, &internal)?;
        if !calls.iter().all(|x| *x) {
            // The client has calls of its own to run: the reply is its.
            return Ok((Some(last), None));
        }
        if round + 1 >= max {
            c.session.note("serve", &format!("tool round limit reached: {max} rounds of condense tool calls in one client request; the reply ends here"))?;
            // The reply ends as text the client sees, recorded so its history matches the log.
            let closing = Message::Assistant { content: vec![condense_events::Block::Text { text: ROUND_LIMIT_NOTE.to_string() }], model: None, stop: None, usage: None };
            let id = c.record_reply(Some(&last), closing, None, &internal)?;
            return Ok((Some(id), Some(Err(true))));
        }
        let built = c.build(api, &raw, &Recorded { units, last: Some(last.clone()), tokens_in: 0 }, &internal, stop, false)?;
        Ok((Some(last), Some(Ok((built, c.session.id(), c.figures.clone())))))
    })
    .await?;
    rec.last = last;
    Ok(match next {
        None => Next::Done { note: None },
        Some(Err(_)) => {
            st.counters.round_limits.fetch_add(1, Ordering::Relaxed);
            Next::Done { note: Some(ROUND_LIMIT_NOTE.to_string()) }
        }
        Some(Ok((mut built, session, figures))) => {
            st.counters.tool_rounds.fetch_add(1, Ordering::Relaxed);
            st.tokens(0, built.request_tokens(req.overhead));
            st.live.round(session, built.request_tokens(req.overhead), figures);
            Next::Continue(req.upstream_body(&mut built))
        }
    })
}

async fn json_rounds(st: Arc<State>, conv: ConvRef, req: Req, mut rec: Recorded, first: reqwest::Response) -> Response {
    let api = req.api;
    let is = |n: &str| req.internal.answers(n);
    let headers = response_headers(first.headers());
    let mut resp = first;
    let mut merged: Option<Value> = None;
    let mut round = 0;
    loop {
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => return api_error(api, StatusCode::BAD_GATEWAY, "api_error", &format!("condense serve: the upstream reply broke off: {}", condense_summarize::http::describe_error(e))),
        };
        let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
            // Not JSON: the client gets it as it came, and nothing is recorded.
            return with_headers((StatusCode::OK, bytes).into_response(), headers);
        };
        if let Some(Value::Array(parts)) = v.pointer_mut("/candidates/0/content/parts").filter(|_| api == Api::Gemini) {
            api::name_gemini_calls(parts, req.call_seed(), round, &mut 0);
        }
        let Some((reply, usage)) = api::reply_of(api, &v) else {
            return with_headers(json_response(StatusCode::OK, &v), headers);
        };
        let mut visible = v.clone();
        api::strip_internal(api, &mut visible, &is);
        merged = Some(match merged.take() {
            None => visible,
            Some(m) => api::merge_rounds(api, &m, visible),
        });
        match after_round(&st, &conv, &req, &mut rec, reply, usage, round).await {
            Err(e) => return engine_error(api, &e),
            Ok(Next::Done { note }) => {
                let mut out = merged.take().expect("a reply");
                if let Some(n) = note {
                    api::end_with_note(api, &mut out, &n);
                }
                return with_headers(json_response(StatusCode::OK, &out), headers);
            }
            Ok(Next::Continue(body)) => {
                round += 1;
                resp = match send(&st, &req, body.into()).await {
                    Ok(r) => r,
                    Err(r) => return r,
                };
                if !resp.status().is_success() {
                    let s = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
                    let h = response_headers(resp.headers());
                    let b = resp.bytes().await.unwrap_or_default();
                    return with_headers((s, b).into_response(), h);
                }
            }
        }
    }
}

type Chunk = Result<bytes::Bytes, std::io::Error>;

/// Streams the reply: events pass as they arrive, condense's calls are held back and answered, and the
/// continuation streams on as part of the same reply.
fn stream_rounds(st: Arc<State>, conv: ConvRef, req: Req, rec: Recorded, first: reqwest::Response) -> Response {
    let headers = response_headers(first.headers());
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(64);
    tokio::spawn(async move {
        let mut rec = rec;
        let api = req.api;
        let internal = req.internal.clone();
        let mut codec = stream::codec(api, Box::new(move |n| internal.answers(n)), req.call_seed());
        let mut resp = first;
        let mut round = 0;
        loop {
            let mut events = stream::lossy_utf8(resp.bytes_stream()).eventsource();
            let mut out = Vec::new();
            let mut broke = false;
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(ev) => {
                        codec.feed(&ev.event, &ev.data, &mut out);
                        for b in out.drain(..) {
                            if tx.send(Ok(b)).await.is_err() {
                                return; // The client went away: nothing more to do.
                            }
                        }
                    }
                    Err(_) => {
                        broke = true;
                        break;
                    }
                }
            }
            if broke || !codec.complete() {
                // The upstream dropped the stream: the client's stream breaks the same way, and the
                // half-received reply is not recorded.
                st.upstream_error("stream_cut");
                let _ = tx.send(Err(std::io::Error::other("upstream stream ended before the reply was complete"))).await;
                return;
            }
            let (reply, usage) = codec.reply();
            match after_round(&st, &conv, &req, &mut rec, reply, usage, round).await {
                Err(e) => {
                    let _ = tx.send(Ok(stream_error(api, &format!("condense serve: {e}")))).await;
                    return;
                }
                Ok(Next::Done { note }) => {
                    codec.finish(note.as_deref(), &mut out);
                    for b in out {
                        let _ = tx.send(Ok(b)).await;
                    }
                    return;
                }
                Ok(Next::Continue(body)) => {
                    round += 1;
                    codec.next_round();
                    resp = match send(&st, &req, body.into()).await {
                        Ok(r) if r.status().is_success() => r,
                        Ok(r) => {
                            let status = r.status();
                            let text = api::error_text(&r.bytes().await.unwrap_or_default());
                            let _ = tx.send(Ok(stream_error(api, &format!("upstream {status}: {text}")))).await;
                            return;
                        }
                        Err(_) => {
                            let _ = tx.send(Ok(stream_error(api, "condense serve: upstream unreachable"))).await;
                            return;
                        }
                    };
                }
            }
        }
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) }));
    let mut r = (StatusCode::OK, body).into_response();
    r = with_headers(r, headers);
    r.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r
}

/// An error event in the API's streaming format.
fn stream_error(api: Api, message: &str) -> bytes::Bytes {
    match api {
        Api::Anthropic => sse(Some("error"), &api::error_body(api, "api_error", message).to_string()),
        Api::Chat => sse(None, &api::error_body(api, "api_error", message).to_string()),
        Api::Responses => sse(Some("error"), &json!({"type": "error", "code": "api_error", "message": message}).to_string()),
        Api::Gemini => sse(None, &api::error_body(api, "api_error", message).to_string()),
    }
}
