//! The operator's webhook (SPEC §23): where notified events are posted,
//! and the secret they are signed with.

/// The operator's webhook: where notified events are posted, and the
/// secret their HMAC-SHA256 signature is made with.
#[derive(Clone)]
pub struct Webhook {
    /// An `http://` or `https://` URL.
    pub url: String,
    /// The signing key (never printed).
    pub secret: String,
    /// A CA trusted beside the system's roots for an `https://` receiver.
    pub ca: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.url)
            .field("secret", &"(hidden)")
            .field("ca", &self.ca)
            .finish()
    }
}

impl Webhook {
    /// A webhook from its settings: none for an empty URL; an http:// or
    /// https:// URL needs a secret of at least 16 characters (unsigned
    /// posts could be forged); `ca` is trusted for an https:// receiver.
    pub fn parse(
        url: &str,
        secret: &str,
        ca: Option<std::path::PathBuf>,
    ) -> Result<Option<Webhook>, String> {
        let url = url.trim();
        if url.is_empty() {
            return Ok(None);
        }
        let parsed = reqwest::Url::parse(url);
        if !parsed
            .as_ref()
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        {
            return Err(format!(
                "OPKERNEL_WEBHOOK_URL: {url:?} is not an http:// or https:// URL"
            ));
        }
        if secret.trim().len() < 16 {
            return Err(
                "OPKERNEL_WEBHOOK_SECRET: the webhook needs a signing secret of at least \
                 16 characters"
                    .into(),
            );
        }
        Ok(Some(Webhook {
            url: url.to_owned(),
            secret: secret.trim().to_owned(),
            ca,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_needs_an_http_url_and_a_secret() {
        let secret = "sixteen-chars-ok";
        assert!(matches!(Webhook::parse("", "", None), Ok(None)));
        let hook = Webhook::parse(" http://127.0.0.1:9000/hook ", secret, None);
        assert_eq!(hook.unwrap().unwrap().url, "http://127.0.0.1:9000/hook");
        let hook = Webhook::parse("https://hooks.example/x", secret, None);
        assert_eq!(hook.unwrap().unwrap().url, "https://hooks.example/x");
        for (url, secret, why) in [
            (
                "ftp://hooks.example/x",
                secret,
                "not an http:// or https:// URL",
            ),
            ("not a url", secret, "not an http:// or https:// URL"),
            ("http://127.0.0.1:9000/hook", "short", "at least"),
            ("http://127.0.0.1:9000/hook", "", "at least"),
        ] {
            let e = Webhook::parse(url, secret, None).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(
                !e.contains(secret) || secret.is_empty(),
                "the secret is never shown"
            );
        }
        let shown = format!(
            "{:?}",
            Webhook::parse("http://h/x", secret, None).unwrap().unwrap()
        );
        assert!(!shown.contains(secret), "{shown}");
    }
}
