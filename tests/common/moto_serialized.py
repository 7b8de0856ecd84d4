"""moto's server (`moto_server`, same arguments: -H HOST -p PORT) with one lock around each
request, for the DynamoDB lease store tests (tests/common/moto.rs).

`moto_server` runs requests on parallel threads and does not lock a table while it checks a
ConditionExpression and applies the update, so two racing conditional UpdateItem calls can
both pass (seen here: 32 racing acquires of one item, 5 rounds in 20 with 2 or 3 winners).
DynamoDB itself applies each conditional write to an item atomically; serializing the
requests gives the emulator that property. Connections are still served on threads (HTTP
keep-alive works), only the request handling is one at a time.

It also makes `TransactWriteItems` cost what its items cost: moto backs up every table a
transaction names with a deep copy, for its rollback, so one transaction of 100 updates took
4.8 s with 1,000 items in the table here (100 `UpdateItem`s: 0.35 s), and the lease store's
batched renew of 1,000 leases (10 transactions) took far longer than a renew interval. Here
the backup is a deep copy of the items the transaction names, restored if it fails; with one
request at a time (the lock above), nothing else can touch the table meanwhile.
"""

import copy
import sys
import threading

import moto.dynamodb.models as dynamodb_models
import moto.server as moto_server
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

_run_simple = moto_server.run_simple


def _run_serialized(host, port, app, **kwargs):
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            body = app(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

    _run_simple(host, port, serialized, **kwargs)


moto_server.run_simple = _run_serialized


class _TableBackupIsTheTable:
    """`copy` as moto's DynamoDB backend sees it: a deep copy of a `Table` during a
    transaction is the table itself (its items are backed up one by one instead)."""

    in_transaction = False

    def __getattr__(self, name):
        return getattr(copy, name)

    def deepcopy(self, x, memo=None):
        if self.in_transaction and isinstance(x, Table):
            return x
        return copy.deepcopy(x, memo)


_copy = _TableBackupIsTheTable()
dynamodb_models.copy = _copy
_transact_write_items = dynamodb_models.DynamoDBBackend.transact_write_items


def _item_backups(backend, transact_items):
    """(table, hash key, deep copy of the item or None) per item the transaction names; None
    when a table has a range key or an action names no key (moto's own backup is kept)."""
    backups = []
    for action in transact_items:
        op = next(iter(action.values()))
        table = backend.tables.get(op.get("TableName"))
        if table is None:
            continue
        key = op.get("Key") or op.get("Item") or {}
        if table.has_range_key or table.hash_key_attr not in key:
            return None
        hash_value = DynamoType(key[table.hash_key_attr])
        backups.append((table, hash_value, copy.deepcopy(table.get_item(hash_value))))
    return backups


def _transact_with_item_backups(self, transact_items):
    backups = _item_backups(self, transact_items)
    if backups is None:
        return _transact_write_items(self, transact_items)
    _copy.in_transaction = True
    try:
        return _transact_write_items(self, transact_items)
    except Exception:
        for table, hash_value, item in reversed(backups):
            if item is None:
                table.items.pop(hash_value, None)
            else:
                table.items[hash_value] = item
        raise
    finally:
        _copy.in_transaction = False


dynamodb_models.DynamoDBBackend.transact_write_items = _transact_with_item_backups

if __name__ == "__main__":
    moto_server.main(sys.argv[1:])
