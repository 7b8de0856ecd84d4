// One channel's subscription: the resume point (the last COMMITTED seq and its epoch), the
// queue of received items, and their delivery to the application one at a time, in seq order.

import { TetherError } from './wire.js';

/**
 * A subscription to one channel, returned by `Tether.subscribe`. It outlives connections: every
 * (re)connection subscribes again with `from` = the last committed seq and its epoch.
 */
export class Subscription {
  /**
   * @param {import('./tether.js').Tether} tether
   * @param {string} ch
   * @param {{seq: number, epoch?: string} | null} position the resume point, if any
   * @param {object} opts onMessage, onReset, onSubscribed, onUnsubscribed, onError, autoCommit
   */
  constructor(tether, ch, position, opts) {
    /** The channel name. */
    this.ch = ch;
    this.tether = tether;
    this.opts = opts;
    this.autoCommit = opts.autoCommit !== false;
    /** The resume point: {seq, epoch} of the last committed message, or null. */
    this.position = position;
    /** Last seq handed to onMessage (or the resume baseline); later copies are skipped. */
    this.delivered = position ? position.seq : null;
    /** Epoch of the item delivered last: a commit is recorded under it. */
    this.deliveredEpoch = position?.epoch;
    /** Items received and not yet delivered, in arrival order. */
    this.queue = [];
    this.pumping = false;
    this.active = true;
    /** Subscribed with `"join_leave": true` on every connection. */
    this.joinLeave = opts.joinLeave === true;
    /** The server confirmed it on some connection (a later confirmation is a resubscription). */
    this.wasConfirmed = false;
  }

  /**
   * Records that the application has processed and recorded `seq`: later (re)subscriptions
   * resume after it, and with `storage` it survives a page reload. Automatic after each
   * onMessage that resolves, unless `autoCommit: false`.
   * @param {number} seq a non-negative integer
   */
  commit(seq) {
    if (!Number.isSafeInteger(seq) || seq < 0) {
      throw new TypeError(`commit: seq must be a non-negative integer, got ${seq}`);
    }
    this.position = { seq, epoch: this.deliveredEpoch ?? this.position?.epoch };
    this.tether.saved(this);
  }

  /** Stops receiving the channel (sends `unsub`); the committed position is kept. */
  unsubscribe() {
    if (!this.active) return;
    this.active = false;
    this.queue.length = 0;
    this.tether.unsubscribed(this);
    this.tether.drained();
  }

  /** The server answered `subscribed` (a live subscription after `seq`, in `epoch`). */
  subscribed(f) {
    if (!this.position) {
      // Starting live: the head is where a reconnect must pick up, even before any commit.
      this.position = { seq: f.seq, epoch: f.epoch };
      this.delivered = f.seq;
      this.deliveredEpoch = f.epoch;
      this.tether.saved(this);
    } else if (this.position.epoch == null) {
      this.position.epoch = f.epoch;
      this.deliveredEpoch ??= f.epoch;
    }
    this.call('onSubscribed', { ch: f.ch, seq: f.seq, epoch: f.epoch, recovered: f.recovered === true });
  }

  /**
   * The server confirmed the subscription on this connection (`subscribed`, or `reset`
   * answering the `sub`). After the first time, joins and leaves while no connection was open
   * were not seen: a `join_leave` subscription's application is told its member list may be
   * stale (onPresenceReset with `reconnected: true`), before any diff of this connection.
   */
  confirmed() {
    if (this.joinLeave && this.wasConfirmed) this.call('onPresenceReset', { ch: this.ch, reconnected: true });
    this.wasConfirmed = true;
  }

  /** A `msg` or `reset` item, queued in arrival order behind what is being processed. */
  push(item) {
    if (!this.active) return;
    this.queue.push(item);
    if (this.queue.length > this.tether.maxBacklog) this.tether.backlogged();
    if (!this.pumping) this.pump();
  }

  async pump() {
    this.pumping = true;
    try {
      while (this.active && this.queue.length > 0) {
        const item = this.queue.shift();
        if (item.op === 'reset') {
          this.delivered = item.seq;
          this.deliveredEpoch = item.epoch;
          this.position = { seq: item.seq, epoch: item.epoch };
          this.tether.saved(this);
          await this.run('onReset', { ch: this.ch, seq: item.seq, epoch: item.epoch, reason: item.reason, oldest: item.oldest }, null);
          continue;
        }
        if (this.delivered != null && item.seq <= this.delivered && item.epoch === this.deliveredEpoch) {
          this.tether.stats.duplicatesDropped += 1;
          continue;
        }
        if (this.delivered != null && item.seq > this.delivered + 1 && item.epoch === this.deliveredEpoch) {
          this.tether.stats.gaps += 1;
        }
        this.delivered = item.seq;
        this.deliveredEpoch = item.epoch;
        const msg = { ch: this.ch, seq: item.seq, epoch: item.epoch, data: item.data };
        const ok = await this.run('onMessage', msg, item.seq);
        if (ok && this.autoCommit && this.active) this.commit(item.seq);
      }
    } finally {
      this.pumping = false;
    }
    this.tether.drained();
  }

  /** Calls handler `name` and waits for it; a throw is reported, not fatal. */
  async run(name, arg, seq) {
    const f = this.opts[name];
    if (typeof f !== 'function') return true;
    try {
      await f.call(this, arg, this);
      return true;
    } catch (cause) {
      const what = seq == null ? name : `${name} for seq ${seq}`;
      this.tether.report(new TetherError('handler', `${this.ch}: ${what} threw: ${cause?.message ?? cause}`, { ch: this.ch, cause }));
      return false;
    }
  }

  /** Calls an informational handler without waiting. */
  call(name, arg) {
    this.run(name, arg, null);
  }
}
