//! `attnscope serve`: the explorer as a local web app. The model is loaded once and shared; the
//! page (`GET /`) posts text to `POST /api/attention` and draws the same views as
//! `attnscope html`, without restarting. An encoder-decoder model's page asks for a source and
//! a target (its own translation when left empty) and shows its three kinds of attention.
//!
//! Hardening:
//! - bound to 127.0.0.1 unless `--host` says otherwise; on a loopback address only requests
//!   for a loopback host name (`Host`) are answered, and posts only from the page's own origin
//!   (`Origin`), so a web page cannot reach the app through DNS rebinding; the page may not be
//!   framed by another site;
//! - a request's headers, and then its body, must each arrive within `--body-timeout`
//!   seconds: an idle or half-sent connection is closed (408 for a late body), and no
//!   connection stays open past 300 s (`CONNECTION_LIFETIME`; a client that never reads its
//!   answers), so sockets held open to use up the process's file descriptors keep a real
//!   client waiting at most that long (the accept is retried);
//! - request bodies over 1 MiB get 413; at most two forward passes run at once, each holding
//!   its place to its end even when its client has gone; the rest wait, and one that waited
//!   60 s (`QUEUE_WAIT`) gets 503;
//! - any failure, including a panic inside the model, becomes a JSON `{"error": ...}` answer
//!   rather than a dead server, and so do unknown paths (404) and methods (405);
//! - Ctrl-C stops accepting, gives the requests in flight 5 s (`SHUTDOWN_GRACE`) to finish, then
//!   exits (a second Ctrl-C exits at once).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use attn_models::{Model, ModelError, Seq2Seq};
use attn_viz::html::{
    PageOptions, app_page, content_security_policy, payload_json, seq2seq_app_page,
    seq2seq_payload_json,
};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::attribute::PageMethods;
use super::html::{analyse, analyse_seq2seq};
use crate::maps::ModelArgs;

/// Largest request body accepted; larger ones get 413 Payload Too Large.
pub const BODY_LIMIT: usize = 1 << 20;

/// Forward passes allowed at once; more would only compete for the same cores and memory.
const CONCURRENT_RUNS: usize = 2;

/// How long a request waits for a place among the [`CONCURRENT_RUNS`] before it is answered
/// 503: within a connection's lifetime ([`CONNECTION_LIFETIME`]), so a busy server says so
/// rather than closing the connection without an answer.
const QUEUE_WAIT: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct Args {
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 7878)]
    pub port: u16,
    /// Address to bind (an IP address, or localhost for 127.0.0.1)
    ///
    /// Address to bind (an IP address, or localhost for 127.0.0.1). Anything but 127.0.0.1 /
    /// ::1 exposes the app to your network.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST), value_parser = parse_host)]
    pub host: IpAddr,
    /// Seconds a client may take to send a request's headers, and then its body
    ///
    /// Seconds a client may take to send a request's headers, and then its body; an idle or
    /// slower connection is closed (with 408 for a late body).
    #[arg(long, value_name = "S", default_value_t = 10.0, value_parser = parse_timeout)]
    pub body_timeout: f64,
    #[command(flatten)]
    pub methods: PageMethods,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// `--host`: an IP address, or `localhost` (127.0.0.1; other names would need a resolver's
/// choice of address).
fn parse_host(text: &str) -> Result<IpAddr, String> {
    if text.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    text.parse().map_err(|_| {
        format!("{text:?} is not an IP address (127.0.0.1, ::1, 0.0.0.0) or localhost")
    })
}

/// `--body-timeout`: a finite number of seconds from 0.1 to a day (below it, and it applies
/// to headers too, every connection would be closed before its request arrived).
fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.1..=86_400.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0.1 to 86400"
        )),
    }
}

/// The model the app runs: one that reads a text (and a pair), or an encoder-decoder model
/// that reads a source and a target.
enum Served {
    Text(Box<Model>),
    Seq2Seq(Box<Seq2Seq>),
}

impl Served {
    fn name(&self) -> &str {
        match self {
            Served::Text(model) => model.name(),
            Served::Seq2Seq(model) => model.name(),
        }
    }
}

struct App {
    model: Served,
    /// What each answer's heatmap offers beside raw weights.
    methods: PageMethods,
    /// Held by each forward pass, to its end: a client that goes away does not free its
    /// pass's place while the pass still runs.
    runs: Arc<Semaphore>,
    body_timeout: Duration,
}

/// What the page posts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttentionRequest {
    text: String,
    #[serde(default)]
    pair: Option<String>,
    /// The layer whose queries and keys the neuron view needs first.
    #[serde(default)]
    neuron_layer: Option<usize>,
    /// An encoder-decoder model's target; empty or absent: the model's own translation.
    #[serde(default)]
    target: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = match args.model.load_seq2seq()? {
        Some(_) if !args.methods.methods.is_empty() => anyhow::bail!(
            "--methods: the attribution measures are not computed for an encoder-decoder \
             model; its app shows the attention weights"
        ),
        Some(model) => Served::Seq2Seq(Box::new(model)),
        None => {
            let model = args.model.load()?;
            // A method that cannot run on this model (attn-grad without a target, say) is
            // refused now, not on every text.
            analyse(&model, ("attnscope", None), false, &args.methods).context("--methods")?;
            Served::Text(Box::new(model))
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the async runtime")?;
    let body_timeout = Duration::from_secs_f64(args.body_timeout);
    let served = runtime.block_on(serve(
        model,
        args.methods,
        SocketAddr::new(args.host, args.port),
        body_timeout,
    ));
    // A forward pass still running (spawn_blocking) is not waited for: dropping the runtime
    // would, and Ctrl-C no longer ends the process by then.
    runtime.shutdown_background();
    served
}

/// How long the requests in flight may take to finish after Ctrl-C.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a connection may stay open, whatever it does: a client that never reads its
/// answers (a write that never completes) cannot hold a file descriptor for longer. A browser
/// opens a new one for its next request.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

async fn serve(
    model: Served,
    methods: PageMethods,
    address: SocketAddr,
    body_timeout: Duration,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    let bound = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let app = Arc::new(App {
        model,
        methods,
        runs: Arc::new(Semaphore::new(CONCURRENT_RUNS)),
        body_timeout,
    });
    // The first stdout line is the address; tests and scripts read it.
    // A closed standard output is an error here, not the quiet end of a pipe: nobody would
    // learn the address of a server that then ran on.
    crate::outln!(
        "attnscope serve: http://{bound}/ (model {})",
        app.model.name()
    )
    .map_err(|e| anyhow::anyhow!("cannot write the address to standard output: {e}"))?;
    if !bound.ip().is_loopback() {
        crate::note!("warning: listening on {bound}, reachable from other machines");
    }
    let router = router(app, bound);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let stream = tokio::select! {
            _ = &mut ctrl_c => break,
            stream = accept(&listener) => stream,
        };
        let service = TowerToHyperService::new(router.clone());
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(body_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
        while connections.try_join_next().is_some() {}
    }
    let _ = stop.send(true);
    tokio::select! {
        _ = async { while connections.join_next().await.is_some() {} } => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// The next connection. Failed accepts (out of file descriptors, a connection reset before it
/// was taken) are retried after a pause, as axum's own server does; the first of a run is
/// printed, so a server at its file limit does not look hung. No limit of its own: one below
/// the file limit made a real request wait out the timeout behind 256 idle sockets.
async fn accept(listener: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    let mut failed = false;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(err) => {
                if !failed {
                    crate::note!("warning: cannot accept a connection ({err}); retrying");
                    failed = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn router(app: Arc<App>, bound: SocketAddr) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/attention", post(attention))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(bound, same_host))
        .with_state(app)
}

/// On a loopback address, answers only requests for a loopback host name, and requests with
/// an `Origin` only from that host: a page from elsewhere that re-points its own name at
/// 127.0.0.1 (DNS rebinding) gets 403. An app bound to another address (`--host`) was exposed
/// on purpose, under names it cannot know.
async fn same_host(State(bound): State<SocketAddr>, request: Request, next: Next) -> Response {
    match refusal(bound, request.headers()) {
        Some(answer) => answer,
        None => next.run(request).await,
    }
}

/// The 403 of [`same_host`] for these headers, if any.
fn refusal(bound: SocketAddr, headers: &HeaderMap) -> Option<Response> {
    if !bound.ip().is_loopback() {
        return None;
    }
    let header = |name| headers.get(name).and_then(|value| value.to_str().ok());
    let Some(host) = header(header::HOST) else {
        return Some(error(
            StatusCode::FORBIDDEN,
            format!("the request names no host (Host header); open http://{bound}/"),
        ));
    };
    if !is_local(host) {
        return Some(error(
            StatusCode::FORBIDDEN,
            format!(
                "this app answers only requests for localhost or {}, not {host:?}; open \
                 http://{bound}/",
                bound.ip()
            ),
        ));
    }
    match header(header::ORIGIN) {
        Some(origin) if !origin.eq_ignore_ascii_case(&format!("http://{host}")) => Some(error(
            StatusCode::FORBIDDEN,
            format!("requests from {origin} are not accepted; open http://{host}/"),
        )),
        _ => None,
    }
}

/// Whether `host` (a `Host` header, with or without a port) names this machine's loopback.
fn is_local(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    // "localhost." is the same name, fully qualified.
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such page: the app is at / and its API at POST /api/attention".into(),
    )
}

async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed: GET / for the page, POST /api/attention for the API".into(),
    )
}

async fn page(State(app): State<Arc<App>>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                // Only a header can forbid framing (a page's own policy tag cannot).
                format!("{}; frame-ancestors 'none'", content_security_policy()).as_str(),
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        match app.model {
            Served::Text(_) => app_page(),
            Served::Seq2Seq(_) => seq2seq_app_page(),
        },
    )
        .into_response()
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// Reads and parses the posted JSON: 415 unless it is declared JSON, 413 past [`BODY_LIMIT`]
/// (checked as bytes arrive, so a false Content-Length does not matter), 408 when the body has
/// not all arrived within the app's body timeout, 400/422 for JSON that does not parse or does
/// not fit [`AttentionRequest`].
async fn read_request(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<AttentionRequest, Response> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        });
    if !json {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the request must be JSON (Content-Type: application/json)".into(),
        ));
    }
    let bytes = match tokio::time::timeout(app.body_timeout, axum::body::to_bytes(body, BODY_LIMIT))
        .await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(err))
            if std::error::Error::source(&err)
                .is_some_and(|inner| inner.is::<http_body_util::LengthLimitError>()) =>
        {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request is larger than {} KiB", BODY_LIMIT >> 10),
            ));
        }
        Ok(Err(_)) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "the request body could not be read".into(),
            ));
        }
        Err(_) => {
            let mut answer = error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    app.body_timeout.as_secs_f64()
                ),
            );
            answer.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return Err(answer);
        }
    };
    Json::<AttentionRequest>::from_bytes(&bytes)
        .map(|Json(request)| request)
        .map_err(|rejection| {
            error(
                rejection.status(),
                format!("bad request: {}", rejection.body_text()),
            )
        })
}

async fn attention(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let request = match read_request(&app, &headers, body).await {
        Ok(request) => request,
        Err(answer) => return answer,
    };
    let permit = match tokio::time::timeout(QUEUE_WAIT, Arc::clone(&app.runs).acquire_owned()).await
    {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down".into(),
            );
        }
        Err(_) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the server is busy: this text waited {} s behind others; try again",
                    QUEUE_WAIT.as_secs()
                ),
            );
        }
    };
    let worker = Arc::clone(&app);
    let result = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let pair = request.pair.as_deref().filter(|p| !p.is_empty());
        let target = request.target.as_deref().filter(|t| !t.is_empty());
        // Nothing to keep small on the machine's own loopback: every weight to 3 decimals (those
        // under 0.0005 round to 0), where a page file's floor hid up to 84% of a diffuse row at
        // 506 tokens.
        let options = PageOptions {
            neuron_layer: request.neuron_layer,
            size_budget_bytes: None,
            ..PageOptions::default()
        };
        let model = match &worker.model {
            Served::Seq2Seq(model) => {
                anyhow::ensure!(
                    pair.is_none(),
                    "An encoder-decoder model reads one source text and its target, not a pair: \
                     give the translation as the target."
                );
                anyhow::ensure!(
                    request.neuron_layer.is_none(),
                    "An encoder-decoder model's answer has no neuron view: leave out neuron_layer."
                );
                let maps = analyse_seq2seq(model, &request.text, target, false)?;
                return anyhow::Ok(seq2seq_payload_json(&maps, &options)?);
            }
            Served::Text(model) => model,
        };
        anyhow::ensure!(
            target.is_none(),
            "A target is read by an encoder-decoder model (BART, mBART, Marian, T5); {} reads one \
             text (and a pair).",
            model.name()
        );
        let (maps, qk, measures) = analyse(model, (&request.text, pair), false, &worker.methods)?;
        anyhow::Ok(payload_json(&maps, Some(&qk), &measures, &options)?)
    })
    .await;
    match result {
        Ok(Ok(json)) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(Err(err)) => error(StatusCode::UNPROCESSABLE_ENTITY, page_message(&err)),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the model failed on this text (an internal error); the server keeps running".into(),
        ),
    }
}

/// The error as the page shows it; the CLI's advice (`--truncate`) does not apply here.
fn page_message(err: &anyhow::Error) -> String {
    match err.downcast_ref::<ModelError>() {
        Some(ModelError::TooLong { tokens, max, .. }) => format!(
            "The text is {tokens} tokens long; this model reads at most {max}. Shorten the text (or the pair)."
        ),
        Some(ModelError::TooManyWords { words, max, .. }) => format!(
            "The text has {words} words; this model reads at most {max} tokens. Shorten the text (or the pair)."
        ),
        _ => format!("{err:#}"),
    }
}
