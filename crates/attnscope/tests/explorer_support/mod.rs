//! Test support for the explorer (`attnscope html` and `attnscope serve`): the golden tiny
//! GPT-2 model, a running server, the page's embedded data, and headless Chromium driven over
//! WebDriver (Debian's `chromium` and `chromium-driver`) with a small blocking client.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

pub fn golden() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// A 2-layer, 4-head GPT-2 with 64 positions: fast, and long texts are easy to make.
pub fn tiny_gpt2() -> PathBuf {
    golden().join("tiny-gpt2")
}

pub fn attnscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_attnscope"))
}

/// How the page shows a payload token (explorer.js `tokenLabel`): its label, and a label of
/// nothing but spaces as `␣`.
pub fn label(token: &Value) -> String {
    let label = token["label"].as_str().unwrap();
    if label.trim().is_empty() {
        "␣".to_string()
    } else {
        label.to_string()
    }
}

/// The JSON inside `<script type="application/json" id="attnscope-data">`.
pub fn embedded_data(page: &str) -> Value {
    let start = page
        .find("id=\"attnscope-data\"")
        .expect("page has no data element");
    let open = start + page[start..].find('>').unwrap() + 1;
    let close = open + page[open..].find("</script>").unwrap();
    serde_json::from_str(&page[open..close]).expect("embedded data is not JSON")
}

/// The weights of a payload, unpacked as the page does: base64, zlib, then LEB128 varint
/// tokens (`2v`: a weight of v thousandths; `2r + 1`: r zeros), / scale.
pub fn unpack_weights(data: &Value) -> Vec<f32> {
    unpack_matrix(data, data["weights"].as_str().unwrap())
}

/// A packed matrix of a payload (its weights, rollout or a measure), unpacked as the page does.
pub fn unpack_matrix(data: &Value, packed: &str) -> Vec<f32> {
    let compressed = BASE64.decode(packed).unwrap();
    let mut bytes = Vec::new();
    flate2::read::ZlibDecoder::new(&compressed[..])
        .read_to_end(&mut bytes)
        .unwrap();
    let scale = data["weight_scale"].as_f64().unwrap() as f32;
    let mut values = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let (mut token, mut shift) = (0u64, 0);
        loop {
            let byte = bytes[i];
            i += 1;
            token |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte < 0x80 {
                break;
            }
        }
        if token & 1 == 1 {
            values.extend(std::iter::repeat_n(0.0, (token >> 1) as usize));
        } else {
            values.push((token >> 1) as f32 / scale);
        }
    }
    values
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// A POST with a JSON (or any) body; returns the status and the body text.
pub fn post(url: &str, body: &str) -> (u16, String) {
    match agent()
        .post(url)
        .header("content-type", "application/json")
        .send(body)
    {
        Ok(mut response) => (
            response.status().as_u16(),
            response
                .body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .unwrap(),
        ),
        Err(err) => panic!("POST {url} failed: {err}"),
    }
}

pub fn get(url: &str) -> (u16, String, Option<String>) {
    let mut response = agent()
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let csp = response
        .headers()
        .get("content-security-policy")
        .map(|v| v.to_str().unwrap().to_string());
    let body = response.body_mut().read_to_string().unwrap();
    (response.status().as_u16(), body, csp)
}

/// `attnscope serve --port 0` on the tiny model; killed on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT/`
    pub url: String,
}

impl Server {
    pub fn start(model: &Path) -> Server {
        Server::start_with(model, &[])
    }

    /// `attnscope serve` with `extra` arguments.
    pub fn start_with(model: &Path, extra: &[&str]) -> Server {
        let mut child = attnscope()
            .args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot start attnscope serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Server { child, url }
    }

    pub fn api(&self) -> String {
        format!("{}api/attention", self.url)
    }

    /// Whether the process is still running (it must survive every request).
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One headless Chromium session behind chromedriver; both end on drop.
pub struct Browser {
    driver: Child,
    session: String,
    base: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

/// WebDriver's code points for keys (<https://www.w3.org/TR/webdriver2/#keyboard-actions>).
pub const KEY_ENTER: &str = "\u{e007}";
pub const KEY_ESCAPE: &str = "\u{e00c}";
pub const KEY_RIGHT: &str = "\u{e014}";
pub const KEY_DOWN: &str = "\u{e015}";

impl Browser {
    pub fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start chromedriver: install the Debian packages chromium and chromium-driver");
        let base = format!("http://127.0.0.1:{port}");
        let agent = agent();
        let started = Instant::now();
        while agent.get(format!("{base}/status")).call().is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Browser {
            driver,
            session: String::new(),
            base,
            agent,
            _profile: profile,
        };
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
        ]
        .map(String::from)
        .into_iter()
        .chain([format!(
            "--user-data-dir={}",
            browser._profile.path().display()
        )])
        .collect::<Vec<_>>();
        let binary = std::env::var("CHROME_BIN").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let answer = browser.call(
            "POST",
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "unhandledPromptBehavior": "ignore",
                "goog:chromeOptions": {"binary": binary, "args": args}
            }}})),
        );
        browser.session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        browser
    }

    /// One WebDriver command; returns `value` (an error object for a failed command).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{}", self.base, path);
        let response = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or(json!({})).to_string()),
        };
        let text = response
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        value["value"].clone()
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{}", self.session, rest)
    }

    pub fn goto(&self, url: &str) {
        self.call(
            "POST",
            &self.session_path("/url"),
            Some(json!({ "url": url })),
        );
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its result.
    pub fn exec(&self, script: &str, args: Value) -> Value {
        let value = self.call(
            "POST",
            &self.session_path("/execute/sync"),
            Some(json!({ "script": script, "args": args })),
        );
        if let Some(error) = value.get("error") {
            panic!("script failed: {error}: {}", value["message"]);
        }
        value
    }

    /// Polls `condition` (a JS expression) until it is true; false after `timeout`.
    pub fn wait_for(&self, condition: &str, timeout: Duration) -> bool {
        let started = Instant::now();
        loop {
            if self.exec(&format!("return !!({condition});"), json!([])) == json!(true) {
                return true;
            }
            if started.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the page says it is done (`ready`, `error` or `idle`) and returns that.
    pub fn settled_state(&self) -> String {
        let done = ["ready", "error", "idle"]
            .map(|s| format!("document.body.dataset.state === '{s}'"))
            .join(" || ");
        assert!(
            self.wait_for(&done, Duration::from_secs(30)),
            "the page never settled: state {}",
            self.exec("return document.body.dataset.state;", json!([]))
        );
        self.exec("return document.body.dataset.state;", json!([]))
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Waits for the page to settle and fails with the page's error message unless it is ready.
    pub fn expect_ready(&self) {
        let state = self.settled_state();
        if state != "ready" {
            let message = self.exec(
                "return document.getElementById('error').textContent;",
                json!([]),
            );
            panic!("the page is {state:?}, not ready: {message}");
        }
    }

    fn element(&self, css: &str) -> String {
        let value = self.call(
            "POST",
            &self.session_path("/element"),
            Some(json!({"using": "css selector", "value": css})),
        );
        value[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {value}"))
            .to_string()
    }

    /// Types `text` into the element, as a user would.
    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.call(
            "POST",
            &self.session_path(&format!("/element/{id}/clear")),
            None,
        );
        self.call(
            "POST",
            &self.session_path(&format!("/element/{id}/value")),
            Some(json!({ "text": text })),
        );
    }

    pub fn click(&self, css: &str) {
        let id = self.element(css);
        let value = self.call(
            "POST",
            &self.session_path(&format!("/element/{id}/click")),
            None,
        );
        assert!(value.is_null(), "click on {css} failed: {value}");
    }

    /// Sends `keys` to the element, as a user typing on it would: it takes focus first. Keys
    /// past the keyboard's letters are WebDriver's code points ([`KEY_DOWN`] and the others).
    pub fn press(&self, css: &str, keys: &str) {
        let id = self.element(css);
        let value = self.call(
            "POST",
            &self.session_path(&format!("/element/{id}/value")),
            Some(json!({ "text": keys })),
        );
        assert!(value.is_null(), "keys on {css} failed: {value}");
    }

    /// The text of an open `alert()`, if one is open.
    pub fn alert_text(&self) -> Option<String> {
        let value = self.call("GET", &self.session_path("/alert/text"), None);
        value.as_str().map(str::to_string)
    }

    pub fn dismiss_alert(&self) {
        self.call("POST", &self.session_path("/alert/dismiss"), None);
    }

    /// A PNG of the window, into `dir` (and into `$ATTNSCOPE_SCREENSHOTS` when set, to look at).
    pub fn screenshot(&self, dir: &Path, name: &str) -> PathBuf {
        let value = self.call("GET", &self.session_path("/screenshot"), None);
        let png = BASE64.decode(value.as_str().unwrap()).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        if let Ok(keep) = std::env::var("ATTNSCOPE_SCREENSHOTS") {
            std::fs::write(Path::new(&keep).join(name), &png).unwrap();
        }
        let path = dir.join(name);
        std::fs::write(&path, &png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = self.session_path("");
            let _ = self.agent.delete(format!("{}{}", self.base, path)).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
