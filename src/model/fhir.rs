//! The subset of FHIR R4 `DocumentReference` the worker reads (serde).
//!
//! Unknown fields are tolerated (FHIR resources carry many extensions); fields the worker reads are typed, so a
//! wrong JSON type is reported with its path (`content[0].attachment.size`) and never with its value. Everything
//! is optional at this level: what is required is decided in `stages::decode`, with a code per rule.

use serde::{Deserialize, Deserializer};

/// Just enough of any resource to route it: `resourceType` alone.
#[derive(Debug, Deserialize)]
pub struct Probe<'a> {
    #[serde(rename = "resourceType", borrow)]
    pub resource_type: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentReference {
    pub resource_type: Option<String>,
    pub id: Option<String>,
    pub meta: Option<Meta>,
    pub status: Option<String>,
    pub doc_status: Option<String>,
    #[serde(rename = "type")]
    pub type_: Option<CodeableConcept>,
    #[serde(default)]
    pub category: Vec<CodeableConcept>,
    pub subject: Option<Reference>,
    pub context: Option<Context>,
    pub date: Option<String>,
    #[serde(default)]
    pub author: Vec<Reference>,
    #[serde(default)]
    pub relates_to: Vec<RelatesTo>,
    #[serde(default)]
    pub content: Vec<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub version_id: Option<String>,
    pub last_updated: Option<String>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
pub struct Coding {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Default)]
pub struct CodeableConcept {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coding: Vec<Coding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Reference {
    pub reference: Option<String>,
    pub display: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Context {
    #[serde(default)]
    pub encounter: Vec<Reference>,
    pub period: Option<Period>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
pub struct Period {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct RelatesTo {
    pub code: Option<String>,
    pub target: Option<Reference>,
}

#[derive(Debug, Deserialize)]
pub struct Content {
    pub attachment: Option<Attachment>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    pub content_type: Option<String>,
    pub language: Option<String>,
    pub data: Option<String>,
    pub url: Option<String>,
    /// R4 `unsignedInt`; R5 made it `integer64`, which JSON carries as a string. Both are accepted.
    #[serde(default, deserialize_with = "size_number_or_string")]
    pub size: Option<u64>,
    pub hash: Option<String>,
    pub title: Option<String>,
}

fn size_number_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Number(u64),
        Text(String),
    }
    match Option::<Size>::deserialize(d)? {
        None => Ok(None),
        Some(Size::Number(n)) => Ok(Some(n)),
        Some(Size::Text(s)) => {
            s.parse::<u64>().map(Some).map_err(|_| serde::de::Error::custom("size is not a non-negative integer"))
        }
    }
}

/// A FHIR Bundle, with each entry's resource kept as raw JSON (so a source can hand it on as one event).
#[derive(Debug, Deserialize)]
pub struct Bundle<'a> {
    #[serde(default, borrow)]
    pub entry: Vec<BundleEntry<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct BundleEntry<'a> {
    #[serde(borrow)]
    pub resource: Option<&'a serde_json::value::RawValue>,
}
