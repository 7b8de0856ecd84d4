//! [`Config::summary`]: the configuration in effect as one line of `key=value` pairs, logged
//! at start-up so that an operator reading the log knows what the server ran with.

use super::{BrokerKind, Config};

impl Config {
    /// The configuration in effect as one line of `key=value` pairs (every key; the broker URL
    /// is left out as it may carry a password), for the start-up log.
    pub fn summary(&self) -> String {
        let l = &self.limits;
        let mut out = format!(
            "listen={} cores={} (effective {}) max_connections={} accept_rate={} allowed_origins={:?} \
             limits.handshake_timeout_ms={} limits.max_header_bytes={} limits.max_message_bytes={} \
             limits.max_publish_bytes={} limits.queue_max_bytes={} limits.queue_max_messages={} \
             limits.close_timeout_ms={} heartbeat.ping_interval_ms={} heartbeat.pong_timeout_ms={} \
             drain.window_ms={} drain.close_code={} dedup.window_ms={} dedup.max_entries={} broker.kind={}",
            self.listen,
            self.cores,
            self.effective_cores(),
            self.max_connections,
            self.accept_rate,
            self.allowed_origins,
            l.handshake_timeout_ms,
            l.max_header_bytes,
            l.max_message_bytes,
            l.max_publish_bytes,
            l.queue_max_bytes,
            l.queue_max_messages,
            l.close_timeout_ms,
            self.heartbeat.ping_interval_ms,
            self.heartbeat.pong_timeout_ms,
            self.drain.window_ms,
            self.drain.close_code,
            self.dedup.window_ms,
            self.dedup.max_entries,
            self.broker.kind.as_str(),
        );
        if self.broker.kind == BrokerKind::Redis {
            let b = &self.broker;
            out.push_str(&format!(
                " broker.cluster={} broker.key_prefix={:?} broker.history_ttl_ms={} broker.request_timeout_ms={}",
                b.cluster_urls().is_some(),
                b.key_prefix,
                b.history_ttl_ms,
                b.request_timeout_ms
            ));
        }
        out.push_str(&format!(
            " limits.max_channels={}{} auth.jwt={} auth.publish_keys={} admin.token={} admin.protect_metrics={}",
            l.max_channels,
            l.per_connection.summary(),
            self.auth.as_ref().is_some_and(|a| a.jwt_enabled()),
            self.auth.as_ref().map_or(0, |a| a.publish_keys.len()),
            if self.admin.token.is_empty() { "unset" } else { "set" },
            self.admin.protect_metrics,
        ));
        match &self.tls {
            Some(t) => out.push_str(&format!(
                " tls.cert_file={} tls.key_file={} tls.listen_tls={} tls.records_per_key={}",
                t.cert_file.display(),
                t.key_file.display(),
                t.listen_tls.map_or_else(|| "(listen)".to_string(), |a| a.to_string()),
                t.records_per_key.map_or_else(|| "(suite limit)".to_string(), |n| n.to_string()),
            )),
            None => out.push_str(" tls=off"),
        }
        for (i, r) in self.channels.iter().enumerate() {
            out.push_str(&format!(
                " channels[{i}]={{pattern={:?},overflow={},history={}",
                r.pattern,
                r.overflow.as_str(),
                r.history
            ));
            if r.presence {
                out.push_str(&format!(
                    ",presence=true,join_leave={},presence_max_members={}",
                    r.join_leave,
                    r.max_members()
                ));
            }
            out.push('}');
        }
        if self.channels.iter().any(|r| r.presence) {
            let p = &self.presence;
            out.push_str(&format!(
                " presence.window_ms={} presence.max_diff={} presence.info_max_bytes={} presence.page_size={} \
                 presence.member_ttl_ms={}",
                p.window_ms, p.max_diff, p.info_max_bytes, p.page_size, p.member_ttl_ms
            ));
        }
        let f = &self.feeds;
        out.push_str(&format!(
            " feeds.store={} feeds.renew_ms={} feeds.lease_ms={} feeds.reconcile_ms={} feeds.skew_margin_ms={} \
             feeds.static={}",
            f.store.as_str(),
            f.renew_ms,
            f.lease_ms,
            f.reconcile_ms,
            f.skew_margin_ms,
            f.static_feeds.len()
        ));
        out.push_str(&format!(
            " io.send_batch={} io.readiness={}",
            self.io.send_batch.as_str(),
            self.io.readiness.as_str()
        ));
        out
    }
}
