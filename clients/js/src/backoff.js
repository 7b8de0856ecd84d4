// Reconnect delays and URL rotation: the rules of the Rust client (src/client/backoff.rs,
// src/client/urls.rs, docs/protocol.md "The reference client").

/**
 * Full-jitter backoff: the n-th delay (n from 0) is uniform in [0, min(capMs, baseMs·2^n)]
 * milliseconds, raised to a server-given floor when there is one. A connection that stayed up
 * `stableMs` resets n to 0; a shorter one does not, so a server that accepts and drops at once
 * is not hammered.
 */
export class Backoff {
  /**
   * @param {{baseMs?: number, capMs?: number, stableMs?: number}} [cfg] defaults 500, 30000,
   *   10000 (milliseconds)
   * @param {() => number} [random] uniform in [0, 1); Math.random by default
   */
  constructor(cfg = {}, random = Math.random) {
    this.baseMs = nonNegative(cfg.baseMs ?? 500, 'backoff.baseMs');
    this.capMs = nonNegative(cfg.capMs ?? 30000, 'backoff.capMs');
    this.stableMs = nonNegative(cfg.stableMs ?? 10000, 'backoff.stableMs');
    this.random = random;
    /** Failed attempts since the last reset. */
    this.attempt = 0;
  }

  /** min(capMs, baseMs·2^attempt): the upper bound of the next delay before any floor. */
  ceiling() {
    return Math.min(this.capMs, this.baseMs * 2 ** Math.min(this.attempt, 60));
  }

  /**
   * The next delay in ms: max(floorMs, uniform[0, ceiling()]); then the attempt count grows.
   * The floor (a `retry_after_ms` hint) is honoured even above the cap.
   * @param {number} [floorMs]
   */
  next(floorMs = 0) {
    const d = this.random() * this.ceiling();
    this.attempt += 1;
    return Math.max(d, floorMs);
  }

  /**
   * The delay before trying another URL after one failed: max(floorMs, uniform[0,
   * min(capMs, baseMs)]), the first window; the attempt count does not grow.
   * @param {number} [floorMs]
   */
  switchDelay(floorMs = 0) {
    return Math.max(this.random() * Math.min(this.capMs, this.baseMs), floorMs);
  }

  /**
   * Reports how long the last connection stayed up (ms); at least `stableMs` resets the
   * attempt count. Returns whether it did.
   * @param {number} upMs
   */
  connectedFor(upMs) {
    const stable = upMs >= this.stableMs;
    if (stable) this.attempt = 0;
    return stable;
  }
}

/**
 * The URL ring: the first connection goes to the first URL, every reconnect to the next one.
 * While fewer failures than URLs came in a row the next URL is tried after
 * `Backoff.switchDelay`; each time the whole list failed in a row the wait is
 * `Backoff.next` (so the attempt count grows once per round). A stable connection ends the row.
 */
export class Rotation {
  /** @param {string[]} urls checked, not empty @param {Backoff} backoff */
  constructor(urls, backoff) {
    this.urls = urls;
    this.backoff = backoff;
    this.current = 0;
    this.failedInRow = 0;
  }

  /** The URL the next connection goes to. */
  url() {
    return this.urls[this.current];
  }

  /**
   * The connection (or attempt) on url() ended and will be retried. `upMs` is how long it was
   * open (null: it never opened), `floorMs` the server's hint. Moves to the next URL and
   * returns the wait in ms.
   * @param {number | null} upMs @param {number} [floorMs]
   */
  ended(upMs, floorMs = 0) {
    if (upMs != null && this.backoff.connectedFor(upMs)) this.failedInRow = 0;
    this.failedInRow += 1;
    this.current = (this.current + 1) % this.urls.length;
    return this.failedInRow % this.urls.length === 0
      ? this.backoff.next(floorMs)
      : this.backoff.switchDelay(floorMs);
  }
}

/** Close codes after which the client reconnects (docs/protocol.md, reconnect classes). */
const RECONNECT = new Set([1001, 1006, 1011, 1012, 1013, 4001]);

/**
 * Whether a close code means "reconnect" (1001, 1006, 1011, 1012, 1013, 4001) or "stop"
 * (1002, 1003, 1007, 1008, 1009, 1010, 4003, and 1000 or any code not listed).
 * @param {number} code
 * @returns {'reconnect' | 'stop'}
 */
export function classifyClose(code) {
  return RECONNECT.has(code) ? 'reconnect' : 'stop';
}

/**
 * The server's wait hint in a close reason such as `{"reason":"restart","retry_after_ms":850}`:
 * 850. A reason that is not JSON, or has no non-negative integer `retry_after_ms`, gives 0.
 * @param {string} reason
 */
export function retryHint(reason) {
  try {
    const ms = JSON.parse(reason).retry_after_ms;
    return Number.isSafeInteger(ms) && ms >= 0 ? ms : 0;
  } catch {
    return 0;
  }
}

function nonNegative(v, name) {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
    throw new TypeError(`${name} must be a finite number of milliseconds >= 0, got ${v}`);
  }
  return v;
}
