//! etcd's streams behind [`Store::watch`] and [`Store::keep_alive`]: a
//! watch that also ends when the store's client is replaced (certificates
//! read again), and renewals over one keep-alive stream.

use etcd_client::{EventType, LeaseKeepAliveStream, LeaseKeeper, WatchOptions};

use super::{
    super::store::{KeepAlive, StoreError, WatchEvent, WatchResponse, WatchStream},
    EtcdStore, store_error, to_kv,
};

pub struct EtcdWatch {
    stream: etcd_client::WatchStream,
    /// The store's client generation: a new client ends this watch.
    generation: tokio::sync::watch::Receiver<u64>,
    /// The revision the watch started from, for the compaction message.
    from: i64,
}

impl EtcdWatch {
    pub(super) async fn start(
        store: &EtcdStore,
        prefix: &str,
        revision: i64,
    ) -> Result<Self, StoreError> {
        let mut generation = store.generation();
        generation.mark_unchanged();
        // No previous values: the lease cache holds what a deleted key held.
        // The server's own timed progress notifications (etcd's
        // --experimental-watch-progress-notify-interval, 10 min by
        // default) say how far a quiet watch has come, at no cost to it.
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision)
            .with_progress_notify();
        let stream = store
            .client()
            .watch(prefix, Some(opts))
            .await
            .map_err(store_error)?;
        Ok(Self {
            stream,
            generation,
            from: revision,
        })
    }
}

impl WatchStream for EtcdWatch {
    async fn next(&mut self) -> Result<Option<WatchResponse>, StoreError> {
        let resp = tokio::select! {
            m = self.stream.message() => m.map_err(store_error)?,
            _ = self.generation.changed() => {
                return Ok(Some(WatchResponse::Restart("the etcd client was replaced".into())));
            }
        };
        let Some(resp) = resp else { return Ok(None) };
        if resp.compact_revision() > 0 {
            return Ok(Some(WatchResponse::Compacted(format!(
                "revision {} was compacted (oldest kept: {})",
                self.from,
                resp.compact_revision()
            ))));
        }
        if resp.canceled() {
            return Ok(Some(WatchResponse::Restart(format!(
                "the watch was cancelled: {}",
                resp.cancel_reason()
            ))));
        }
        let events = resp
            .events()
            .iter()
            .filter_map(|ev| {
                let kv = to_kv(ev.kv()?);
                Some(match ev.event_type() {
                    EventType::Put => WatchEvent::Put(kv),
                    EventType::Delete => WatchEvent::Delete {
                        key: kv.key,
                        revision: kv.mod_revision,
                    },
                })
            })
            .collect();
        // The watch's creation, and a reply to a progress request (sent to
        // every watch of the stream, id -1; before etcd 3.4.25 possibly
        // ahead of changes the watch still holds), prove the stream alive
        // but not how far it has come. Changes, and the server's timed
        // progress notifications (sent only to a watch that is current),
        // do.
        let revision = if resp.created() || resp.watch_id() < 0 {
            0
        } else {
            resp.header().map(|h| h.revision()).unwrap_or_default()
        };
        Ok(Some(WatchResponse::Events {
            events,
            revision,
            member: resp.header().map(|h| h.member_id()).unwrap_or_default(),
        }))
    }

    async fn request_progress(&mut self) {
        // An old etcd without progress requests just never answers.
        let _ = self.stream.request_progress().await;
    }
}

pub struct EtcdKeepAlive {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl EtcdKeepAlive {
    pub(super) async fn start(store: &EtcdStore, lease: i64) -> Result<Self, StoreError> {
        let (keeper, stream) = store
            .client()
            .lease_keep_alive(lease)
            .await
            .map_err(store_error)?;
        Ok(Self { keeper, stream })
    }
}

impl KeepAlive for EtcdKeepAlive {
    async fn renew(&mut self) -> Result<i64, StoreError> {
        self.keeper.keep_alive().await.map_err(store_error)?;
        match self.stream.message().await.map_err(store_error)? {
            Some(resp) => Ok(resp.ttl()),
            None => Err(StoreError::Unavailable("keep-alive stream closed".into())),
        }
    }
}
