//! The immutable execution revision pinned by an offer (reference §2.2,
//! `clusterExecutionRevision.ts`): what to run, with which environment, where — and its
//! normalization, canonical JSON and content digest, bit-exact with the reference:
//!
//! `content_digest = sha256_hex("qinglong.cluster-task-execution-revision.v1\0" || JSON)`
//!
//! where `JSON` is `JSON.stringify` of the normalized revision without `createdAtMs`, in the
//! key order `projectId, taskId, taskRevision, sourceRevision, sourceContentDigest, executorType,
//! planSchema, command, environment, [environmentBundleRef], [workingDirectory], [timeoutMs],
//! [placement]`. Environment bindings are ordered by JavaScript `localeCompare` of their names,
//! placement lists by `Array.prototype.sort()`, labels by `localeCompare` of their keys (then
//! laid out in JavaScript object order, array-index keys first), and placement defaults
//! (`required.executors = ["remote-worker"]`) are applied. Golden vectors made with Node live in
//! `tests/fixtures/revision-digest`.
//!
//! The domain types derive serde for the postcard inbox record; JSON goes through
//! [`ExecutionRevision::parse_json`] / the offer parser, and out through private
//! `#[derive(Serialize)]` views written by serde_json ([`ExecutionRevision::canonical_json`],
//! [`ExecutionRevision::to_json`]).

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::IdError;
pub(crate) use crate::ids::bounded_text;
use crate::ids::{
    MAX_INT32, MAX_SAFE_INTEGER, ProjectId, Sha256Digest, TaskId, TaskRevision, bounded_bytes,
    is_token,
};
use crate::js::{self, JsString, JsStringJson};
use crate::time::UnixMillis;
use crate::wire::de::{Pairs, present};
use crate::wire::{JsonError, semver};

/// The executor type every cluster revision carries.
pub const EXECUTOR_TYPE: &str = "remote_worker";
/// The plan schema every cluster revision carries.
pub const PLAN_SCHEMA: &str = "qinglong/command-execution@v1";
/// Domain prefix of the content digest.
pub const DIGEST_DOMAIN: &[u8] = b"qinglong.cluster-task-execution-revision.v1\0";
/// The executor capability every cluster placement requires.
pub const REMOTE_WORKER_EXECUTOR: &str = "remote-worker";
/// Prefix of a secret reference.
pub const SECRET_REF_PREFIX: &str = "qlsecret:v1:";
/// Largest secret reference, in UTF-8 bytes.
pub const MAX_SECRET_REF_BYTES: usize = 512;

/// A revision that breaks a normalization rule, or whose digest does not match its content.
/// Blame: the control plane (or a corrupted record). Never carries values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RevisionError {
    /// A field breaks its rule.
    #[error("execution revision field {field} must be {rule}")]
    Field {
        /// The field path, as named on the wire.
        field: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// A stored (already normalized) revision is not in normalized form.
    #[error("execution revision field {field} is not in normalized form")]
    NotNormalized {
        /// The first field that differs from its normalized form.
        field: &'static str,
    },
    /// `contentDigest` does not match the digest of the normalized content.
    #[error("execution revision contentDigest does not match its content")]
    DigestMismatch,
    /// The JSON text is malformed or has the wrong shape.
    #[error("execution revision JSON rejected: {0}")]
    Json(JsonError),
}

fn field(field: &'static str, rule: &'static str) -> RevisionError {
    RevisionError::Field { field, rule }
}

fn ensure(ok: bool, name: &'static str, rule: &'static str) -> Result<(), RevisionError> {
    if ok { Ok(()) } else { Err(field(name, rule)) }
}

// ---------------------------------------------------------------------------------------------
// Newtypes
// ---------------------------------------------------------------------------------------------

crate::ids::string_id!(
    /// An environment variable name: `^[A-Za-z_][A-Za-z0-9_]{0,127}$`, not starting with `QL3_`.
    EnvName,
    "environment name",
    "^[A-Za-z_][A-Za-z0-9_]{0,127}$, not starting with QL3_",
    |v| {
        let first = |c: &u8| c.is_ascii_alphabetic() || *c == b'_';
        is_token(v, 128, first, b"0123456789") && !v.starts_with("QL3_")
    }
);

crate::ids::string_id!(
    /// A canonical secret reference: `qlsecret:v1:` + canonical base64url of exactly
    /// `JSON.stringify({projectId, name[, version]})` (≤ 512 bytes). Names the secret, not its
    /// value.
    SecretRef,
    "secret reference",
    "qlsecret:v1: + canonical base64url of JSON {projectId, name[, version]}, <= 512 bytes",
    |v| SecretRef::is_canonical(v)
);

/// The payload of a secret reference, as encoded and decoded.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SecretRefPayload<'a> {
    project_id: Cow<'a, str>,
    name: Cow<'a, str>,
    #[serde(default, deserialize_with = "present")]
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u64>,
}

impl SecretRef {
    /// Whether `text` is a canonical reference: it decodes, and encoding what it decodes to
    /// gives it back byte for byte.
    fn is_canonical(text: &str) -> bool {
        text.len() <= MAX_SECRET_REF_BYTES
            && Self::payload(text).is_some_and(|p| {
                Self::create(&p.project_id, &p.name, p.version).is_ok_and(|c| c == text)
            })
    }

    /// What `text` encodes, without the canonical-form check (which `new` made once).
    fn payload(text: &str) -> Option<SecretRefPayload<'static>> {
        let encoded = text.strip_prefix(SECRET_REF_PREFIX)?;
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(encoded).ok()?).ok()
    }

    /// Builds the canonical reference (reference `createSecretRef`).
    ///
    /// # Errors
    /// [`IdError`] when a part is out of bounds.
    pub fn create(project_id: &str, name: &str, version: Option<u64>) -> Result<String, IdError> {
        let error = IdError {
            kind: "secret reference",
            rule: Self::RULE,
        };
        if !bounded_bytes(project_id, 128)
            || !bounded_bytes(name, 128)
            || version.is_some_and(|v| !(1..=MAX_INT32).contains(&v))
        {
            return Err(error);
        }
        let payload = SecretRefPayload {
            project_id: Cow::Borrowed(project_id),
            name: Cow::Borrowed(name),
            version,
        };
        // INVARIANT: two strings and an integer always serialize.
        let payload =
            serde_json::to_vec(&payload).expect("invariant: a secret reference payload serializes");
        let mut text = String::from(SECRET_REF_PREFIX);
        URL_SAFE_NO_PAD.encode_string(&payload, &mut text);
        if text.len() > MAX_SECRET_REF_BYTES {
            return Err(error);
        }
        Ok(text)
    }

    /// The project the secret belongs to.
    #[must_use]
    pub fn project_id(&self) -> String {
        self.decoded().project_id.into_owned()
    }

    /// The pinned secret version, if any.
    #[must_use]
    pub fn version(&self) -> Option<u64> {
        self.decoded().version
    }

    /// The payload, decoded again (the reference keeps only its text): no re-encoding, since
    /// `new` proved the text canonical.
    fn decoded(&self) -> SecretRefPayload<'static> {
        // INVARIANT: `new` admits only texts that decode.
        Self::payload(&self.0).expect("invariant: a SecretRef holds a canonical reference")
    }
}

// ---------------------------------------------------------------------------------------------
// Revision shapes
// ---------------------------------------------------------------------------------------------

/// The pinned execution revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionRevision {
    /// Owning project.
    pub project_id: ProjectId,
    /// Task.
    pub task_id: TaskId,
    /// `qltd:v1:<sourceRevision>:<sourceContentDigest>`.
    pub task_revision: TaskRevision,
    /// Source revision number, 1..=2^31-1.
    pub source_revision: u64,
    /// Digest of the task source.
    pub source_content_digest: Sha256Digest,
    /// The command to run.
    pub command: ExecCommand,
    /// Environment bindings, in normalized (`localeCompare`) order.
    pub environment: Vec<EnvBinding>,
    /// Optional environment bundle secret reference (same project, versioned).
    pub environment_bundle_ref: Option<SecretRef>,
    /// Optional absolute working directory.
    pub working_directory: Option<String>,
    /// Optional timeout; the control plane owns the deadline.
    pub timeout_ms: Option<u64>,
    /// Optional placement, normalized (`required.executors` defaulted).
    pub placement: Option<Placement>,
    /// Creation time (excluded from the digest).
    pub created_at_ms: UnixMillis,
    /// `sha256_hex("qinglong.cluster-task-execution-revision.v1\0" || JSON(normalized))`.
    pub content_digest: Sha256Digest,
}

/// The command of a revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecCommand {
    /// `{"kind":"argv","file":<absolute>,"args":[…]}`.
    Argv {
        /// Absolute executable path.
        file: String,
        /// Arguments.
        args: Vec<String>,
    },
    /// `{"kind":"shell","command":…[,"shell":"/bin/sh"|"/bin/bash"]}`.
    Shell {
        /// Shell command text.
        command: String,
        /// Optional shell path: `/bin/sh` or `/bin/bash`.
        shell: Option<String>,
    },
}

/// One environment binding of a revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvBinding {
    /// The variable name.
    pub name: EnvName,
    /// Public value or secret reference.
    pub value: EnvValue,
}

/// The value side of an [`EnvBinding`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnvValue {
    /// A public value (no NUL). It may hold lone UTF-16 surrogates, kept exactly for the digest;
    /// the child receives it as Node would pass it, each lone surrogate replaced by U+FFFD.
    Public(JsString),
    /// A `qlsecret:v1:` reference resolved through the `secrets` endpoint, in memory only.
    Secret(SecretRef),
}

wire_enum!(
    /// A Worker CPU architecture of the release support policy.
    Architecture {
        I386 = "386",
        Amd64 = "amd64",
        ArmV6 = "arm/v6",
        ArmV7 = "arm/v7",
        Arm64 = "arm64",
        Ppc64le = "ppc64le",
        S390x = "s390x",
    }
);

impl Architecture {
    /// The support tier the architecture belongs to.
    #[must_use]
    pub const fn support_tier(self) -> SupportTier {
        match self {
            Self::Amd64 | Self::Arm64 => SupportTier::Tier1,
            Self::Ppc64le | Self::S390x => SupportTier::Candidate,
            Self::ArmV7 => SupportTier::Experimental,
            Self::ArmV6 | Self::I386 => SupportTier::LegacyOnly,
        }
    }
}

wire_enum!(
    /// A release support tier.
    SupportTier {
        Candidate = "candidate",
        Experimental = "experimental",
        LegacyOnly = "legacy-only",
        Tier1 = "tier1",
    }
);

/// One placement label (`key: value`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// `^[A-Za-z0-9][A-Za-z0-9._/-]*$`, 1..=128 characters.
    pub key: String,
    /// 1..=256 characters, no control characters.
    pub value: String,
}

// The placement types below are read from the revision's JSON directly: their `Deserialize`
// names and keys are the JSON ones, and optional keys must not be `null` ([`json_present`]).
// Binary formats (the postcard record) see plain derived structs. JSON is written through the
// views of [`ExecutionRevision::to_json`], which hold a [`Preference`] as it is (its labels as an
// object, [`labels_out`]).

/// A required runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all(deserialize = "camelCase"))]
#[serde(rename(deserialize = "RuntimeWire"))]
pub struct RuntimeRequirement {
    /// Capability name `^[a-z0-9][a-z0-9._+-]*$`, ≤ 64.
    pub name: String,
    /// Optional semver range.
    #[serde(default, deserialize_with = "json_present")]
    pub version_range: Option<String>,
}

/// Hard placement requirements; field order is the canonical key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all(deserialize = "camelCase"))]
#[serde(rename(deserialize = "RequiredWire"))]
pub struct PlacementRequired {
    /// Allowed architectures (sorted).
    #[serde(default, deserialize_with = "json_present")]
    pub architectures: Option<Vec<Architecture>>,
    /// Allowed operating systems (sorted).
    #[serde(default, deserialize_with = "json_present")]
    pub operating_systems: Option<Vec<String>>,
    /// Required executors (sorted; always contains `remote-worker` once normalized).
    #[serde(default, deserialize_with = "json_present")]
    pub executors: Option<Vec<String>>,
    /// Protocol version range.
    #[serde(default, deserialize_with = "json_present")]
    pub protocol_version_range: Option<String>,
    /// Required runtimes (by `localeCompare` of name).
    #[serde(default, deserialize_with = "json_present")]
    pub runtimes: Option<Vec<RuntimeRequirement>>,
    /// Allowed support tiers (sorted).
    #[serde(default, deserialize_with = "json_present")]
    pub support_tiers: Option<Vec<SupportTier>>,
    /// Required labels, in canonical object order.
    #[serde(default, deserialize_with = "labels")]
    pub labels: Option<Vec<Label>>,
    /// Minimum memory, bytes.
    #[serde(default, deserialize_with = "json_present")]
    pub min_memory_bytes: Option<u64>,
    /// Minimum disk, bytes.
    #[serde(default, deserialize_with = "json_present")]
    pub min_disk_bytes: Option<u64>,
    /// Required GPU vendor.
    #[serde(default, deserialize_with = "json_present")]
    pub gpu_vendor: Option<String>,
    /// Required features (sorted).
    #[serde(default, deserialize_with = "json_present")]
    pub features: Option<Vec<String>>,
}

/// A weighted soft preference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename(deserialize = "PreferenceWire"))]
pub struct Preference {
    /// Labels to match (non-empty), in canonical object order.
    #[serde(serialize_with = "labels_out", deserialize_with = "labels")]
    pub labels: Vec<Label>,
    /// Weight 1..=100.
    pub weight: u64,
}

/// A placement specification (`effectiveRemoteWorkerPlacement`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename(deserialize = "PlacementWire"))]
pub struct Placement {
    /// Hard requirements; `Some` once normalized.
    #[serde(default, deserialize_with = "json_present")]
    pub required: Option<PlacementRequired>,
    /// Preferences, in the given order.
    #[serde(default, deserialize_with = "json_present")]
    pub preferred: Option<Vec<Preference>>,
}

/// [`present`] in JSON; a plain `Option` in binary formats.
fn json_present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    if deserializer.is_human_readable() {
        present(deserializer)
    } else {
        Option::deserialize(deserializer)
    }
}

/// Labels as a JSON object ([`Pairs`]: input order, no duplicate keys), or as the list a binary
/// format stores. `T` is the list or, for an optional key (whose JSON form, when present, must
/// be the object too: never `null`), the `Option` of it.
fn labels<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + From<Vec<Label>>,
{
    if !deserializer.is_human_readable() {
        return T::deserialize(deserializer);
    }
    let pairs = Pairs::deserialize(deserializer)?.0.into_iter();
    let labels: Vec<Label> = pairs.map(|(key, value)| Label { key, value }).collect();
    Ok(T::from(labels))
}

/// Labels as a JSON object ([`LabelsJson`]), or as the list a binary format stores.
fn labels_out<S: Serializer>(labels: &[Label], serializer: S) -> Result<S::Ok, S::Error> {
    if serializer.is_human_readable() {
        LabelsJson(labels).serialize(serializer)
    } else {
        labels.serialize(serializer)
    }
}

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

/// `^[a-z0-9][a-z0-9._+-]{0,max-1}$`
pub(crate) fn capability_name(value: &str, max: usize) -> bool {
    let first = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    is_token(value, max, first, b"._+-")
}

/// `^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`
pub(crate) fn label_key(value: &str) -> bool {
    is_token(value, 128, u8::is_ascii_alphanumeric, b"._/-")
}

/// Sorts `items` by `localeCompare` of `key`. Every caller has already held the keys to a
/// pattern within the characters [`js::locale_compare`] orders (environment names, label keys,
/// capability names), so it never meets one it refuses.
pub(crate) fn sort_locale<T>(items: &mut [T], key: impl Fn(&T) -> &str) {
    // INVARIANT: the keys' patterns admit only characters `locale_compare` orders.
    items.sort_by(|a, b| js::locale_compare(key(a), key(b)).unwrap_or(Ordering::Equal));
}

/// Sorts `list` in `Array.prototype.sort()` order (UTF-16 code units of `key`) and requires it
/// free of duplicates.
fn sort_unique<T: PartialEq>(
    list: &mut [T],
    name: &'static str,
    key: impl Fn(&T) -> &str,
) -> Result<(), RevisionError> {
    list.sort_by(|a, b| js::code_unit_cmp(key(a), key(b)));
    ensure(
        list.windows(2).all(|w| w[0] != w[1]),
        name,
        "free of duplicates",
    )
}

/// Whether no two of `items` have the same `key`.
pub(crate) fn unique_by<T, K: PartialEq + ?Sized>(items: &[T], key: impl Fn(&T) -> &K) -> bool {
    items
        .iter()
        .enumerate()
        .all(|(i, a)| items[..i].iter().all(|b| key(b) != key(a)))
}

fn capability_list(list: &mut [String], name: &'static str) -> Result<(), RevisionError> {
    ensure(list.len() <= 16, name, "at most 16 entries")?;
    ensure(
        list.iter().all(|item| capability_name(item, 64)),
        name,
        "^[a-z0-9][a-z0-9._+-]*$, <= 64",
    )?;
    sort_unique(list, name, String::as_str)
}

fn normalize_labels(labels: &mut Vec<Label>, name: &'static str) -> Result<(), RevisionError> {
    ensure(labels.len() <= 16, name, "at most 16 entries")?;
    for label in labels.iter() {
        ensure(
            label_key(&label.key),
            name,
            "keys ^[A-Za-z0-9][A-Za-z0-9._/-]*$, <= 128",
        )?;
        ensure(
            bounded_text(&label.value, 256),
            name,
            "values of 1..=256 characters",
        )?;
    }
    ensure(
        unique_by(labels, |l| &l.key),
        name,
        "free of duplicate keys",
    )?;
    sort_locale(labels, |l| l.key.as_str());
    *labels = object_order(labels);
    Ok(())
}

/// `labels` in the order a JavaScript object built from them enumerates its keys
/// ([`js::object_key_order`]: array-index keys first).
pub(crate) fn object_order(labels: &[Label]) -> Vec<Label> {
    let keys: Vec<&str> = labels.iter().map(|l| l.key.as_str()).collect();
    js::object_key_order(&keys)
        .into_iter()
        .map(|i| labels[i].clone())
        .collect()
}

impl PlacementRequired {
    fn normalize(&mut self) -> Result<(), RevisionError> {
        if let Some(list) = &mut self.architectures {
            let name = "placement.required.architectures";
            ensure(list.len() <= 16, name, "<= 16")?;
            sort_unique(list, name, |a| a.as_str())?;
        }
        if let Some(list) = &mut self.operating_systems {
            capability_list(list, "placement.required.operatingSystems")?;
        }
        if let Some(list) = &mut self.executors {
            capability_list(list, "placement.required.executors")?;
        }
        if let Some(range) = &self.protocol_version_range {
            ensure(
                (1..=128).contains(&crate::ids::js_length(range))
                    && semver::valid_range(range).is_some(),
                "placement.required.protocolVersionRange",
                "1..=128 characters accepted by node-semver validRange",
            )?;
        }
        if let Some(list) = &mut self.runtimes {
            let name = "placement.required.runtimes";
            ensure(list.len() <= 16, name, "at most 16 entries")?;
            for r in list.iter() {
                ensure(
                    capability_name(&r.name, 64),
                    name,
                    "names ^[a-z0-9][a-z0-9._+-]*$",
                )?;
                if let Some(range) = &r.version_range {
                    ensure(
                        bounded_text(range, 128) && semver::valid_range(range).is_some(),
                        name,
                        "versionRange of 1..=128 characters without control characters, \
                         accepted by node-semver validRange",
                    )?;
                }
            }
            ensure(
                unique_by(list, |r| &r.name),
                name,
                "free of duplicate names",
            )?;
            sort_locale(list, |r| r.name.as_str());
        }
        if let Some(list) = &mut self.support_tiers {
            let name = "placement.required.supportTiers";
            ensure(list.len() <= 4, name, "<= 4")?;
            sort_unique(list, name, |t| t.as_str())?;
        }
        if let Some(labels) = &mut self.labels {
            normalize_labels(labels, "placement.required.labels")?;
        }
        for (value, name) in [
            (self.min_memory_bytes, "placement.required.minMemoryBytes"),
            (self.min_disk_bytes, "placement.required.minDiskBytes"),
        ] {
            if let Some(v) = value {
                ensure((1..=MAX_SAFE_INTEGER).contains(&v), name, "1..=2^53-1")?;
            }
        }
        if let Some(vendor) = &self.gpu_vendor {
            ensure(
                capability_name(vendor, 64),
                "placement.required.gpuVendor",
                "^[a-z0-9][a-z0-9._+-]*$, <= 64",
            )?;
        }
        if let Some(list) = &mut self.features {
            capability_list(list, "placement.required.features")?;
        }
        Ok(())
    }
}

impl Placement {
    /// `effectiveRemoteWorkerPlacement`: validates, sorts, and defaults `required.executors`.
    ///
    /// # Errors
    /// [`RevisionError`] naming the broken rule.
    pub fn normalize(mut self) -> Result<Self, RevisionError> {
        let mut required = self.required.take().unwrap_or_default();
        required.normalize()?;
        match &required.executors {
            Some(list) => ensure(
                list.iter().any(|e| e == REMOTE_WORKER_EXECUTOR),
                "placement.required.executors",
                "inclusive of remote-worker",
            )?,
            None => required.executors = Some(alloc::vec![String::from(REMOTE_WORKER_EXECUTOR)]),
        }
        if let Some(list) = &mut self.preferred {
            ensure(
                list.len() <= 16,
                "placement.preferred",
                "at most 16 entries",
            )?;
            for p in list.iter_mut() {
                normalize_labels(&mut p.labels, "placement.preferred.labels")?;
                ensure(
                    !p.labels.is_empty(),
                    "placement.preferred.labels",
                    "non-empty",
                )?;
                ensure(
                    (1..=100).contains(&p.weight),
                    "placement.preferred.weight",
                    "1..=100",
                )?;
            }
        }
        self.required = Some(required);
        Ok(self)
    }
}

fn validate_identifier(value: &str, name: &'static str) -> Result<(), RevisionError> {
    ensure(
        bounded_bytes(value, 128),
        name,
        "1..=128 UTF-8 bytes without control characters",
    )
}

fn absolute_path(path: &str, name: &'static str) -> Result<(), RevisionError> {
    ensure(
        path.starts_with('/') && !path.contains('\0') && path.len() <= 4096,
        name,
        "an absolute path of <= 4096 bytes without NUL",
    )
}

fn validate_command(command: &ExecCommand) -> Result<(), RevisionError> {
    match command {
        ExecCommand::Argv { file, args } => {
            absolute_path(file, "command.file")?;
            ensure(args.len() <= 256, "command.args", "at most 256 arguments")?;
            let mut total = file.len();
            for arg in args {
                ensure(
                    !arg.contains('\0') && arg.len() <= 16 * 1024,
                    "command.args",
                    "arguments of <= 16 KiB without NUL",
                )?;
                total += arg.len();
            }
            ensure(
                total <= 64 * 1024,
                "command",
                "file and arguments <= 64 KiB",
            )
        }
        ExecCommand::Shell { command, shell } => {
            ensure(
                !command.is_empty() && !command.contains('\0') && command.len() <= 64 * 1024,
                "command.command",
                "1..=64 KiB without NUL",
            )?;
            ensure(
                shell
                    .as_deref()
                    .is_none_or(|s| s == "/bin/sh" || s == "/bin/bash"),
                "command.shell",
                "/bin/sh or /bin/bash",
            )
        }
    }
}

fn normalize_environment(
    environment: &mut [EnvBinding],
    project_id: &ProjectId,
) -> Result<(), RevisionError> {
    ensure(
        environment.len() <= 256,
        "environment",
        "at most 256 bindings",
    )?;
    let mut bytes = 0usize;
    for (i, binding) in environment.iter().enumerate() {
        ensure(
            environment[..i].iter().all(|o| o.name != binding.name),
            "environment.name",
            "unique",
        )?;
        bytes += binding.name.as_str().len();
        match &binding.value {
            EnvValue::Public(value) => {
                ensure(!value.contains_nul(), "environment.value", "free of NUL")?;
                bytes += value.byte_len();
            }
            EnvValue::Secret(reference) => {
                ensure(
                    reference.project_id() == project_id.as_str(),
                    "environment.secretRef",
                    "a reference of the revision's project",
                )?;
                bytes += reference.as_str().len();
            }
        }
    }
    ensure(
        bytes <= 64 * 1024,
        "environment",
        "names and values <= 64 KiB",
    )?;
    sort_locale(environment, |b| b.name.as_str());
    Ok(())
}

impl ExecutionRevision {
    /// Applies every normalization rule of reference §2.2 and returns the normalized revision
    /// (the `content_digest` field is carried over unchanged).
    ///
    /// # Errors
    /// [`RevisionError`] naming the first broken rule.
    pub fn normalize(mut self) -> Result<Self, RevisionError> {
        validate_identifier(self.project_id.as_str(), "projectId")?;
        validate_identifier(self.task_id.as_str(), "taskId")?;
        ensure(
            (1..=MAX_INT32).contains(&self.source_revision),
            "sourceRevision",
            "1..=2^31-1",
        )?;
        let (number, digest) = self.task_revision.parts();
        ensure(
            number == self.source_revision && digest == self.source_content_digest.to_hex(),
            "taskRevision",
            "qltd:v1:<sourceRevision>:<sourceContentDigest>",
        )?;
        validate_command(&self.command)?;
        normalize_environment(&mut self.environment, &self.project_id)?;
        if let Some(bundle) = &self.environment_bundle_ref {
            ensure(
                bundle.project_id() == self.project_id.as_str() && bundle.version().is_some(),
                "environmentBundleRef",
                "a versioned reference of the revision's project",
            )?;
        }
        if let Some(dir) = &self.working_directory {
            absolute_path(dir, "workingDirectory")?;
        }
        if let Some(timeout) = self.timeout_ms {
            ensure(
                (1..=365 * 24 * 60 * 60_000).contains(&timeout),
                "timeoutMs",
                "1..=31536000000 (365 days)",
            )?;
        }
        self.placement = self.placement.map(Placement::normalize).transpose()?;
        self.json_within_budget(JsonForm::Content)?;
        Ok(self)
    }

    /// The content digest of this (normalized) revision.
    ///
    /// # Errors
    /// [`RevisionError::Field`] when the preimage exceeds the 96 KiB plan budget (only a revision
    /// that was never normalized can: [`Self::normalize`] refuses one that large).
    pub fn compute_digest(&self) -> Result<Sha256Digest, RevisionError> {
        let mut preimage = DIGEST_DOMAIN.to_vec();
        preimage.extend(self.canonical_json()?);
        Ok(Sha256Digest::of(&preimage))
    }

    /// Re-normalizes, requires the stored form to already be normalized, and recomputes and
    /// compares the content digest.
    ///
    /// # Errors
    /// [`RevisionError::NotNormalized`], [`RevisionError::DigestMismatch`] or the broken rule.
    pub fn validate(&self) -> Result<(), RevisionError> {
        let normalized = self.clone().normalize()?;
        if normalized.environment != self.environment {
            return Err(RevisionError::NotNormalized {
                field: "environment",
            });
        }
        if normalized.placement != self.placement {
            return Err(RevisionError::NotNormalized { field: "placement" });
        }
        if normalized.compute_digest()? != self.content_digest {
            return Err(RevisionError::DigestMismatch);
        }
        Ok(())
    }

    /// `JSON.stringify` of the normalized content without `createdAtMs`: the digest preimage
    /// (after [`DIGEST_DOMAIN`]).
    ///
    /// # Errors
    /// [`RevisionError::Field`] above the 96 KiB plan budget (a normalized revision is below
    /// it: the budget counts `createdAtMs` too).
    pub fn canonical_json(&self) -> Result<Vec<u8>, RevisionError> {
        self.json_within_budget(JsonForm::Digest)
    }

    /// The revision as the offer carries it: content, `createdAtMs` and `contentDigest`.
    #[must_use]
    pub fn to_json(&self) -> Vec<u8> {
        self.json_bytes(JsonForm::Wire)
    }

    /// Parses a revision from its wire JSON, validates and normalizes it and checks its digest
    /// (reference `normalizeClusterTaskExecutionRevision`).
    ///
    /// # Errors
    /// [`RevisionError`] for malformed JSON, a broken rule, or a digest mismatch.
    pub fn parse_json(bytes: &[u8]) -> Result<Self, RevisionError> {
        let wire: RevisionWire = JsonError::parse(bytes).map_err(RevisionError::Json)?;
        ensure(
            wire.executor_type == EXECUTOR_TYPE,
            "executorType",
            "\"remote_worker\"",
        )?;
        ensure(
            wire.plan_schema == PLAN_SCHEMA,
            "planSchema",
            "\"qinglong/command-execution@v1\"",
        )?;
        validate_identifier(&wire.project_id, "projectId")?;
        validate_identifier(&wire.task_id, "taskId")?;
        let environment = wire
            .environment
            .into_iter()
            .map(BindingWire::into_binding)
            .collect::<Result<Vec<_>, _>>()?;
        let claimed = id(
            Sha256Digest::from_hex(&wire.content_digest),
            "contentDigest",
        )?;
        let revision = ExecutionRevision {
            project_id: id(ProjectId::new(wire.project_id), "projectId")?,
            task_id: id(TaskId::new(wire.task_id), "taskId")?,
            task_revision: id(TaskRevision::new(wire.task_revision), "taskRevision")?,
            source_revision: wire.source_revision,
            source_content_digest: id(
                Sha256Digest::from_hex(&wire.source_content_digest),
                "sourceContentDigest",
            )?,
            command: wire.command.into_command()?,
            environment,
            environment_bundle_ref: wire
                .environment_bundle_ref
                .map(|r| id(SecretRef::new(r), "environmentBundleRef"))
                .transpose()?,
            working_directory: wire.working_directory,
            timeout_ms: wire.timeout_ms,
            placement: wire.placement,
            created_at_ms: id(UnixMillis::new(wire.created_at_ms), "createdAtMs")?,
            content_digest: claimed,
        };
        let normalized = revision.normalize()?;
        if normalized.compute_digest()? != claimed {
            return Err(RevisionError::DigestMismatch);
        }
        Ok(normalized)
    }

    /// The revision as JSON in the given form, in the reference's key order (serialize it with
    /// serde_json).
    fn json(&self, form: JsonForm) -> RevisionJson<'_> {
        let command = match &self.command {
            ExecCommand::Argv { file, args } => CommandJson::Argv { file, args },
            ExecCommand::Shell { command, shell } => CommandJson::Shell {
                command,
                shell: shell.as_deref(),
            },
        };
        let environment = self
            .environment
            .iter()
            .map(|b| {
                let (kind, value, secret_ref) = match &b.value {
                    EnvValue::Public(value) => ("public", Some(JsStringJson(value)), None),
                    EnvValue::Secret(r) => ("secret", None, Some(r)),
                };
                BindingJson {
                    name: &b.name,
                    kind,
                    value,
                    secret_ref,
                }
            })
            .collect();
        let placement = self.placement.as_ref().map(|p| PlacementJson {
            required: p.required.as_ref().map(|r| RequiredJson {
                architectures: r.architectures.as_deref(),
                operating_systems: r.operating_systems.as_deref(),
                executors: r.executors.as_deref(),
                protocol_version_range: r.protocol_version_range.as_deref(),
                runtimes: r.runtimes.as_ref().map(|list| {
                    list.iter()
                        .map(|rt| RuntimeJson {
                            name: &rt.name,
                            version_range: rt.version_range.as_deref(),
                        })
                        .collect()
                }),
                support_tiers: r.support_tiers.as_deref(),
                labels: r.labels.as_deref().map(LabelsJson),
                min_memory_bytes: r.min_memory_bytes,
                min_disk_bytes: r.min_disk_bytes,
                gpu_vendor: r.gpu_vendor.as_deref(),
                features: r.features.as_deref(),
            }),
            preferred: p.preferred.as_deref(),
        });
        RevisionJson {
            project_id: &self.project_id,
            task_id: &self.task_id,
            task_revision: &self.task_revision,
            source_revision: self.source_revision,
            source_content_digest: &self.source_content_digest,
            executor_type: EXECUTOR_TYPE,
            plan_schema: PLAN_SCHEMA,
            command,
            environment,
            environment_bundle_ref: self.environment_bundle_ref.as_ref(),
            working_directory: self.working_directory.as_deref(),
            timeout_ms: self.timeout_ms,
            placement,
            created_at_ms: (form != JsonForm::Digest).then_some(self.created_at_ms),
            content_digest: (form == JsonForm::Wire).then_some(&self.content_digest),
        }
    }

    fn json_bytes(&self, form: JsonForm) -> Vec<u8> {
        // INVARIANT: the view holds only strings, integers, sequences and string-keyed maps.
        serde_json::to_vec(&self.json(form))
            .expect("invariant: a revision always serializes to JSON")
    }

    /// [`Self::json_bytes`], refused above the 96 KiB plan budget
    /// (`MAX_CLUSTER_EXECUTION_PLAN_BYTES`, which measures the [`JsonForm::Content`] form).
    fn json_within_budget(&self, form: JsonForm) -> Result<Vec<u8>, RevisionError> {
        let bytes = self.json_bytes(form);
        ensure(
            bytes.len() <= 96 * 1024,
            "executionRevision",
            "<= 96 KiB serialized",
        )?;
        Ok(bytes)
    }
}

/// Which keys the revision's JSON has after the content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JsonForm {
    /// No `createdAtMs`, no `contentDigest`: the digest preimage.
    Digest,
    /// With `createdAtMs`: what the 96 KiB budget measures.
    Content,
    /// With `createdAtMs` and `contentDigest`: the wire form.
    Wire,
}

/// The revision's JSON: the field order is the reference's key order; absent options are
/// omitted, as `JSON.stringify` omits `undefined`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RevisionJson<'a> {
    project_id: &'a ProjectId,
    task_id: &'a TaskId,
    task_revision: &'a TaskRevision,
    source_revision: u64,
    source_content_digest: &'a Sha256Digest,
    executor_type: &'static str,
    plan_schema: &'static str,
    command: CommandJson<'a>,
    environment: Vec<BindingJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    environment_bundle_ref: Option<&'a SecretRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    working_directory: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    placement: Option<PlacementJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_at_ms: Option<UnixMillis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_digest: Option<&'a Sha256Digest>,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum CommandJson<'a> {
    Argv {
        file: &'a str,
        args: &'a [String],
    },
    Shell {
        command: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        shell: Option<&'a str>,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BindingJson<'a> {
    name: &'a EnvName,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<JsStringJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_ref: Option<&'a SecretRef>,
}

#[derive(Serialize)]
struct PlacementJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    required: Option<RequiredJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    preferred: Option<&'a [Preference]>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RequiredJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    architectures: Option<&'a [Architecture]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    operating_systems: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    executors: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol_version_range: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtimes: Option<Vec<RuntimeJson<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    support_tiers: Option<&'a [SupportTier]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<LabelsJson<&'a [Label]>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_disk_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_vendor: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    features: Option<&'a [String]>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RuntimeJson<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    version_range: Option<&'a str>,
}

/// Labels as one JSON object whose keys come in the list's order (the canonical object order,
/// array-index keys first, is the caller's: normalization stores labels in it).
pub(crate) struct LabelsJson<L>(pub(crate) L);

impl<L: AsRef<[Label]>> Serialize for LabelsJson<L> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.as_ref().iter().map(|l| (&l.key, &l.value)))
    }
}

// ---------------------------------------------------------------------------------------------
// Wire (JSON) shapes
// ---------------------------------------------------------------------------------------------

/// The revision as JSON carries it; converted by [`ExecutionRevision::parse_json`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RevisionWire {
    project_id: String,
    task_id: String,
    task_revision: String,
    source_revision: u64,
    source_content_digest: String,
    executor_type: String,
    plan_schema: String,
    command: CommandWire,
    environment: Vec<BindingWire>,
    #[serde(default, deserialize_with = "present")]
    environment_bundle_ref: Option<String>,
    #[serde(default, deserialize_with = "present")]
    working_directory: Option<String>,
    #[serde(default, deserialize_with = "present")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    placement: Option<Placement>,
    created_at_ms: u64,
    content_digest: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandWire {
    kind: String,
    #[serde(default, deserialize_with = "present")]
    file: Option<String>,
    #[serde(default, deserialize_with = "present")]
    args: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    command: Option<String>,
    #[serde(default, deserialize_with = "present")]
    shell: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BindingWire {
    name: String,
    kind: String,
    #[serde(default, deserialize_with = "present")]
    value: Option<JsString>,
    #[serde(default, deserialize_with = "present")]
    secret_ref: Option<String>,
}

fn id<T>(result: Result<T, IdError>, name: &'static str) -> Result<T, RevisionError> {
    result.map_err(|e| field(name, e.rule))
}

impl CommandWire {
    fn into_command(self) -> Result<ExecCommand, RevisionError> {
        match (
            self.kind.as_str(),
            self.file,
            self.args,
            self.command,
            self.shell,
        ) {
            ("argv", Some(file), Some(args), None, None) => Ok(ExecCommand::Argv { file, args }),
            ("shell", None, None, Some(command), shell) => {
                Ok(ExecCommand::Shell { command, shell })
            }
            _ => Err(field(
                "command",
                "{kind:\"argv\",file,args} or {kind:\"shell\",command[,shell]}",
            )),
        }
    }
}

impl BindingWire {
    fn into_binding(self) -> Result<EnvBinding, RevisionError> {
        let name = id(EnvName::new(self.name), "environment.name")?;
        let value = match (self.kind.as_str(), self.value, self.secret_ref) {
            ("public", Some(value), None) => EnvValue::Public(value),
            ("secret", None, Some(reference)) => {
                EnvValue::Secret(id(SecretRef::new(reference), "environment.secretRef")?)
            }
            _ => {
                return Err(field(
                    "environment",
                    "{name,kind:\"public\",value} or {name,kind:\"secret\",secretRef}",
                ));
            }
        };
        Ok(EnvBinding { name, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_ref_round_trips_and_rejects_non_canonical() {
        let text = SecretRef::create("project-1", "db \"pw\"", Some(3)).unwrap();
        let parsed = SecretRef::new(&text).unwrap();
        assert_eq!(parsed.project_id(), "project-1");
        assert_eq!(parsed.version(), Some(3));
        // Padding, a foreign prefix and a re-ordered payload are not canonical.
        assert!(SecretRef::new(alloc::format!("{text}=")).is_err());
        assert!(SecretRef::new("qlsecret:v2:e30").is_err());
        let reordered = URL_SAFE_NO_PAD.encode(br#"{"name":"n","projectId":"p"}"#);
        assert!(SecretRef::new(alloc::format!("qlsecret:v1:{reordered}")).is_err());
    }

    #[test]
    fn env_name_rule() {
        assert!(EnvName::new("_a1").is_ok());
        assert!(EnvName::new("QL3_X").is_err());
        assert!(EnvName::new("1A").is_err());
        assert!(EnvName::new("a".repeat(129)).is_err());
    }
}
