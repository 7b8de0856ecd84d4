//! Token verification rules, without sockets and with the clock passed in.

use std::path::PathBuf;

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use super::mint::{Signer, TokenClaims};
use super::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef";
/// 2030-01-01T00:00:00Z in seconds.
const T0: u64 = 1_893_456_000;
const NOW_MS: u64 = T0 * 1000;

fn keys(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/keys").join(name)
}

fn hs_auth() -> Auth {
    Auth { jwt_hs256_secret: SECRET.into(), ..Auth::default() }
}

fn verifier(auth: &Auth) -> Verifier {
    Verifier::from_config(Some(auth)).expect("config").expect("jwt on")
}

fn hs(claims: serde_json::Value) -> String {
    let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("key");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).expect("sign")
}

fn b64(v: &serde_json::Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

/// `token` with the first character of its signature changed (still valid base64url).
fn flip_signature(token: &str) -> String {
    let i = token.rfind('.').expect("signature") + 1;
    let c = if token.as_bytes()[i] == b'A' { "B" } else { "A" };
    format!("{}{c}{}", &token[..i], &token[i + 1..])
}

#[test]
fn good_token_gives_sorted_grant_and_exp() {
    let v = verifier(&hs_auth());
    let t = hs(json!({"sub":"alice","exp":T0 + 60,"channels":{"sub":["news.*","a","news.*"],"pub":["chat.1"]}}));
    let got = v.verify(&t, NOW_MS).expect("valid");
    assert_eq!(got.exp_ms, (T0 + 60) * 1000);
    assert_eq!(&*got.grant.user, "alice");
    assert_eq!(got.grant.subscribe.iter().map(|g| &**g).collect::<Vec<_>>(), ["a", "news.*"]);
    assert!(got.grant.may_subscribe("news.a") && !got.grant.may_subscribe("admin.x"));
    assert!(got.grant.may_publish("chat.1") && !got.grant.may_publish("chat.2"));
    // No `channels` claim: the connection may do nothing but stay.
    let bare = v.verify(&hs(json!({"sub":"bob","exp":T0 + 60})), NOW_MS).expect("valid");
    assert!(!bare.grant.may_subscribe("a") && !bare.grant.may_publish("a"));
}

#[test]
fn refusals_name_what_failed() {
    let v = verifier(&hs_auth());
    let good = hs(json!({"sub":"alice","exp":T0 + 60}));
    let (head, rest) = good.split_once('.').expect("parts");
    let cases: Vec<(String, AuthError)> = vec![
        (String::new(), AuthError::Missing),
        ("not-a-jwt".into(), AuthError::Malformed),
        ("a.b.c".into(), AuthError::Malformed),
        (flip_signature(&good), AuthError::Signature),
        (
            format!("{}.{}.", b64(&json!({"alg":"none","typ":"JWT"})), rest.split('.').next().expect("payload")),
            AuthError::Algorithm,
        ),
        (format!("{}.{rest}", b64(&json!({"alg":"HS512"}))), AuthError::Algorithm),
        (hs(json!({"sub":"alice","exp":T0 - 1})), AuthError::Expired),
        (hs(json!({"sub":"alice","exp":T0 + 60,"nbf":T0 + 5})), AuthError::NotYetValid),
        // Issued in the future: it would escape a revocation of the user's tokens until now.
        (hs(json!({"sub":"alice","exp":T0 + 600,"iat":T0 + 61})), AuthError::NotYetValid),
        (hs(json!({"sub":"alice"})), AuthError::Claims),
        (hs(json!({"exp":T0 + 60})), AuthError::Claims),
        (hs(json!({"sub":"","exp":T0 + 60})), AuthError::Claims),
        (hs(json!({"sub":"alice","exp":"never"})), AuthError::Claims),
        // A string nbf must not pass as "no nbf" (CVE-2026-25537).
        (hs(json!({"sub":"alice","exp":T0 + 60,"nbf":"99999999999"})), AuthError::Claims),
        (hs(json!({"sub":"alice","exp":T0 + 60,"channels":{"sub":"news.*"}})), AuthError::Claims),
        (hs(json!({"sub":"alice","exp":T0 + 60,"channels":{"sub":vec!["x"; MAX_GLOBS + 1]}})), AuthError::Claims),
    ];
    assert!(head.len() > 4);
    for (token, want) in cases {
        assert_eq!(v.verify(&token, NOW_MS).map(|_| ()), Err(want), "token {token:?}");
    }
}

#[test]
fn leeway_applies_to_exp_nbf_and_iat_in_milliseconds() {
    let v = verifier(&Auth { jwt_leeway_ms: 1500, ..hs_auth() });
    let expired = hs(json!({"sub":"a","exp":T0 - 1}));
    assert!(v.verify(&expired, NOW_MS).is_ok(), "1 s late, 1.5 s leeway");
    assert_eq!(v.verify(&expired, NOW_MS + 501).map(|_| ()), Err(AuthError::Expired));
    let early = hs(json!({"sub":"a","exp":T0 + 60,"nbf":T0 + 1}));
    assert!(v.verify(&early, NOW_MS).is_ok());
    assert_eq!(v.verify(&early, NOW_MS - 501).map(|_| ()), Err(AuthError::NotYetValid));
    // An issuer's clock ahead by up to the leeway + IAT_SKEW_MS is tolerated in `iat`.
    let ahead = hs(json!({"sub":"a","exp":T0 + 600,"iat":T0 + 61}));
    assert!(v.verify(&ahead, NOW_MS).is_ok(), "61 s ahead, 1.5 s leeway + 60 s");
    assert_eq!(v.verify(&ahead, NOW_MS - 501).map(|_| ()), Err(AuthError::NotYetValid));
    // Fractional NumericDates (RFC 7519 §2) are read to the millisecond.
    let frac = hs(json!({"sub":"a","exp":(T0 as f64) + 0.25}));
    assert_eq!(verifier(&hs_auth()).verify(&frac, NOW_MS).map(|g| g.exp_ms), Ok(NOW_MS + 250));
}

#[test]
fn issuer_and_audience_are_required_when_configured() {
    let v = verifier(&Auth { jwt_issuer: "https://id.example".into(), jwt_audience: "tether".into(), ..hs_auth() });
    let ok = hs(json!({"sub":"a","exp":T0 + 60,"iss":"https://id.example","aud":["x","tether"]}));
    assert!(v.verify(&ok, NOW_MS).is_ok());
    let cases = [
        (json!({"sub":"a","exp":T0 + 60,"aud":"tether"}), AuthError::Issuer),
        (json!({"sub":"a","exp":T0 + 60,"iss":"https://evil","aud":"tether"}), AuthError::Issuer),
        (json!({"sub":"a","exp":T0 + 60,"iss":"https://id.example"}), AuthError::Audience),
        (json!({"sub":"a","exp":T0 + 60,"iss":"https://id.example","aud":"other"}), AuthError::Audience),
    ];
    for (claims, want) in cases {
        assert_eq!(v.verify(&hs(claims.clone()), NOW_MS).map(|_| ()), Err(want), "{claims}");
    }
    // Without jwt_audience configured, a token's aud is not held against it.
    let open = verifier(&hs_auth());
    assert!(open.verify(&hs(json!({"sub":"a","exp":T0 + 60,"aud":"anyone"})), NOW_MS).is_ok());
}

#[test]
fn public_keys_pick_their_algorithm_and_refuse_the_others() {
    for (public, private, alg) in [
        ("rs256.pub.pem", "rs256.key.pem", Algorithm::RS256),
        ("es256.pub.pem", "es256.key.pem", Algorithm::ES256),
        ("ed25519.pub.pem", "ed25519.key.pem", Algorithm::EdDSA),
    ] {
        let auth = Auth { jwt_public_key_file: keys(public), ..Auth::default() };
        let v = verifier(&auth);
        assert_eq!(v.algorithm(), alg);
        let signer = Signer::from_pem_file(&keys(private)).expect("private key");
        assert_eq!(signer.algorithm(), alg);
        let token = signer.sign(&TokenClaims::new("alice", T0 + 60)).expect("sign");
        assert_eq!(v.verify(&token, NOW_MS).map(|g| g.exp_ms), Ok((T0 + 60) * 1000), "{public}");
        // HS256 "signed" with the public key's PEM bytes as the HMAC secret.
        let pem = std::fs::read(keys(public)).expect("pem");
        let key = EncodingKey::from_secret(&pem).expect("key");
        let confused = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &json!({"sub":"a","exp":T0 + 60}), &key)
            .expect("sign");
        assert_eq!(v.verify(&confused, NOW_MS).map(|_| ()), Err(AuthError::Algorithm), "{public}");
        // An HS256 verifier refuses a token signed with a private key.
        assert_eq!(verifier(&hs_auth()).verify(&token, NOW_MS).map(|_| ()), Err(AuthError::Algorithm));
    }
}

#[test]
fn bad_key_files_are_config_errors_naming_the_key() {
    for (file, want) in [
        ("no-such-file.pem", "cannot read the key file"),
        ("p384.pub.pem", "not a usable ES256 public key"),
        ("es256.key.pem", "not a PEM public key"),
        ("README.md", "not a PEM public key"),
    ] {
        let auth = Auth { jwt_public_key_file: keys(file), ..Auth::default() };
        let e = Verifier::from_config(Some(&auth)).expect_err(file);
        assert_eq!(e.key, "auth.jwt_public_key_file", "{file}");
        assert!(e.message.contains(want), "{file}: {e}");
    }
    assert!(Verifier::from_config(None).expect("none").is_none());
    assert!(Verifier::from_config(Some(&Auth::default())).expect("no jwt").is_none());
}

#[test]
fn debug_output_hides_the_key() {
    let v = verifier(&hs_auth());
    assert!(!format!("{v:?}").contains(SECRET));
    let s = Signer::hs256(SECRET).expect("signer");
    assert!(!format!("{s:?}").contains(SECRET));
}
