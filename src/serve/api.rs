//! The query service's OpenAPI document (`openapi()`, written to docs/openapi.json by `clinstream openapi`; a
//! test keeps the file current), generated from the read side's request and response types (`query::api`,
//! re-exported here), and the service's error body.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

pub use crate::query::api::*;
use crate::query::reader::limits;

/// Every error body: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// `bad_request`, `unauthorized`, `forbidden`, `payload_too_large`, `unsupported_media_type`, `not_ready`,
    /// `auth_unavailable`, `audit_unavailable`, `store_unavailable`, `store_failed`, `embed_failed`, `timeout`,
    /// `not_found`, `method_not_allowed`, and for answers `llm_not_configured`, `llm_unavailable`, `llm_timeout`,
    /// `llm_failed`.
    pub code: String,
    /// Names the field or limit; never echoes request values.
    pub message: String,
}

/// The OpenAPI 3.0 document of the service with the built-in limits (`serve.*` defaults): docs/openapi.json.
pub fn openapi() -> Value {
    let defaults =
        crate::config::Settings::load_from(None, Some(Default::default())).expect("the built-in configuration loads");
    openapi_for(&defaults.serve)
}

/// The OpenAPI 3.0 document of the service, generated from these types, with the limits the server enforces
/// (`query::reader::limits`: the budget and `top` ranges of these settings, text that may not be blank, days) stated
/// on the fields they hold for.
pub fn openapi_for(settings: &crate::config::ServeSettings) -> Value {
    let mut doc = openapi_types();
    let schemas = &mut doc["components"]["schemas"];
    let (budget, top) = (limits::budget_tokens(settings), limits::top(settings));
    let mut set = |schema: &str, field: &str, rules: Value| {
        if let (Some(property), Some(rules)) = (schemas[schema]["properties"][field].as_object_mut(), rules.as_object())
        {
            property.extend(rules.clone());
        }
    };
    set("ContextRequest", "budget_tokens", json!({"minimum": budget.start(), "maximum": budget.end()}));
    set("SearchRequest", "top", json!({"minimum": top.start(), "maximum": top.end()}));
    set("ContextRequest", "compress", json!({"minimum": 0.0, "exclusiveMinimum": true, "maximum": 1.0}));
    for (schema, field) in [("ContextRequest", "patient"), ("ContextRequest", "question"), ("SearchRequest", "query")] {
        set(schema, field, json!({"minLength": 1, "pattern": limits::NOT_BLANK}));
    }
    set("SearchRequest", "patient", json!({"minLength": 1, "pattern": limits::NOT_BLANK}));
    for schema in ["ContextRequest", "SearchRequest"] {
        for field in ["since", "until"] {
            set(schema, field, json!({"pattern": limits::DAY}));
        }
    }
    doc
}

fn openapi_types() -> Value {
    let mut generator = schemars::r#gen::SchemaSettings::openapi3().into_generator();
    // Each body type (and what it refers to) lands in the generator's definitions: `#/components/schemas/…`.
    generator.subschema_for::<ContextRequest>();
    generator.subschema_for::<ContextResponse>();
    generator.subschema_for::<SearchRequest>();
    generator.subschema_for::<SearchResponse>();
    generator.subschema_for::<AnswerResponse>();
    generator.subschema_for::<ErrorBody>();
    let components: Map<String, Value> = generator
        .take_definitions()
        .into_iter()
        .map(|(k, v)| (k, serde_json::to_value(v).unwrap_or_default()))
        .collect();
    let error = |what: &str| json!({"description": what, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}});
    let post = |summary: &str, req: &str, resp: &str| {
        json!({"post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "parameters": [{
                "name": "X-Request-Id", "in": "header", "required": false,
                "description": "Recorded in the request's audit record and answered back; another id is made when absent or not 1-64 letters, digits, '-' or '.'",
                "schema": {"type": "string"}
            }],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{req}")}}}},
            "responses": {
                "200": {
                    "description": "OK",
                    "headers": {"Server-Timing": {
                        "description": "Where the request's time went, in milliseconds: `total` (in the service, before its audit record); /v1/answer also `context`, `generate` (its own work) and `llm` (the endpoint's)",
                        "schema": {"type": "string"}
                    }},
                    "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{resp}")}}}
                },
                "400": error("Malformed request, unknown field, or a value past a limit"),
                "401": error("No credentials, an unknown key, or a token that is invalid, expired, or for another audience or issuer"),
                "403": error("The caller may not query that patient (the same answer whether the patient exists or not)"),
                "413": error("Body larger than serve.max_body_bytes"),
                "405": error("Not POST"),
                "415": error("Body is not application/json"),
                "503": error("Not ready, the identity provider's keys or the vector store unavailable, or the request's audit record not delivered (retry later)"),
                "504": error("Not answered within serve.timeout_ms"),
            }
        }})
    };
    // The generative step: the context's request, one more way to fail at the LLM.
    let mut answer = post(
        "The CLEAR context for a question about one patient, then one generation by the configured LLM over it: the answer with citations to the context's passages",
        "ContextRequest",
        "AnswerResponse",
    );
    if let Some(responses) = answer["post"]["responses"].as_object_mut() {
        responses.insert("501".into(), error("No LLM is configured (llm.base_url)"));
        responses.insert("502".into(), error("The LLM endpoint failed or answered something unusable"));
        responses.insert("503".into(), error("Not ready, the identity provider's keys, the vector store or the LLM endpoint unavailable, or the request's audit record not delivered (retry later)"));
        responses.insert("504".into(), error("Not answered within serve.timeout_ms + llm.timeout_ms"));
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "clinstream query service",
            "version": crate::WORKER_VERSION,
            "description": "CLEAR context and hybrid search over the notes clinstream workers stored. Generated from the code by `clinstream openapi`."
        },
        "paths": {
            "/v1/context": post("The evidence for a clinical question about one patient, inside a token budget, and the answer it supports", "ContextRequest", "ContextResponse"),
            "/v1/answer": answer,
            "/v1/search": post("Hybrid (dense + BM25, RRF) search over stored chunks with filters and neighbour expansion", "SearchRequest", "SearchResponse"),
            "/healthz": {"get": {"summary": "Alive", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Ready: label index built, store reachable", "security": [], "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": {"description": "text exposition"}}}}
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "A static key of serve.api_keys (every patient), or a JWT access token from serve.oidc.issuer whose SMART scopes and patient claims say which patients it may query"}}
        },
        "security": [{"bearer": []}]
    })
}
