//! A hostile registry (or token server) for the tests of what a registry may send: an HTTP server on a
//! loopback address whose every answer the test writes, as a function of the request. It records each
//! request it was sent (method, path with query, headers) and counts the body bytes it handed to the
//! connection, so a test can tell how much of an endless answer the client read before it hung up.
//! Stopped on drop.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::task::AbortOnDropHandle;

/// One request the server was sent.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// The path and query, as sent.
    pub uri: String,
    pub headers: HeaderMap,
}

impl Seen {
    pub fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The count of body bytes handed out, shared with the bodies [`Served::endless`] makes.
#[derive(Debug, Clone, Default)]
pub struct Served(Arc<AtomicU64>);

impl Served {
    pub fn bytes(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// A body of `total` bytes (`x`), in 1 MiB frames made only as the connection takes them, each
    /// counted when handed out.
    pub fn endless(&self, total: u64) -> Body {
        let count = self.0.clone();
        let frame = Bytes::from(vec![b'x'; 1 << 20]);
        let stream = futures::stream::unfold(total, move |left| {
            let count = count.clone();
            let frame = frame.clone();
            async move {
                if left == 0 {
                    return None;
                }
                let n = left.min(frame.len() as u64);
                count.fetch_add(n, Ordering::SeqCst);
                Some((Ok::<_, std::io::Error>(frame.slice(..n as usize)), left - n))
            }
        });
        Body::from_stream(stream)
    }
}

/// A body that never sends a byte (the headers went out; the rest never comes).
pub fn stalled() -> Body {
    Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
}

/// A response with `status`, `headers` and `body`.
pub fn answer(status: u16, headers: &[(&str, &str)], body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).expect("a status code");
    for (k, v) in headers {
        r.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    r
}

type Handler = dyn Fn(&Seen, &Served) -> Response + Send + Sync;

pub struct Hostile {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    served: Served,
    _task: AbortOnDropHandle<()>,
}

impl Hostile {
    /// Serves on a free port of `ip` (a loopback address: `127.0.0.2` is another host than the
    /// registry's `127.0.0.1` and still this machine), answering every request with `handler`.
    pub async fn start(ip: [u8; 4], handler: impl Fn(&Seen, &Served) -> Response + Send + Sync + 'static) -> Hostile {
        assert_eq!(ip[0], 127, "hostile servers live on loopback");
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, 0)))
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let served = Served::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let app = {
            let seen = seen.clone();
            let served = served.clone();
            axum::Router::new().fallback(move |req: axum::extract::Request| {
                let seen = seen.clone();
                let served = served.clone();
                let handler = handler.clone();
                async move {
                    let s = Seen {
                        method: req.method().to_string(),
                        uri: req.uri().to_string(),
                        headers: req.headers().clone(),
                    };
                    seen.lock().unwrap().push(s.clone());
                    handler(&s, &served)
                }
            })
        };
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("hostile server");
        });
        Hostile {
            addr,
            seen,
            served,
            _task: AbortOnDropHandle::new(task),
        }
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Body bytes handed out so far.
    pub fn served(&self) -> u64 {
        self.served.bytes()
    }
}
