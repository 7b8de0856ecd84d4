//! `renew_many` on DynamoDB: the leases go out in `TransactWriteItems` requests of at most
//! [`TRANSACT_ITEMS`] `Update`s, each with `renew`'s update and condition, so renewing 1,000
//! leases takes 10 requests instead of 1,000 `UpdateItem`s. Up to `TRANSACTIONS_IN_FLIGHT`
//! are sent at once.
//!
//! A transaction is all or nothing: when one item's condition fails, DynamoDB cancels the
//! whole request (`TransactionCanceledException`) and gives one cancellation reason per item,
//! in request order. Items whose reason is `ConditionalCheckFailed` are answered from the
//! item returned with it (`ReturnValuesOnConditionCheckFailure = ALL_OLD`): `Lost` with the
//! lease the store holds, or `NotFound` (confirmed by a strongly consistent `GetItem` when no
//! item came back). The other items (reason `None`, or a conflict with another write of the
//! same item, or throttling) are sent again in a new transaction, after a short jittered
//! wait; a request is sent at most `ATTEMPTS` times, and items still not renewed then get
//! [`LeaseError::Store`]. A cancellation is the one case where a failed condition costs a
//! second request: with leases renewed well before they expire, it happens only for a feed
//! taken over or deleted since the last renew.
//!
//! Cost: DynamoDB bills a transactional write at twice the write capacity of a plain one, so
//! a batched renew writes the same items for the same money as one `UpdateItem` each, in a
//! hundredth of the requests; what it saves is round trips (latency, connections, request
//! rate), not capacity.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{CancellationReason, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update};
use futures::StreamExt;

use super::item::{key, lease_of, n, s, sdk_err, EXPIRES, ID, LAST_SEQ, OWNER, TOKEN};
use super::{names, DynamoLeaseStore, Op, Refused, RENEW_CONDITION};
use crate::feeds::metrics::StoreOp;
use crate::feeds::store::{merge_chunks, LeaseError, LeaseTerm, Renewal};

/// Most actions in one `TransactWriteItems` (DynamoDB's limit).
pub const TRANSACT_ITEMS: usize = 100;
/// `TransactWriteItems` requests of one `renew_many` in flight at once.
const TRANSACTIONS_IN_FLIGHT: usize = 8;
/// Times one chunk's transaction may be sent: the first try and up to two retries of the
/// items that did not fail their condition.
const ATTEMPTS: u32 = 3;

/// The results of one chunk, filled in as its transactions answer.
type Slots = Vec<Option<Result<(), LeaseError>>>;

impl DynamoLeaseStore {
    /// [`crate::feeds::LeaseStore::renew_many`] on checked arguments: one transaction per
    /// [`TRANSACT_ITEMS`] leases. Errors: [`LeaseError::Store`] for the whole call when every
    /// chunk failed, else per lease of a failed chunk.
    pub(super) async fn transact_renew(
        &self,
        term: LeaseTerm<'_>,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        // Collected first: a lazy `map` in the stream trips the `Send` check of the trait's future.
        let chunks: Vec<_> = leases.chunks(TRANSACT_ITEMS).map(|c| self.renew_chunk(term, c)).collect();
        let replies = futures::stream::iter(chunks).buffered(TRANSACTIONS_IN_FLIGHT).collect().await;
        merge_chunks(leases, TRANSACT_ITEMS, replies)
    }

    /// Renews at most [`TRANSACT_ITEMS`] leases in one transaction, retried as the module doc
    /// says; one result per lease.
    async fn renew_chunk(
        &self,
        term: LeaseTerm<'_>,
        chunk: &[Renewal<'_>],
    ) -> Result<Vec<Result<(), LeaseError>>, LeaseError> {
        let mut slots: Slots = vec![None; chunk.len()];
        let mut pending: Vec<usize> = (0..chunk.len()).collect();
        for attempt in 0..ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            if attempt > 0 {
                let cap = 25u64 << (attempt - 1);
                tokio::time::sleep(Duration::from_millis(rand::random_range(cap / 2..=cap))).await;
            }
            let actions = pending.iter().map(|&i| self.renew_action(term, &chunk[i])).collect::<Result<Vec<_>, _>>()?;
            self.sent(Op::TransactWriteItems, StoreOp::RenewMany);
            let sent = self.client.transact_write_items().set_transact_items(Some(actions)).send().await;
            let err = match sent {
                Ok(_) => {
                    for i in pending.drain(..) {
                        slots[i] = Some(Ok(()));
                    }
                    break;
                }
                Err(e) => e,
            };
            let Some(TransactWriteItemsError::TransactionCanceledException(cancel)) = err.as_service_error() else {
                if attempt == 0 {
                    return Err(sdk_err("TransactWriteItems", self.timeout_ms, err));
                }
                // Some items were answered by an earlier attempt: keep those.
                let e = sdk_err("TransactWriteItems", self.timeout_ms, err);
                for i in pending.drain(..) {
                    slots[i] = Some(Err(e.clone()));
                }
                break;
            };
            let reasons = cancel.cancellation_reasons();
            if reasons.len() != pending.len() {
                return Err(LeaseError::Store(format!(
                    "DynamoDB TransactWriteItems: {} cancellation reasons for {} items",
                    reasons.len(),
                    pending.len()
                )));
            }
            pending = self.answer_refused(chunk, &pending, reasons, &mut slots).await?;
        }
        Ok(slots
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(LeaseError::Store(format!(
                        "DynamoDB TransactWriteItems: cancelled {ATTEMPTS} times (conflict or throttling); not renewed"
                    )))
                })
            })
            .collect())
    }

    /// Fills the slots of the items of a cancelled transaction whose condition failed
    /// (`Lost` or `NotFound`); returns the others, to be sent again.
    async fn answer_refused(
        &self,
        chunk: &[Renewal<'_>],
        pending: &[usize],
        reasons: &[CancellationReason],
        slots: &mut Slots,
    ) -> Result<Vec<usize>, LeaseError> {
        let mut again = Vec::new();
        for (&i, reason) in pending.iter().zip(reasons) {
            if reason.code() != Some("ConditionalCheckFailed") {
                again.push(i);
                continue;
            }
            let id = chunk[i].id;
            slots[i] = Some(match self.refused_item(id, reason.item(), StoreOp::RenewMany).await? {
                None => Err(LeaseError::NotFound),
                Some(item) => Err(Refused(lease_of(&item, id)?).lost()),
            });
        }
        Ok(again)
    }

    /// The `Update` of one lease: `renew`'s update and condition.
    fn renew_action(&self, term: LeaseTerm<'_>, r: &Renewal<'_>) -> Result<TransactWriteItem, LeaseError> {
        let LeaseTerm { owner, now_ms, lease_ms } = term;
        let mut names = names(&[("#id", ID), ("#o", OWNER), ("#t", TOKEN), ("#e", EXPIRES)]);
        let mut values = HashMap::from([
            (":owner".to_owned(), s(owner)),
            (":token".to_owned(), n(r.token)),
            (":now".to_owned(), n(now_ms)),
            (":exp".to_owned(), n(now_ms.saturating_add(lease_ms))),
        ]);
        let mut update = "SET #e = :exp".to_owned();
        if let Some(seq) = r.last_seq {
            update.push_str(", #s = :seq");
            names.insert("#s".into(), LAST_SEQ.into());
            values.insert(":seq".into(), s(seq));
        }
        let action = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(r.id)))
            .update_expression(update)
            .condition_expression(RENEW_CONDITION)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| LeaseError::Store(format!("TransactWriteItems request: {e}")))?;
        Ok(TransactWriteItem::builder().update(action).build())
    }
}
