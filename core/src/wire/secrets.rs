//! `POST …/secrets` (reference §2.6, schema `qinglong/remote-secret-delivery@v2`): one batch of
//! secret values for the revision's references, in memory only.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::{Fence, WireError, bind, ensure, exact, parse_json, require, sealed_body};
use crate::ids::{
    AttemptId, LeaseGeneration, LeaseToken, LeaseVersion, OfferId, ProjectId, RunId, Sha256Digest,
    TaskId, TaskRevision, WorkerGeneration,
};
use crate::offer::Offer;
use crate::revision::{EnvName, EnvValue, SecretRef};

/// Schema id (request and response).
pub const SCHEMA: &str = "qinglong/remote-secret-delivery@v2";
/// `MAX_REMOTE_SECRET_DELIVERY_REQUEST_BYTES` (an explicit opt-in above 4 KiB).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// `MAX_REMOTE_SECRET_DELIVERY_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 256 * 1024;
/// Most secret references per batch.
pub const MAX_SECRET_REFS: usize = 64;
/// Most environment bundle references per batch.
pub const MAX_BUNDLE_REFS: usize = 1;
/// Largest secret value, UTF-8 bytes.
const MAX_VALUE_BYTES: usize = 16 * 1024;
/// Largest total of secret values, UTF-8 bytes.
const MAX_TOTAL_VALUE_BYTES: usize = 64 * 1024;
/// Largest environment bundle value (and total), UTF-8 bytes.
pub(crate) const MAX_BUNDLE_VALUE_BYTES: usize = 96 * 1024;

/// Schema id of an environment bundle's value (`RC/src/secret/environmentBundle.ts`).
pub const BUNDLE_SCHEMA: &str = "qinglong/environment-bundle@v1";
/// Most entries of one environment bundle (and of the whole materialized environment).
pub(crate) const MAX_BUNDLE_ENTRIES: usize = 256;
/// Largest total of a bundle's names and values (and of the whole materialized environment).
pub(crate) const MAX_BUNDLE_TOTAL_BYTES: usize = 64 * 1024;

/// The secrets request. Built from the offer; the references are the revision's secret
/// bindings, de-duplicated in revision order, and its environment bundle reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretsRequest {
    /// The execution fence.
    pub fence: Fence,
    /// Task.
    pub task_id: TaskId,
    /// Task revision.
    pub task_revision: TaskRevision,
    /// The offer's execution digest.
    pub execution_digest: Sha256Digest,
    /// ≤ 64 unique references of the project.
    pub secret_refs: Vec<SecretRef>,
    /// ≤ 1 bundle reference, disjoint from `secret_refs`.
    pub environment_bundle_refs: Vec<SecretRef>,
}

impl SecretsRequest {
    /// The batch for `offer`; `Ok(None)` when the revision references no secret at all.
    ///
    /// # Errors
    /// [`WireError::Request`] above 64 references, or a reference of another project, or
    /// overlapping roles.
    pub fn from_offer(offer: &Offer) -> Result<Option<Self>, WireError> {
        let revision = &offer.execution_revision;
        let mut secret_refs: Vec<SecretRef> = Vec::new();
        for binding in &revision.environment {
            if let EnvValue::Secret(reference) = &binding.value
                && !secret_refs.contains(reference)
            {
                secret_refs.push(reference.clone());
            }
        }
        let environment_bundle_refs: Vec<SecretRef> =
            revision.environment_bundle_ref.iter().cloned().collect();
        if secret_refs.is_empty() && environment_bundle_refs.is_empty() {
            return Ok(None);
        }
        let request = Self {
            fence: Fence::from_offer(offer),
            task_id: offer.candidate.task_id.clone(),
            task_revision: offer.candidate.task_revision.clone(),
            execution_digest: offer.execution_digest,
            secret_refs,
            environment_bundle_refs,
        };
        request.validate()?;
        Ok(Some(request))
    }

    fn validate(&self) -> Result<(), WireError> {
        require(
            self.secret_refs.len() <= MAX_SECRET_REFS,
            "secretRefs",
            "at most 64 references",
        )?;
        require(
            self.environment_bundle_refs.len() <= MAX_BUNDLE_REFS,
            "environmentBundleRefs",
            "at most 1 reference",
        )?;
        require(
            self.secret_refs.len() + self.environment_bundle_refs.len() >= 1,
            "secretRefs",
            "at least one reference in total",
        )?;
        let project: &ProjectId = &self.fence.project_id;
        require(
            self.secret_refs
                .iter()
                .chain(&self.environment_bundle_refs)
                .all(|r| r.project_id() == project.as_str()),
            "secretRefs",
            "references of the fence's project",
        )?;
        require(
            crate::revision::unique_by(&self.secret_refs, |r| r),
            "secretRefs",
            "unique",
        )?;
        require(
            self.secret_refs
                .iter()
                .all(|r| !self.environment_bundle_refs.contains(r)),
            "environmentBundleRefs",
            "disjoint from secretRefs",
        )
    }

    /// The request body (≤ 64 KiB); carries the lease token, so it is wiped on drop.
    ///
    /// # Errors
    /// [`WireError::RequestTooLarge`] above 64 KiB, [`WireError::Request`] for invalid refs.
    pub fn to_body(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct View<'a> {
            schema: &'static str,
            worker_generation: WorkerGeneration,
            run_id: &'a RunId,
            attempt_id: &'a AttemptId,
            project_id: &'a ProjectId,
            task_id: &'a TaskId,
            task_revision: &'a TaskRevision,
            execution_digest: &'a Sha256Digest,
            offer_id: &'a OfferId,
            lease_generation: LeaseGeneration,
            #[serde(serialize_with = "super::token_slot")]
            lease_token: &'a LeaseToken,
            expected_lease_version: LeaseVersion,
            secret_refs: &'a [SecretRef],
            environment_bundle_refs: &'a [SecretRef],
        }
        self.validate()?;
        let f = &self.fence;
        let view = View {
            schema: SCHEMA,
            worker_generation: f.worker_generation,
            run_id: &f.run_id,
            attempt_id: &f.attempt_id,
            project_id: &f.project_id,
            task_id: &self.task_id,
            task_revision: &self.task_revision,
            execution_digest: &self.execution_digest,
            offer_id: &f.offer_id,
            lease_generation: f.lease_generation,
            lease_token: &f.lease_token,
            expected_lease_version: f.expected_lease_version,
            secret_refs: &self.secret_refs,
            environment_bundle_refs: &self.environment_bundle_refs,
        };
        sealed_body(&view, &f.lease_token, "secrets", MAX_REQUEST_BYTES)
    }
}

/// A secret value: the core's one secret-string type ([`crate::secret::SecretString`]: wiped on
/// drop, `Debug` redacted, constant-time equality, redacted in JSON). Only `expose` reveals it.
pub use crate::secret::SecretString as SecretValue;

/// One resolved reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedSecret {
    /// The requested reference (same position as requested).
    pub secret_ref: SecretRef,
    /// Its value.
    pub value: SecretValue,
}

/// A parsed secrets response, bound 1:1 and in order to the request's references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretsResponse {
    /// `values[i]` resolves `request.secret_refs[i]`.
    pub values: Vec<ResolvedSecret>,
    /// `environment_bundles[i]` resolves `request.environment_bundle_refs[i]`.
    pub environment_bundles: Vec<ResolvedSecret>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResponseWire {
    schema: String,
    run_id: String,
    attempt_id: String,
    offer_id: String,
    execution_digest: String,
    values: Vec<ValueWire>,
    environment_bundles: Vec<ValueWire>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ValueWire {
    secret_ref: String,
    value: SecretValue,
}

fn bind_values(
    wire: Vec<ValueWire>,
    expected: &[SecretRef],
    max_value: usize,
    max_total: usize,
    path: &'static str,
) -> Result<Vec<ResolvedSecret>, WireError> {
    ensure(
        wire.len() == expected.len(),
        path,
        "one value per requested reference",
    )?;
    let mut total = 0usize;
    let mut out = Vec::with_capacity(wire.len());
    for (item, reference) in wire.into_iter().zip(expected) {
        bind(
            item.secret_ref == reference.as_str(),
            path,
            "the requested references, in request order",
        )?;
        let value = item.value.expose();
        ensure(!value.contains('\0'), path, "values without NUL")?;
        ensure(
            value.len() <= max_value,
            path,
            "values within their byte cap",
        )?;
        total += value.len();
        ensure(
            total <= max_total,
            path,
            "values within their total byte cap",
        )?;
        out.push(ResolvedSecret {
            secret_ref: reference.clone(),
            value: item.value,
        });
    }
    Ok(out)
}

impl SecretsResponse {
    /// Parses strictly (256 KiB cap first) and binds to `request`: `runId, attemptId, offerId,
    /// executionDigest` equal; values map 1:1 and in order to the requested references; value
    /// ≤ 16 KiB without NUL, total ≤ 64 KiB; bundle ≤ 96 KiB. The caller wipes `bytes`.
    ///
    /// # Errors
    /// [`WireError`]; never echoes a value.
    pub fn parse(bytes: &[u8], request: &SecretsRequest) -> Result<Self, WireError> {
        let wire: ResponseWire = parse_json("secrets", bytes, MAX_RESPONSE_BYTES)?;
        exact(&wire.schema, SCHEMA, "schema")?;
        let f = &request.fence;
        bind_to_request! {
            wire.run_id == f.run_id.as_str() => "runId";
            wire.attempt_id == f.attempt_id.as_str() => "attemptId";
            wire.offer_id == f.offer_id.as_str() => "offerId";
            wire.execution_digest == request.execution_digest.to_hex() => "executionDigest";
        }
        Ok(Self {
            values: bind_values(
                wire.values,
                &request.secret_refs,
                MAX_VALUE_BYTES,
                MAX_TOTAL_VALUE_BYTES,
                "values",
            )?,
            environment_bundles: bind_values(
                wire.environment_bundles,
                &request.environment_bundle_refs,
                MAX_BUNDLE_VALUE_BYTES,
                MAX_BUNDLE_VALUE_BYTES,
                "environmentBundles",
            )?,
        })
    }
}

/// An environment bundle (`qinglong/environment-bundle@v1`): the value the `secrets` endpoint
/// returns for the revision's `environmentBundleRef`, a JSON text of
/// `{"schema","entries":[{"name","value"}]}`, expanded in memory only. Entries are in the
/// reference's normalized order (by name); values are [`SecretValue`]s (redacted, zeroized).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentBundle {
    /// `(name, value)` pairs sorted by name, names unique.
    pub entries: Vec<(EnvName, SecretValue)>,
}

/// Why an environment bundle was refused. Names the rule, never a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// The bundle text is outside `2..=96 KiB`.
    #[error(
        "environment bundle of {len} bytes is outside 2..={max} bytes",
        max = MAX_BUNDLE_VALUE_BYTES
    )]
    Size {
        /// Its length, bytes.
        len: usize,
    },
    /// The text is not JSON of the exact bundle shape.
    #[error("environment bundle JSON rejected: {0}")]
    Json(super::JsonError),
    /// A field breaks its rule.
    #[error("environment bundle field {path} must be {rule}")]
    Field {
        /// The field.
        path: &'static str,
        /// The rule.
        rule: &'static str,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleWire {
    schema: String,
    entries: Vec<BundleEntryWire>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleEntryWire {
    name: String,
    value: SecretValue,
}

impl EnvironmentBundle {
    /// Parses and normalizes a bundle as the reference's `parseEnvironmentBundle`: text of
    /// `2..=96 KiB`; exact keys at both levels (duplicates refused); the schema; 1..=256 entries;
    /// names `^[A-Za-z_][A-Za-z0-9_]{0,127}$`, not `QL3_…`, unique; values without NUL, each
    /// ≤ 16 KiB; names and values together ≤ 64 KiB; sorted by name; the normalized JSON
    /// ≤ 96 KiB.
    ///
    /// # Errors
    /// [`BundleError`] naming the first broken rule.
    pub fn parse(text: &SecretValue) -> Result<Self, BundleError> {
        let text = text.expose();
        if !(2..=MAX_BUNDLE_VALUE_BYTES).contains(&text.len()) {
            return Err(BundleError::Size { len: text.len() });
        }
        let wire: BundleWire =
            super::JsonError::parse(text.as_bytes()).map_err(BundleError::Json)?;
        let rule = |ok: bool, path, rule| ok.then_some(()).ok_or(BundleError::Field { path, rule });
        rule(wire.schema == BUNDLE_SCHEMA, "schema", BUNDLE_SCHEMA)?;
        rule(
            (1..=MAX_BUNDLE_ENTRIES).contains(&wire.entries.len()),
            "entries",
            "1..=256 entries",
        )?;
        let mut entries: Vec<(EnvName, SecretValue)> = Vec::with_capacity(wire.entries.len());
        let mut total = 0usize;
        for entry in wire.entries {
            let name = EnvName::new(entry.name).map_err(|e| BundleError::Field {
                path: "entries.name",
                rule: e.rule,
            })?;
            rule(
                entries.iter().all(|(n, _)| *n != name),
                "entries.name",
                "unique",
            )?;
            let value = entry.value.expose();
            rule(
                !value.contains('\0') && value.len() <= 16 * 1024,
                "entries.value",
                "at most 16 KiB, without NUL",
            )?;
            total += name.as_str().len() + value.len();
            rule(
                total <= MAX_BUNDLE_TOTAL_BYTES,
                "entries",
                "names and values of at most 64 KiB",
            )?;
            entries.push((name, entry.value));
        }
        // The reference sorts with `<` on names: UTF-16 code units, here ASCII bytes.
        entries.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let encoded = entries.iter().fold(
            r#"{"schema":"","entries":[]}"#.len() + BUNDLE_SCHEMA.len() + entries.len() - 1,
            |len, (name, value)| {
                len + r#"{"name":,"value":}"#.len()
                    + crate::js::json_string_len(name.as_str())
                    + crate::js::json_string_len(value.expose())
            },
        );
        rule(
            encoded <= MAX_BUNDLE_VALUE_BYTES,
            "entries",
            "at most 96 KiB once normalized",
        )?;
        Ok(Self { entries })
    }
}
