//! Blocking queries wait outside their handlers. A handler suspended in its read keeps
//! everything it and the layers around it hold (its extractors, the permission guard, the
//! router's futures): several KB per waiting client. So a blocking `GET` is run once to find
//! its read; the read, instead of waiting, is handed to the front layer as a [`Blocking`] (a
//! few hundred bytes) and the handler unwinds. The front layer keeps only the request's head,
//! waits, and then runs the request again with the answer, which its read takes instead of
//! asking the servers. The handler thus runs twice, and must do nothing before its first read
//! that it could not do twice: which is what a `GET` handler does (reads only). The second run
//! resolves the request's token again, so a token deleted during the wait is refused.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, HttpBody as _};
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, Uri, Version};
use axum::response::Response;
use futures::FutureExt as _;
use futures::future::Either;
use parking_lot::Mutex;

use crate::backend::{Answer, Blocking};

/// A request's first blocking read, as the handler and the front layer share it.
#[derive(Clone)]
pub struct Park(Arc<Mutex<Parking>>);

enum Parking {
    /// The request's first run, before its first blocking read.
    Open,
    /// The first run's first blocking read, not waited for: the front layer waits.
    Parked(Blocking),
    /// The second run, with the answer its first blocking read is to take. Boxed: every
    /// waiting request holds a `Parking`, mostly not this.
    Resumed(Box<Resumed>),
    /// Nothing left to park or take: reads block where they are.
    Spent,
}

/// What the front layer waited for, and the read it answers (what it asked, encoded).
pub struct Resumed {
    asked: Arc<[u8]>,
    pub answer: Answer,
}

/// What a request's blocking read does.
pub enum Claim {
    /// Nothing: the front layer waits for it, and the handler is to unwind at once.
    Parked,
    /// Answers with what the front layer waited for.
    Answered(Box<Resumed>),
    /// Waits where it is.
    Wait(Blocking),
}

impl Park {
    fn new(parking: Parking) -> Park {
        Park(Arc::new(Mutex::new(parking)))
    }

    /// What a request's blocking read `blocking` is to do: the first of a first run is parked,
    /// the first of a second run takes the answer waited for (if it asks the same).
    pub fn claim(&self, blocking: Blocking) -> Claim {
        let mut parking = self.0.lock();
        match std::mem::replace(&mut *parking, Parking::Spent) {
            Parking::Open => {
                *parking = Parking::Parked(blocking);
                Claim::Parked
            }
            Parking::Resumed(resumed) if resumed.asked == *blocking.asks() => {
                Claim::Answered(resumed)
            }
            Parking::Parked(_) | Parking::Resumed(..) | Parking::Spent => Claim::Wait(blocking),
        }
    }

    fn parked(&self) -> Option<Blocking> {
        match std::mem::replace(&mut *self.0.lock(), Parking::Spent) {
            Parking::Parked(blocking) => Some(blocking),
            _ => None,
        }
    }
}

/// Runs `req`; if its handler parked a blocking read, waits for that here, holding only the
/// request's head, and runs it again with the answer. A plain function, so that the future a
/// waiting query holds keeps no request (an `async fn` keeps its arguments while it runs); the
/// runs are boxed, and the wait is a future of its own ([`resume`]) that follows the first
/// run's, so the future keeps room for neither beside the wait.
pub fn run(mut req: Request, routes: Router) -> impl Future<Output = Response> + Send {
    let parking = may_park(&req).then(|| {
        let head = Head::copy(&req);
        let park = Park::new(Parking::Open);
        req.extensions_mut().insert(park.clone());
        (head, park)
    });
    let first = Box::pin(super::run_routes(routes.clone(), req));
    first.then(move |response| {
        let parked = parking.and_then(|(head, park)| Some((head, park.parked()?)));
        match parked {
            None => Either::Left(std::future::ready(response)),
            Some((head, blocking)) => {
                drop(response);
                Either::Right(resume(head, blocking, routes))
            }
        }
    })
}

/// Waits for a parked read `blocking`, then runs its request (`head`) again with the answer.
async fn resume(head: Head, blocking: Blocking, routes: Router) -> Response {
    let asked = Arc::clone(blocking.asks());
    let answer = blocking.answer().await;
    let mut req = head.into_request();
    req.extensions_mut()
        .insert(Park::new(Parking::Resumed(Box::new(Resumed {
            asked,
            answer,
        }))));
    Box::pin(super::run_routes(routes, req)).await
}

/// Only a `GET` (or `HEAD`) with an index and no body may block, and only such a request is
/// safe to run twice.
fn may_park(req: &Request) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && req.uri().query().is_some_and(|q| q.contains("index="))
        && req.body().is_end_stream()
}

/// A request's head in one allocation of its own: the connection's read buffer, which the
/// request's URI and headers share, is not kept alive by a waiting request, and a header map
/// (about 1 KB with its room to grow) is made again only for the second run.
struct Head {
    method: Method,
    version: Version,
    /// The URI, then each header's name and value, each ended by a zero byte (which none of
    /// them may contain).
    text: Box<[u8]>,
}

impl Head {
    fn copy(req: &Request) -> Head {
        let mut text = Vec::new();
        text.extend_from_slice(req.uri().to_string().as_bytes());
        text.push(0);
        for (name, value) in req.headers() {
            text.extend_from_slice(name.as_str().as_bytes());
            text.push(0);
            text.extend_from_slice(value.as_bytes());
            text.push(0);
        }
        Head {
            method: req.method().clone(),
            version: req.version(),
            text: text.into_boxed_slice(),
        }
    }

    /// The request again, with no body. Each part was valid when copied, so each parses.
    fn into_request(self) -> Request {
        let mut parts = self.text.split(|b| *b == 0);
        let mut req = Request::new(Body::empty());
        *req.method_mut() = self.method;
        *req.version_mut() = self.version;
        if let Some(uri) = parts.next().and_then(|uri| Uri::try_from(uri).ok()) {
            *req.uri_mut() = uri;
        }
        while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                req.headers_mut().append(name, value);
            }
        }
        req
    }
}
