// TypeScript declarations for tether's JavaScript client (clients/js/README.md).

/** Full-jitter backoff settings, in milliseconds. */
export interface BackoffOptions {
  /** Ceiling of the first delay; the ceiling doubles per failed attempt. Default 500. */
  baseMs?: number;
  /** Largest ceiling. Default 30000. */
  capMs?: number;
  /** A connection up this long resets the attempt count. Default 10000. */
  stableMs?: number;
}

/** The missed-heartbeat timer (a page cannot see WebSocket pings, so silence is probed). */
export interface HeartbeatOptions {
  /** Silence (no frame from the server) after which a probe is sent. Default 25000 ms, the server's default ping interval. */
  idleMs?: number;
  /** How long the probe may go unanswered before the socket counts as dead (a 1006). Default 10000 ms. */
  timeoutMs?: number;
}

/** localStorage / sessionStorage, or anything with the same two methods. */
export interface PositionStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export interface TetherOptions {
  /** A JWT sent as `?token=`: a string, or a function called before every connection attempt and on `token_expired`. */
  token?: string | (() => string | Promise<string>);
  backoff?: BackoffOptions;
  /** `false` turns the missed-heartbeat timer off. */
  heartbeat?: HeartbeatOptions | false;
  /** Keeps committed positions (JSON under `storageKey`) across page reloads. */
  storage?: PositionStorage;
  /** Default "tether.positions". */
  storageKey?: string;
  /** The WebSocket class; required where there is no global one (Node 20: `import { WebSocket } from "ws"`). */
  WebSocket?: new (url: string) => WebSocket;
  /**
   * 'websocket' (default); 'sse': stream over Server-Sent Events (GET /sse, receive only:
   * publish and presence queries are refused with code 'transport'); 'auto': WebSocket, and
   * Server-Sent Events from the second WebSocket in a row that fails to open.
   */
  transport?: 'websocket' | 'sse' | 'auto';
  /** The EventSource class for 'sse' and 'auto'; default the global one (browsers). */
  EventSource?: new (url: string) => EventSource;
  /**
   * Most messages one subscription may hold received but not yet processed; past it the client
   * closes the socket (reported as a `disconnected` with code 4000), works the backlog off, then
   * reconnects and resumes from the committed seq. Default 10000.
   */
  maxBacklog?: number;
  /** A connection attempt not open after this long is abandoned (a 1006). Default 10000 ms. */
  connectTimeoutMs?: number;
  /** Reconnect promptly on `online` / the tab becoming visible. Default true (in a page). */
  lifecycle?: boolean;
  /** Uniform random numbers in [0, 1) for the jitter. Default Math.random. */
  random?: () => number;
}

/** A resume point: the last committed seq of a channel and the epoch it belongs to. */
export interface Position {
  seq: number;
  epoch?: string;
}

export interface Message<T = unknown> {
  ch: string;
  /** 1, 2, 3 … per channel and epoch. */
  seq: number;
  epoch: string;
  data: T;
}

/** The resume point is gone: start over (re-fetch state elsewhere); messages continue at seq + 1. */
export interface Reset {
  ch: string;
  seq: number;
  epoch: string;
  reason: 'evicted' | 'epoch' | string;
  oldest: number;
}

export interface Subscribed {
  ch: string;
  /** The channel's head when the subscription went live. */
  seq: number;
  epoch: string;
  /** True when the `from` sent was honoured (a resume). */
  recovered: boolean;
}

/** One member of a presence channel: one connection subscribed to it. */
export interface Member {
  /** The connection's id: unique across nodes and over a node's life, opaque. */
  client: string;
  /** The JWT `sub` of its token; absent on a server without `[auth]`. */
  user?: string;
  /** The token's `info` claim (any JSON, bounded by the server's `presence.info_max_bytes`); absent when it has none. */
  info?: unknown;
}

/** How many are in a presence channel (`presence_stats`). */
export interface PresenceStats {
  ch: string;
  /** Connections subscribed (tracked members). */
  clients: number;
  /** Distinct JWT `sub`s among them; 0 without `[auth]`. */
  users: number;
}

/** Who joined and left in one window of the server's `presence.window_ms` (`presence_diff`). */
export interface PresenceDiff {
  ch: string;
  joins: Member[];
  leaves: Member[];
}

/**
 * The member list the application holds may be wrong: ask `presence(ch)` again, then apply the
 * diffs that follow. `reconnected` is true when the client raised it after subscribing again on
 * a new connection (joins and leaves while away are lost), false for the server's
 * `presence_reset` (more changed in one window than `presence.max_diff`).
 */
export interface PresenceReset {
  ch: string;
  reconnected: boolean;
}

export interface SubscribeOptions<T = unknown> {
  /** The last seq already processed (0 replays from seq 1); used when `storage` has no position. */
  from?: number;
  /** The epoch `from` belongs to. */
  epoch?: string;
  /** Called once per message, in seq order, one at a time; a returned promise is awaited. */
  onMessage?(msg: Message<T>, sub: Subscription): unknown;
  /** Called in order with the messages; the position moves to the reset's seq and epoch. */
  onReset?(reset: Reset, sub: Subscription): unknown;
  onSubscribed?(info: Subscribed, sub: Subscription): unknown;
  /** The server refused the subscription (`forbidden`, `limit` …). */
  onError?(err: TetherError, sub: Subscription): unknown;
  /**
   * A backend ended the subscription (`POST /api/unsubscribe`, docs/api.md): no message of the
   * channel follows and the client does not subscribe to it again.
   */
  onUnsubscribed?(info: { ch: string; reason: 'server' }, sub: Subscription): unknown;
  /** Commit each message once onMessage has resolved. Default true. */
  autoCommit?: boolean;
  /**
   * Also receive the channel's joins and leaves (`"join_leave": true`; the channel's rule needs
   * `join_leave = true`, else the server refuses the subscription with `presence_off`, reported
   * through onError, and it is not made again). Default false.
   */
  joinLeave?: boolean;
  /** With joinLeave: one window's joins and leaves, called as it arrives (not queued behind messages, not awaited). */
  onPresenceDiff?(diff: PresenceDiff, sub: Subscription): unknown;
  /** With joinLeave: the member list may be stale (after every reconnect, or the server's presence_reset); called as onPresenceDiff is. */
  onPresenceReset?(reset: PresenceReset, sub: Subscription): unknown;
}

export interface Ack {
  id: string;
  ch: string;
  seq: number;
}

export interface Disconnected {
  /**
   * The close code; 1006 when the connection ended without one (a cut, a dead socket, a failed
   * attempt); 4000 when the client closed it itself over a backlog (`maxBacklog`).
   */
  code: number;
  reason: string;
  /** False after a stop code: the client has stopped. */
  willRetry: boolean;
  /** The wait before the next attempt, or null (stopped, or waiting for a backlog). */
  retryInMs: number | null;
  url: string;
}

export declare class TetherError extends Error {
  name: 'TetherError';
  /** closed: a stop close code; refused: the server's `error`; protocol: not protocol v1; shutdown: close(); handler: a handler threw. */
  kind: 'closed' | 'refused' | 'protocol' | 'shutdown' | 'handler';
  /** With kind 'closed'. */
  closeCode?: number;
  /** With kind 'refused': the server's error code (`forbidden`, `limit`, `bad_channel`, `presence_off` …). */
  code?: string;
  /** With kind 'refused', when the server gave one (a `limit`): milliseconds before asking again. */
  retryAfterMs?: number;
  reason?: string;
  ch?: string;
  id?: string;
  cause?: unknown;
}

export declare class Subscription {
  readonly ch: string;
  /** The resume point, or null before the first `subscribed`. */
  readonly position: Position | null;
  /** Records that `seq` is processed and recorded; throws a TypeError for a seq that is not a non-negative integer. */
  commit(seq: number): void;
  unsubscribe(): void;
}

export declare class Tether {
  /** @throws TypeError naming the URL entry or option that is wrong. */
  constructor(urls: string | string[], opts?: TetherOptions);
  readonly state: 'connecting' | 'open' | 'waiting' | 'backlogged' | 'stopped' | 'closed';
  readonly stats: { connects: number; duplicatesDropped: number; gaps: number };
  on(event: 'connected', fn: (e: { url: string; transport: 'websocket' | 'sse' }) => void): () => void;
  on(event: 'disconnected', fn: (e: Disconnected) => void): () => void;
  on(event: 'error', fn: (e: TetherError) => void): () => void;
  /** @throws TypeError for a bad channel name or option; Error when already subscribed. */
  subscribe<T = unknown>(ch: string, opts?: SubscribeOptions<T>): Subscription;
  publish(ch: string, data: unknown, opts?: { id?: string }): Promise<Ack>;
  /**
   * Every member of presence channel `ch`, all pages; asked again from the first page after a
   * reconnect. Rejects with a TypeError (bad channel), a TetherError 'refused' (`presence_off`,
   * `forbidden`, `limit` with `retryAfterMs`) or the terminal error.
   */
  presence(ch: string): Promise<Member[]>;
  /** How many are in presence channel `ch`. Rejects as presence(). */
  presenceStats(ch: string): Promise<PresenceStats>;
  close(): void;
}

export declare class Backoff {
  constructor(cfg?: BackoffOptions, random?: () => number);
  attempt: number;
  ceiling(): number;
  next(floorMs?: number): number;
  switchDelay(floorMs?: number): number;
  connectedFor(upMs: number): boolean;
}

export declare class Rotation {
  constructor(urls: string[], backoff: Backoff);
  url(): string;
  ended(upMs: number | null, floorMs?: number): number;
}

export declare function classifyClose(code: number): 'reconnect' | 'stop';
export declare function retryHint(reason: string): number;
export declare function validChannel(ch: string): boolean;
