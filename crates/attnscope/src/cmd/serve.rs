//! `attnscope serve`: the explorer as a local web app. The model is loaded once and shared; the
//! page (`GET /`) posts text to `POST /api/attention` and draws the same views as
//! `attnscope html`, without restarting.
//!
//! Hardening: bound to 127.0.0.1 unless `--host` says otherwise, request bodies over 1 MiB get
//! 413, at most two forward passes run at once (the rest wait), and any failure, including a
//! panic inside the model, becomes a JSON `{"error": ...}` answer rather than a dead server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use attn_models::{Model, ModelError};
use attn_viz::html::{PageOptions, app_page, content_security_policy, payload_json};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
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
    #[command(flatten)]
    pub model: ModelArgs,
}

struct App {
    model: Model,
    runs: Semaphore,
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
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(model, SocketAddr::new(args.host, args.port)))
}

async fn serve(model: Model, address: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    let bound = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let app = Arc::new(App {
        model,
        runs: Semaphore::new(CONCURRENT_RUNS),
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
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
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

async fn attention(
    State(app): State<Arc<App>>,
    request: Result<Json<AttentionRequest>, JsonRejection>,
) -> Response {
    let Json(request) = match request {
        Ok(request) => request,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request is larger than {} KiB", BODY_LIMIT >> 10),
            );
        }
        Err(rejection) => {
            return error(
                rejection.status(),
                format!("bad request: {}", rejection.body_text()),
            );
        }
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
        Some(ModelError::TooLong { tokens, max }) => format!(
            "The text is {tokens} tokens long; this model reads at most {max}. Shorten the text (or the pair)."
        ),
        _ => format!("{err:#}"),
    }
}
