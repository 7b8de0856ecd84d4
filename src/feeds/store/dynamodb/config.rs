//! [`DynamoConfig`]: which table, where, and how the DynamoDB lease store authenticates; and
//! building the SDK client from it.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use crate::feeds::record::FeedError;
use crate::feeds::store::LeaseError;

/// The region used with an explicit endpoint when none is given: an emulator accepts any.
pub const EMULATOR_REGION: &str = "us-east-1";

/// How the store authenticates its requests (SigV4).
#[derive(Clone, Default, PartialEq, Eq)]
pub enum DynamoCredentials {
    /// The AWS SDK's default chain: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` /
    /// `AWS_SESSION_TOKEN`, the shared profile (`AWS_PROFILE`, `~/.aws/credentials`), web
    /// identity, the ECS container role, the EC2 instance role. Resolved on the first call
    /// and refreshed by the SDK before it expires. The production choice.
    #[default]
    Chain,
    /// Fixed keys, for a local emulator (moto, DynamoDB Local) that accepts any. Do not put
    /// real keys in a config file: use [`DynamoCredentials::Chain`].
    Static {
        /// The access key id.
        access_key_id: String,
        /// The secret access key (never printed by `Debug`).
        secret_access_key: String,
    },
}

impl std::fmt::Debug for DynamoCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DynamoCredentials::Chain => f.write_str("Chain"),
            DynamoCredentials::Static { access_key_id, .. } => {
                write!(f, "Static {{ access_key_id: {access_key_id:?}, secret_access_key: \"…\" }}")
            }
        }
    }
}

/// Where the DynamoDB lease store keeps feeds (DESIGN §7 `[feeds] dynamodb_table`,
/// `dynamodb_endpoint`) and how it reaches the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamoConfig {
    /// The table: 3–255 bytes of `[A-Za-z0-9_.-]` (DynamoDB's rule). Default `tether_feeds`.
    pub table: String,
    /// `http://` or `https://` URL of a DynamoDB-compatible endpoint (e.g.
    /// `http://127.0.0.1:5000` for moto); `None` = AWS's endpoint for the region.
    pub endpoint: Option<String>,
    /// The AWS region, e.g. `eu-west-1`. `None` = the SDK's chain (`AWS_REGION`, the
    /// profile, the EC2 instance's region) without an endpoint, [`EMULATOR_REGION`] with one.
    pub region: Option<String>,
    /// Default: the SDK's chain.
    pub credentials: DynamoCredentials,
    /// Bound on each DynamoDB call, connection included, in milliseconds (1 ..= 60,000;
    /// default 2,000). Calls are not retried by the SDK (a retried `acquire` could be told
    /// `Held` by its own first attempt); a call that fails or runs out of time is
    /// [`LeaseError::Store`] and the caller decides. Keep it well under the renew interval.
    pub call_timeout_ms: u64,
}

impl DynamoConfig {
    /// The table `table` on AWS, region and credentials from the SDK's chain, 2 s per call.
    pub fn new(table: impl Into<String>) -> DynamoConfig {
        DynamoConfig {
            table: table.into(),
            endpoint: None,
            region: None,
            credentials: DynamoCredentials::Chain,
            call_timeout_ms: 2_000,
        }
    }

    /// Checks the table name, the endpoint and the timeout; errors name the field
    /// (`dynamodb_table`, `dynamodb_endpoint`, `region`, `call_timeout_ms`).
    pub fn validate(&self) -> Result<(), FeedError> {
        let t = &self.table;
        let table_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
        if !(3..=255).contains(&t.len()) || !t.bytes().all(table_char) {
            return Err(FeedError {
                field: "dynamodb_table",
                reason: format!("{:?} is not 3–255 bytes of [A-Za-z0-9_.-]", t.chars().take(40).collect::<String>()),
            });
        }
        if let Some(ep) = &self.endpoint {
            let rest = ep.strip_prefix("http://").or_else(|| ep.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) || ep.len() > 2048 {
                return Err(FeedError {
                    field: "dynamodb_endpoint",
                    reason: format!(
                        "{:?} is not an http:// or https:// URL with a host",
                        ep.chars().take(80).collect::<String>()
                    ),
                });
            }
        }
        if let Some(r) = &self.region {
            if r.is_empty() || r.len() > 64 || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(FeedError {
                    field: "region",
                    reason: format!("{r:?} is not a region name like eu-west-1"),
                });
            }
        }
        if !(1..=60_000).contains(&self.call_timeout_ms) {
            return Err(FeedError {
                field: "call_timeout_ms",
                reason: format!("{} is not 1 ..= 60000 ms", self.call_timeout_ms),
            });
        }
        Ok(())
    }

    /// Builds the SDK client: HTTPS through rustls on ring with the system's root
    /// certificates, no SDK retries, [`DynamoConfig::call_timeout_ms`] on the connection and
    /// on the whole call. Errors: [`LeaseError::Invalid`] for a bad field, or no region.
    pub(super) async fn client(&self) -> Result<aws_sdk_dynamodb::Client, LeaseError> {
        self.validate()?;
        let bound = Duration::from_millis(self.call_timeout_ms);
        let http =
            aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
        let timeouts = TimeoutConfig::builder().connect_timeout(bound).operation_timeout(bound).build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts);
        if let Some(ep) = &self.endpoint {
            loader = loader.endpoint_url(ep);
        }
        let region = self.region.clone().or_else(|| self.endpoint.as_ref().map(|_| EMULATOR_REGION.to_owned()));
        if let Some(r) = region {
            loader = loader.region(Region::new(r));
        }
        if let DynamoCredentials::Static { access_key_id, secret_access_key } = &self.credentials {
            loader = loader.credentials_provider(Credentials::new(
                access_key_id,
                secret_access_key,
                None,
                None,
                "tether-static",
            ));
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(LeaseError::Invalid(FeedError {
                field: "region",
                reason: "none given and none found (set AWS_REGION, or region in the AWS profile)".into(),
            }));
        }
        Ok(aws_sdk_dynamodb::Client::new(&sdk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(c: &DynamoConfig) -> &'static str {
        c.validate().expect_err("must be refused").field
    }

    #[test]
    fn each_bad_field_is_named() {
        let ok = DynamoConfig { endpoint: Some("http://127.0.0.1:5000".into()), ..DynamoConfig::new("tether_feeds") };
        ok.validate().unwrap();
        assert_eq!(field(&DynamoConfig::new("ab")), "dynamodb_table");
        assert_eq!(field(&DynamoConfig::new("a b c")), "dynamodb_table");
        for ep in ["127.0.0.1:5000", "http://", "ftp://h", "http:///x"] {
            assert_eq!(field(&DynamoConfig { endpoint: Some(ep.into()), ..ok.clone() }), "dynamodb_endpoint", "{ep}");
        }
        assert_eq!(field(&DynamoConfig { region: Some("eu west".into()), ..ok.clone() }), "region");
        assert_eq!(field(&DynamoConfig { call_timeout_ms: 0, ..ok.clone() }), "call_timeout_ms");
    }

    #[test]
    fn debug_hides_the_secret() {
        let c = DynamoCredentials::Static { access_key_id: "AKID".into(), secret_access_key: "s3cr3t".into() };
        let d = format!("{c:?}");
        assert!(d.contains("AKID") && !d.contains("s3cr3t"), "{d}");
    }
}
