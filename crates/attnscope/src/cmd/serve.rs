//! `attnscope serve`: the explorer as a local web app. The model is loaded once and shared; the
//! page (`GET /`) posts text to `POST /api/attention` and draws the same views as
//! `attnscope html`, without restarting.
//!
//! Hardening: bound to 127.0.0.1 unless `--host` says otherwise, request bodies over 1 MiB get
//! 413, a body that has not fully arrived within `--body-timeout` seconds gets 408 and its
//! connection is closed, at most two forward passes run at once (the rest wait), and any failure,
//! including a panic inside the model, becomes a JSON `{"error": ...}` answer rather than a dead
//! server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use attn_models::{Model, ModelError};
use attn_viz::html::{PageOptions, app_page, content_security_policy, payload_json};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::html::analyse;
use crate::maps::ModelArgs;

/// Largest request body accepted; larger ones get 413 Payload Too Large.
pub const BODY_LIMIT: usize = 1 << 20;

/// Forward passes allowed at once; more would only compete for the same cores and memory.
const CONCURRENT_RUNS: usize = 2;

#[derive(clap::Args)]
pub struct Args {
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 7878)]
    pub port: u16,
    /// Address to bind. Anything but 127.0.0.1 / ::1 exposes the app to your network.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub host: IpAddr,
    /// Seconds a client may take to send a request body; slower ones get 408 and are closed.
    #[arg(long, default_value_t = 10.0, value_parser = parse_timeout)]
    pub body_timeout: f64,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// `--body-timeout`: a finite number of seconds, above 0 and at most a day.
fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds <= 86_400.0 => Ok(seconds),
        _ => Err(format!(
            "{text:?} is not a number of seconds above 0 and at most 86400"
        )),
    }
}

struct App {
    model: Model,
    runs: Semaphore,
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
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the async runtime")?;
    let body_timeout = Duration::from_secs_f64(args.body_timeout);
    runtime.block_on(serve(
        model,
        SocketAddr::new(args.host, args.port),
        body_timeout,
    ))
}

async fn serve(model: Model, address: SocketAddr, body_timeout: Duration) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    let bound = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let app = Arc::new(App {
        model,
        runs: Semaphore::new(CONCURRENT_RUNS),
        body_timeout,
    });
    // The first stdout line is the address; tests and scripts read it.
    println!(
        "attnscope serve: http://{bound}/ (model {})",
        app.model.name()
    );
    if !bound.ip().is_loopback() {
        eprintln!("warning: listening on {bound}, reachable from other machines");
    }
    axum::serve(listener, router(app))
        .with_graceful_shutdown(async {
            // Without a Ctrl-C handler the process still ends on the signal's default action.
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the server stopped")
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/attention", post(attention))
        .with_state(app)
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                content_security_policy().as_str(),
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        app_page(),
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
                    "the request body did not arrive within {:.0} s",
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
    let Ok(_permit) = app.runs.acquire().await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down".into(),
        );
    };
    let worker = Arc::clone(&app);
    let result = tokio::task::spawn_blocking(move || {
        let pair = request.pair.as_deref().filter(|p| !p.is_empty());
        let (maps, qk) = analyse(&worker.model, &request.text, pair, false)?;
        let options = PageOptions {
            neuron_layer: request.neuron_layer,
            ..PageOptions::default()
        };
        anyhow::Ok(payload_json(&maps, Some(&qk), &options)?)
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
        _ => format!("{err:#}"),
    }
}
