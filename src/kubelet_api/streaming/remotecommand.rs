//! The remote-command protocol of exec and attach, whatever carries it: the options in the
//! query, the streams (stdin, stdout, stderr, error, resize) as tokio I/O, and the final
//! `metav1.Status` on the error stream that tells the client how it went — `Success`, or a
//! `Failure` with reason `NonZeroExitCode` and the code as an `ExitCode` cause (how kubectl
//! learns the exit status of the command).

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use std::future::Future;
use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use super::Admission;
use super::spdy::{self, Stream};
use super::upgrade::{self, Transport};
use super::websocket::{self, Channels};
use crate::kubelet_api::state::ApiState;

pub type Input = Box<dyn AsyncRead + Send + Unpin>;
pub type Output = Box<dyn AsyncWrite + Send + Unpin>;

/// The remote-command sub-protocols this side speaks, preferred first. v5 adds the close
/// signal on WebSockets; over SPDY it is v4 (SPDY closes streams by itself).
pub const PROTOCOLS: [&str; 2] = [websocket::V5, websocket::V4];

/// What the client asked for (the kubelet's query: `command` repeated, `input`, `output`,
/// `error`, `tty` = `1`; the apiserver-style `stdin`/`stdout`/`stderr` and `true` work too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

fn truthy(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE")
}

impl Options {
    pub fn parse(query: &[(String, String)], command_required: bool) -> Result<Self, String> {
        let mut o = Options::default();
        for (k, v) in query {
            match k.as_str() {
                "command" => o.command.push(v.clone()),
                "input" | "stdin" => o.stdin = truthy(v),
                "output" | "stdout" => o.stdout = truthy(v),
                "error" | "stderr" => o.stderr = truthy(v),
                "tty" => o.tty = truthy(v),
                _ => {}
            }
        }
        if o.tty {
            // As the kubelet: a terminal merges stderr into stdout.
            o.stderr = false;
        }
        if !o.stdin && !o.stdout && !o.stderr {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        if command_required && o.command.is_empty() {
            return Err("you must specify a command (query parameter `command`, once per argument)".into());
        }
        Ok(o)
    }
}

/// The outcome written on the error stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success,
    ExitCode(i32),
    /// The request could not be carried out as asked (400).
    BadRequest(String),
    /// It failed on this side (500).
    Internal(String),
}

impl Outcome {
    /// The `metav1.Status` document.
    pub fn status(&self) -> serde_json::Value {
        let base = |status: &str| json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status});
        let mut s = match self {
            Outcome::Success => return base("Success"),
            _ => base("Failure"),
        };
        let fields = match self {
            Outcome::Success => unreachable!(),
            Outcome::ExitCode(code) => json!({
                "message": format!("command terminated with non-zero exit code: exit status {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            }),
            Outcome::BadRequest(message) => json!({"message": message, "reason": "BadRequest", "code": 400}),
            Outcome::Internal(message) => json!({
                "message": format!("Internal error occurred: {message}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": message}]},
                "code": 500,
            }),
        };
        if let (Some(s), Some(f)) = (s.as_object_mut(), fields.as_object()) {
            s.extend(f.clone());
        }
        s
    }
}

/// How the connection ends once the outcome is written.
enum Ending {
    Spdy(spdy::Session),
    WebSocket(Channels),
}

/// The streams of one exec or attach, transport-independent.
pub struct Streams {
    pub stdin: Option<Input>,
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    error: Output,
    /// Cancelled when the client is gone.
    pub closed: CancellationToken,
    ending: Ending,
}

/// How long the last writes may take to reach a client before the connection is dropped.
const FINISH_WITHIN: Duration = Duration::from_secs(10);

impl Streams {
    /// Writes the outcome, ends every stream and closes the connection.
    pub async fn finish(mut self, outcome: &Outcome) {
        for out in [self.stdout.take(), self.stderr.take()].into_iter().flatten() {
            let mut out = out;
            let _ = out.shutdown().await;
        }
        let body = outcome.status().to_string();
        let _ = self.error.write_all(body.as_bytes()).await;
        let _ = self.error.shutdown().await;
        match self.ending {
            Ending::Spdy(session) => session.shutdown(FINISH_WITHIN).await,
            Ending::WebSocket(channels) => channels.close(FINISH_WITHIN).await,
        }
    }

    /// The streams of a WebSocket connection.
    pub async fn websocket(mut channels: Channels, opts: &Options) -> Streams {
        let mut stdout = opts.stdout.then(|| channels.writer(websocket::STDOUT));
        let mut stderr = opts.stderr.then(|| channels.writer(websocket::STDERR));
        let mut error = channels.writer(websocket::ERROR);
        // The kubelet's "ready" signal: an empty message on the lowest writable channel.
        let _ = match (&mut stdout, &mut stderr) {
            (Some(w), _) | (None, Some(w)) => w.announce().await,
            (None, None) => error.announce().await,
        };
        Streams {
            stdin: channels.stdin.take().map(|s| Box::new(s) as Input),
            stdout: stdout.map(|w| Box::new(w) as Output),
            stderr: stderr.map(|w| Box::new(w) as Output),
            error: Box::new(error),
            closed: channels.closed.clone(),
            ending: Ending::WebSocket(channels),
        }
    }

    /// Waits (at most `within`) for the SPDY streams a client with `opts` opens, by their
    /// `streamtype`. A stream of an unknown or repeated type is reset; a client that does not
    /// open them all in time gets its connection closed (the kubelet's behaviour).
    pub async fn spdy(
        session: spdy::Session,
        mut incoming: mpsc::Receiver<Stream>,
        opts: &Options,
        within: Duration,
    ) -> Result<Streams, String> {
        let mut want: Vec<&str> = vec!["error"];
        for (asked, kind) in [
            (opts.stdin, "stdin"),
            (opts.stdout, "stdout"),
            (opts.stderr, "stderr"),
            (opts.tty, "resize"),
        ] {
            if asked {
                want.push(kind);
            }
        }
        let mut got: Vec<(String, Stream)> = Vec::new();
        let deadline = tokio::time::Instant::now() + within;
        while got.len() < want.len() {
            let next = tokio::select! {
                s = incoming.recv() => s,
                _ = tokio::time::sleep_until(deadline) => {
                    let reason = format!(
                        "timed out after {within:?} waiting for the client to create its streams (has {:?}, wants {want:?}); closing the connection",
                        got.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
                    );
                    tracing::warn!(%reason, "SPDY remote command: the client did not set up its streams");
                    session.shutdown(Duration::from_secs(1)).await;
                    return Err(reason);
                }
            };
            let Some(stream) = next else {
                return Err(session
                    .failure()
                    .unwrap_or_else(|| "the client left before creating its streams".into()));
            };
            let kind = stream.stream_type().unwrap_or_default().to_string();
            if !want.contains(&kind.as_str()) || got.iter().any(|(k, _)| *k == kind) {
                // Debug formatting: the value is the peer's, and may hold line breaks.
                tracing::warn!(stream = stream.id, streamtype = ?kind, "exec/attach: unexpected SPDY stream; resetting it");
                session.reset(stream.id, spdy::codec::frame::rst::PROTOCOL_ERROR);
                continue;
            }
            got.push((kind, stream));
        }
        let mut take = |kind: &str| got.iter().position(|(k, _)| k == kind).map(|i| got.remove(i).1);
        let error = take("error").expect("the error stream is always wanted");
        let stdin = take("stdin");
        let stdout = take("stdout");
        let stderr = take("stderr");
        // resize (only with a TTY, which is refused) is never read.
        Ok(Streams {
            stdin: stdin.map(|s| Box::new(s.reader) as Input),
            stdout: stdout.map(|s| Box::new(s.writer) as Output),
            stderr: stderr.map(|s| Box::new(s.writer) as Output),
            error: Box::new(error.writer),
            closed: session.token(),
            ending: Ending::Spdy(session),
        })
    }
}

/// Upgrades `req` (SPDY or WebSocket, a remote-command sub-protocol), builds the streams the
/// client asked for and runs `body` on them in a task of its own; `what` names the endpoint
/// in messages. The admission is held until `body` is done.
pub async fn serve<F, Fut>(
    api: Arc<ApiState>,
    req: Request,
    opts: Options,
    admission: Admission,
    what: &'static str,
    body: F,
) -> Response
where
    F: FnOnce(Streams) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let transport = match upgrade::transport(req.headers(), what) {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    let protocol = match upgrade::negotiate(req.headers(), transport, &PROTOCOLS) {
        Ok(p) => p,
        Err(refusal) => return refusal.into_response(),
    };
    tracing::debug!(endpoint = %what, ?transport, %protocol, "streaming: upgrading");
    let config = api.streaming.config.clone();
    let panics = api.metrics.session_panics();
    match transport {
        Transport::Spdy => upgrade::spdy(req, protocol, panics.clone(), move |io| async move {
            let _admission = admission;
            let session_config = spdy::SessionConfig {
                idle_timeout: config.idle_timeout,
                max_streams: 8,
                panics: Some(panics),
                ..Default::default()
            };
            let (session, incoming) = spdy::serve(io, session_config);
            match Streams::spdy(session, incoming, &opts, config.creation_timeout).await {
                Ok(streams) => body(streams).await,
                Err(reason) => tracing::debug!(%reason, "{what}: no streams, no {what}"),
            }
        }),
        Transport::WebSocket => {
            upgrade::websocket(req, protocol.clone(), panics.clone(), move |socket| async move {
                let _admission = admission;
                let channels = Channels::start(socket, &protocol, opts.stdin, config.idle_timeout, Some(panics));
                let streams = Streams::websocket(channels, &opts).await;
                body(streams).await
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn options_as_the_kubelet_reads_them() {
        let o = Options::parse(
            &q(&[
                ("command", "sh"),
                ("command", "-c"),
                ("command", "exit 3"),
                ("input", "1"),
                ("output", "1"),
                ("error", "1"),
            ]),
            true,
        )
        .unwrap();
        assert_eq!(o.command, ["sh", "-c", "exit 3"]);
        assert!(o.stdin && o.stdout && o.stderr && !o.tty);
        let o = Options::parse(&q(&[("stdout", "true"), ("tty", "1"), ("stderr", "true")]), false).unwrap();
        assert!(o.stdout && o.tty && !o.stderr, "a TTY merges stderr");
        assert!(
            Options::parse(&q(&[("command", "ls")]), true)
                .unwrap_err()
                .contains("at least 1 of stdin")
        );
        assert!(
            Options::parse(&q(&[("output", "1")]), true)
                .unwrap_err()
                .contains("a command")
        );
    }

    #[test]
    fn statuses_are_what_client_go_decodes() {
        assert_eq!(
            Outcome::Success.status(),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        );
        let s = Outcome::ExitCode(3).status();
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0], json!({"reason": "ExitCode", "message": "3"}));
        let s = Outcome::Internal("dial agent: refused".into()).status();
        assert_eq!(
            (s["reason"].as_str(), s["code"].as_i64(), s["message"].as_str()),
            (
                Some("InternalError"),
                Some(500),
                Some("Internal error occurred: dial agent: refused")
            )
        );
        assert_eq!(Outcome::BadRequest("no tty".into()).status()["message"], "no tty");
    }
}
