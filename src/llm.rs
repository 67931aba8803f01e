//! The LLM client: one OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's `llama-server`, Ollama,
//! hosted services) for the generative steps.
//!
//! In: `llm.*` (base URL, model, API key as a secret, timeout, retries, concurrency limit) and the messages. Out:
//! the completion's text and token counts, or an `LlmError` the routes map to a status: `Unavailable` 503 (the
//! endpoint cannot be reached, or answered 429/5xx through every retry, or every permit stayed taken), `Timeout`
//! 504 (no answer within `llm.timeout_ms`, permit wait and retries included), `Failed` 502 (refused or answered
//! something unusable).
//!
//! At most `llm.max_concurrent` calls at once per process; retries on connection errors, 429 and 5xx with the one
//! `Backoff`, all inside the one deadline. The query service calls it for answers; a worker only for RAPTOR's
//! abstractive summaries (`raptor.abstractive`), in the background after a note is acknowledged, so a slow or
//! down LLM never holds a note. Prompts and completions are never logged; errors name the status, never the
//! content.

use std::time::Duration;

use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::config::LlmSettings;
use crate::fhir::HttpClient;
use crate::query::answer::Message;

/// The largest completion body read.
const MAX_BODY: usize = 4 << 20;

/// Why no completion came back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    #[error("the LLM endpoint is unavailable: {0}")]
    Unavailable(String),
    #[error("the LLM did not answer within llm.timeout_ms")]
    Timeout,
    #[error("the LLM endpoint failed: {0}")]
    Failed(String),
}

/// A completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub content: String,
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The configured endpoint.
pub struct Llm {
    client: HttpClient,
    url: Uri,
    model: String,
    key: Option<HeaderValue>,
    timeout: Duration,
    retries: u32,
    retry_initial: Duration,
    permits: Semaphore,
    max_tokens: u32,
    temperature: f32,
}

impl std::fmt::Debug for Llm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llm").field("model", &self.model).finish_non_exhaustive()
    }
}

impl Llm {
    /// The client for `llm.*`; `None` when no endpoint is configured.
    pub fn new(s: &LlmSettings) -> Result<Option<Llm>, String> {
        let base = s.base_url.trim().trim_end_matches('/');
        if base.is_empty() {
            return Ok(None);
        }
        let url = Uri::try_from(format!("{base}/chat/completions"))
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some())
            .ok_or("llm.base_url: must be an http(s) URL (e.g. http://127.0.0.1:8081/v1)")?;
        let key = match s.api_key.expose() {
            "" => None,
            k => Some(
                HeaderValue::try_from(format!("Bearer {k}"))
                    .map_err(|_| "llm.api_key: not a valid header value".to_string())?,
            ),
        };
        if s.max_concurrent == 0 || s.timeout_ms == 0 || s.max_tokens == 0 {
            return Err("llm.max_concurrent, llm.timeout_ms, llm.max_tokens: must be at least 1".into());
        }
        Ok(Some(Llm {
            client: crate::fhir::http_client().map_err(|e| format!("llm: {e}"))?,
            url,
            model: s.model.clone(),
            key,
            timeout: Duration::from_millis(s.timeout_ms),
            retries: s.max_retries,
            retry_initial: Duration::from_millis(s.retry_initial_ms.max(1)),
            permits: Semaphore::new(s.max_concurrent),
            max_tokens: s.max_tokens,
            temperature: s.temperature,
        }))
    }

    /// Everything one generation may take (`llm.timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One chat completion; with `schema`, the answer is asked for as JSON following it (`response_format`).
    pub async fn chat(&self, messages: &[Message], schema: Option<&Value>) -> Result<Completion, LlmError> {
        let deadline = Instant::now() + self.timeout;
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": false,
        });
        if let Some(schema) = schema {
            body["response_format"] =
                json!({"type": "json_schema", "json_schema": {"name": "answer", "strict": true, "schema": schema}});
        }
        let body = Bytes::from(serde_json::to_vec(&body).map_err(|e| LlmError::Failed(e.to_string()))?);
        let _permit = match tokio::time::timeout_at(deadline, self.permits.acquire()).await {
            Ok(p) => p.map_err(|_| LlmError::Unavailable("closed".into()))?,
            Err(_) => return Err(LlmError::Unavailable("every llm.max_concurrent slot stayed busy".into())),
        };
        let mut backoff = Backoff::new(self.retry_initial, self.timeout, self.timeout);
        let mut attempt = 0;
        loop {
            let why = match tokio::time::timeout_at(deadline, self.attempt(body.clone())).await {
                Err(_) => return Err(LlmError::Timeout),
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(Attempt::Fail(e))) => return Err(e),
                Ok(Err(Attempt::Retry(why))) => why,
            };
            attempt += 1;
            let Some(delay) = backoff.failed().filter(|_| attempt <= self.retries) else {
                return Err(LlmError::Unavailable(why));
            };
            if Instant::now() + delay >= deadline {
                return Err(LlmError::Unavailable(why));
            }
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(&self, body: Bytes) -> Result<Completion, Attempt> {
        let mut request = Request::post(self.url.clone()).header(CONTENT_TYPE, "application/json");
        if let Some(k) = &self.key {
            request = request.header(AUTHORIZATION, k.clone());
        }
        let request = request.body(Full::new(body)).map_err(|_| Attempt::Fail(LlmError::Failed("request".into())))?;
        let response = self.client.request(request).await.map_err(|e| {
            Attempt::Retry(if e.is_connect() { "connection failed".into() } else { "connection dropped".into() })
        })?;
        let status = response.status();
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(Attempt::Retry(format!("answered {}", status.as_u16())));
        }
        if !status.is_success() {
            return Err(Attempt::Fail(LlmError::Failed(format!("answered {}", status.as_u16()))));
        }
        let bytes = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|_| Attempt::Retry("the answer could not be read".into()))?
            .to_bytes();
        #[derive(Deserialize)]
        struct Usage {
            #[serde(default)]
            prompt_tokens: u64,
            #[serde(default)]
            completion_tokens: u64,
        }
        #[derive(Deserialize)]
        struct ChoiceMessage {
            #[serde(default)]
            content: Option<String>,
        }
        #[derive(Deserialize)]
        struct Choice {
            message: ChoiceMessage,
        }
        #[derive(Deserialize)]
        struct Response {
            #[serde(default)]
            model: String,
            choices: Vec<Choice>,
            #[serde(default)]
            usage: Option<Usage>,
        }
        let r: Response = serde_json::from_slice(&bytes)
            .map_err(|_| Attempt::Fail(LlmError::Failed("the answer is not a chat completion".into())))?;
        let content = r
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .ok_or(Attempt::Fail(LlmError::Failed("the answer holds no message".into())))?;
        let usage = r.usage.unwrap_or(Usage { prompt_tokens: 0, completion_tokens: 0 });
        Ok(Completion {
            content,
            model: if r.model.is_empty() { self.model.clone() } else { r.model },
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        })
    }
}

enum Attempt {
    Retry(String),
    Fail(LlmError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> LlmSettings {
        let mut s = crate::config::Settings::load_from(None, Some(Default::default())).unwrap().llm;
        s.base_url = url.into();
        s
    }

    #[test]
    fn no_endpoint_is_off_and_a_bad_one_is_refused() {
        assert!(Llm::new(&settings("")).unwrap().is_none());
        assert!(Llm::new(&settings("ftp://x/v1")).is_err());
        let llm = Llm::new(&settings("http://127.0.0.1:8081/v1/")).unwrap().unwrap();
        assert_eq!(llm.url.to_string(), "http://127.0.0.1:8081/v1/chat/completions");
    }

    #[tokio::test]
    async fn an_endpoint_nobody_listens_on_is_unavailable_within_the_deadline() {
        // Port 1 on loopback: privileged, nothing listens there.
        let mut s = settings("http://127.0.0.1:1/v1");
        s.max_retries = 2;
        s.retry_initial_ms = 10;
        s.timeout_ms = 5_000;
        let llm = Llm::new(&s).unwrap().unwrap();
        let m = [Message { role: "user".into(), content: "q".into() }];
        assert!(matches!(llm.chat(&m, None).await, Err(LlmError::Unavailable(_))));
    }
}
