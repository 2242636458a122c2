//! `/json`: a `RateLimitRequest` and its `RateLimitResponse` in protobuf's JSON mapping (camelCase
//! names, enums by name, durations as `"1.5s"`, default values left out), as envoyproxy/ratelimit's
//! endpoint takes and gives them.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Map, Value};

fn field<'a>(obj: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    obj.get(camel).or_else(|| obj.get(snake))
}

fn uint(v: &Value, what: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{what}: expected an unsigned integer, got {n}")),
        Value::String(s) => s
            .parse()
            .map_err(|_| format!("{what}: expected an unsigned integer, got \"{s}\"")),
        other => Err(format!("{what}: expected an unsigned integer, got {other}")),
    }
}

fn string(v: &Value, what: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what}: expected a string, got {v}"))
}

pub fn request_from_json(body: &[u8]) -> Result<RateLimitRequest, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let obj = value.as_object().ok_or("the body must be a JSON object")?;
    let mut req = RateLimitRequest::default();
    if let Some(d) = obj.get("domain") {
        req.domain = string(d, "domain")?;
    }
    if let Some(h) = field(obj, "hitsAddend", "hits_addend") {
        let h = uint(h, "hitsAddend")?;
        req.hits_addend =
            u32::try_from(h).map_err(|_| format!("hitsAddend: {h} is above {}", u32::MAX))?;
    }
    if let Some(ds) = obj.get("descriptors") {
        let ds = ds.as_array().ok_or("descriptors: expected a list")?;
        for (i, d) in ds.iter().enumerate() {
            let d = d
                .as_object()
                .ok_or_else(|| format!("descriptors[{i}]: expected an object"))?;
            let mut descriptor = RateLimitDescriptor::default();
            if let Some(es) = d.get("entries") {
                let es = es
                    .as_array()
                    .ok_or_else(|| format!("descriptors[{i}].entries: expected a list"))?;
                for (j, e) in es.iter().enumerate() {
                    let what = format!("descriptors[{i}].entries[{j}]");
                    let e = e
                        .as_object()
                        .ok_or_else(|| format!("{what}: expected an object"))?;
                    descriptor.entries.push(Entry {
                        key: e
                            .get("key")
                            .map(|k| string(k, &format!("{what}.key")))
                            .transpose()?
                            .unwrap_or_default(),
                        value: e
                            .get("value")
                            .map(|v| string(v, &format!("{what}.value")))
                            .transpose()?
                            .unwrap_or_default(),
                    });
                }
            }
            if let Some(h) = field(d, "hitsAddend", "hits_addend") {
                descriptor.hits_addend = Some(UInt64Value {
                    value: uint(h, &format!("descriptors[{i}].hitsAddend"))?,
                });
            }
            if let Some(l) = d.get("limit") {
                let what = format!("descriptors[{i}].limit");
                let l = l
                    .as_object()
                    .ok_or_else(|| format!("{what}: expected an object"))?;
                let rpu = field(l, "requestsPerUnit", "requests_per_unit")
                    .map(|v| uint(v, &format!("{what}.requestsPerUnit")))
                    .transpose()?
                    .unwrap_or(0);
                let unit = match l.get("unit") {
                    None => 0,
                    Some(Value::String(s)) => PbUnit::from_str_name(s)
                        .map(|u| u as i32)
                        .ok_or_else(|| format!("{what}.unit: unknown unit \"{s}\""))?,
                    Some(v) => uint(v, &format!("{what}.unit"))? as i32,
                };
                descriptor.limit = Some(RateLimitOverride {
                    requests_per_unit: u32::try_from(rpu).map_err(|_| {
                        format!("{what}.requestsPerUnit: {rpu} is above {}", u32::MAX)
                    })?,
                    unit,
                });
            }
            req.descriptors.push(descriptor);
        }
    }
    Ok(req)
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code)
        .map(|c| c.as_str_name())
        .unwrap_or("UNKNOWN")
}

pub fn response_to_json(r: &RateLimitResponse) -> String {
    let mut out = Map::new();
    out.insert("overallCode".into(), code_name(r.overall_code).into());
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), code_name(s.code).into());
            if let Some(l) = &s.current_limit {
                let mut lm = Map::new();
                if !l.name.is_empty() {
                    lm.insert("name".into(), l.name.clone().into());
                }
                if l.requests_per_unit != 0 {
                    lm.insert("requestsPerUnit".into(), l.requests_per_unit.into());
                }
                lm.insert(
                    "unit".into(),
                    PbUnit::try_from(l.unit)
                        .map(|u| u.as_str_name())
                        .unwrap_or("UNKNOWN")
                        .into(),
                );
                m.insert("currentLimit".into(), Value::Object(lm));
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), s.limit_remaining.into());
            }
            if let Some(d) = &s.duration_until_reset {
                let text = if d.nanos == 0 {
                    format!("{}s", d.seconds)
                } else {
                    format!("{}.{:03}s", d.seconds, d.nanos / 1_000_000)
                };
                m.insert("durationUntilReset".into(), text.into());
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            r.response_headers_to_add
                .iter()
                .map(|h| json!({"key": h.key, "value": h.value}))
                .collect(),
        );
    }
    Value::Object(out).to_string()
}
