//! A real LLM behind an OpenAI-compatible server for the tests: llama.cpp's `llama-server` with SmolLM2-135M
//! (`tools/llm/build.sh`, run by `make tools`, puts both in `~/.cache/clinstream/llm` or `LLM_DIR`), started per
//! test on a free loopback port; or, with `CLINSTREAM_TEST_LLM_URL` (and `CLINSTREAM_TEST_LLM_MODEL`,
//! `CLINSTREAM_TEST_LLM_KEY`), a production endpoint. Without either the tests say SKIPPED — unless
//! `CLINSTREAM_REQUIRE_LLM=1` (set by `make test`), where that is a failure.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One endpoint: its base URL (`…/v1`), model and key.
pub struct LlmServer {
    child: Option<Child>,
    pub url: String,
    pub port: u16,
    pub model: String,
    pub key: String,
}

fn dir() -> PathBuf {
    std::env::var_os("LLM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/clinstream/llm"))
}

impl LlmServer {
    pub fn start() -> Option<LlmServer> {
        if let Ok(url) = std::env::var("CLINSTREAM_TEST_LLM_URL") {
            let port = url.split(':').nth(2).and_then(|p| p.split('/').next()?.parse().ok()).unwrap_or(443);
            return Some(LlmServer {
                child: None,
                url,
                port,
                model: std::env::var("CLINSTREAM_TEST_LLM_MODEL").unwrap_or_default(),
                key: std::env::var("CLINSTREAM_TEST_LLM_KEY").unwrap_or_default(),
            });
        }
        let (bin, model) = (dir().join("bin/llama-server"), dir().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
        if !bin.is_file() || !model.is_file() {
            assert!(
                std::env::var("CLINSTREAM_REQUIRE_LLM").as_deref() != Ok("1"),
                "no LLM server: run `make tools` (tools/llm/build.sh) or set CLINSTREAM_TEST_LLM_URL"
            );
            eprintln!("SKIPPED: no LLM server (run `make tools`, or set CLINSTREAM_TEST_LLM_URL)");
            return None;
        }
        let port = super::free_port();
        let child = Command::new(bin)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-c", "8192", "-np", "2"])
            // One compute thread, never spinning: every test of a binary runs its own server beside the others on a
            // 2-core machine, and ggml's spin-waiting threads of several servers starve each other (a request that
            // takes a second alone took minutes under `make test`).
            .args(["-t", "1", "-tb", "1", "--poll", "0", "--threads-http", "2"])
            .args(["--no-webui", "--log-disable"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server runs");
        let server = LlmServer {
            child: Some(child),
            url: format!("http://127.0.0.1:{port}/v1"),
            port,
            model: "SmolLM2-135M-Instruct".into(),
            key: String::new(),
        };
        super::wait_until(Duration::from_secs(300), "llama-server to load its model", || {
            super::http_get(port, "/health").is_some_and(|(s, _)| s == 200)
        });
        Some(server)
    }

    /// Stops a server this harness started (a production endpoint is left alone).
    pub fn stop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for LlmServer {
    fn drop(&mut self) {
        self.stop();
    }
}
