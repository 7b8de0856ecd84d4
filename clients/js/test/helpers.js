// Test helpers: a real `tether serve` process on 127.0.0.1 (stopped by PID), HTTP publish and
// /metrics, a TCP proxy that can cut (RST), hold or blackhole connections, and bounded waits.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = fileURLToPath(new URL('../../../', import.meta.url));
/** The tether binary: $TETHER_BIN, else target/release/tether of this repository. */
export const TETHER_BIN = process.env.TETHER_BIN || path.join(REPO, 'target/release/tether');

/**
 * Polls `pred` every 10 ms until it returns a truthy value (returned), or rejects after `ms`
 * with `what` and, when given, `seen()` (what the test saw instead).
 */
export async function waitFor(pred, ms, what, seen) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() >= end) throw new Error(`timed out after ${ms} ms waiting for ${what}${seen ? `; saw ${seen()}` : ''}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A running `tether serve`, started by startTether. */
export class TetherProcess {
  constructor(child, addr, configPath, log) {
    this.child = child;
    this.pid = child.pid;
    this.addr = addr;
    this.port = Number(addr.split(':').pop());
    this.url = `ws://${addr}/ws`;
    this.http = `http://${addr}`;
    this.configPath = configPath;
    this.log = log;
    this.exit = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  }

  /** Sends `signal` to the server's PID and waits (up to `ms`) for it to exit. */
  async stop(signal = 'SIGTERM', ms = 10000) {
    if (this.child.exitCode == null && this.child.signalCode == null) process.kill(this.pid, signal);
    const timer = new Promise((_, rej) => setTimeout(() => rej(new Error(`tether ${this.pid} did not exit within ${ms} ms of ${signal}`)), ms).unref());
    const st = await Promise.race([this.exit, timer]);
    fs.rmSync(this.configPath, { force: true });
    return st;
  }

  /** SIGKILL if still running (cleanup). */
  kill() {
    if (this.child.exitCode == null && this.child.signalCode == null) process.kill(this.pid, 'SIGKILL');
    fs.rmSync(this.configPath, { force: true });
  }

  /** POST /publish/{ch} with a JSON body; returns the seq. */
  async publish(ch, data, headers = {}) {
    const r = await fetch(`${this.http}/publish/${ch}`, { method: 'POST', body: JSON.stringify(data), headers });
    const text = await r.text();
    if (r.status !== 200) throw new Error(`publish ${ch}: HTTP ${r.status}: ${text}`);
    return JSON.parse(text).seq;
  }

  /** Sum of the samples of the Prometheus metric `name` (labels containing `label`, if given). */
  async metric(name, label = '') {
    const text = await (await fetch(`${this.http}/metrics`)).text();
    let sum = 0;
    for (const line of text.split('\n')) {
      const m = /^([a-z_]+)(\{[^}]*\})? (\S+)$/.exec(line);
      if (m && m[1] === name && (m[2] ?? '').includes(label)) sum += Number(m[3]);
    }
    return sum;
  }
}

let serial = 0;

/**
 * Starts `tether serve --config <file with toml> --listen 127.0.0.1:<port> --cores <cores>` and
 * waits (10 s at most) for its `tether listening on ADDR` line. Rejects with the log when it
 * exits first (e.g. the port is still held by a draining process).
 */
export async function startTether({ toml = '', port = 0, cores = 1 } = {}) {
  if (!fs.existsSync(TETHER_BIN)) throw new Error(`tether binary not found at ${TETHER_BIN} (set TETHER_BIN, or cargo build --release)`);
  const configPath = path.join(os.tmpdir(), `tether-js-${process.pid}-${serial++}.toml`);
  fs.writeFileSync(configPath, toml);
  const child = spawn(TETHER_BIN, ['serve', '--config', configPath, '--listen', `127.0.0.1:${port}`, '--cores', String(cores)], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, TETHER_LOG: process.env.TETHER_LOG ?? 'warn' },
  });
  const log = [];
  child.stderr.on('data', (d) => {
    log.push(String(d));
    if (log.length > 200) log.shift();
  });
  let out = '';
  try {
    const addr = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`tether did not print its address within 10 s: ${log.join('')}`)), 10000);
      child.stdout.on('data', (d) => {
        out += d;
        const m = /tether listening on (\S+)/.exec(out);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`tether exited with ${code} before listening: ${log.join('')}`));
      });
    });
    return new TetherProcess(child, addr, configPath, log);
  } catch (e) {
    if (child.exitCode == null) child.kill('SIGKILL');
    fs.rmSync(configPath, { force: true });
    throw e;
  }
}

/**
 * Starts tether on `port` as soon as a previous process (draining) has let go of it: retries
 * every 20 ms for `ms`.
 */
export async function startTetherOn(port, toml, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    try {
      return await startTether({ toml, port });
    } catch (e) {
      if (Date.now() >= end) throw e;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

/**
 * A TCP proxy on 127.0.0.1:0 in front of `port`, so a test can end the client's connection the
 * way a network does: cut() resets it (RST), hold() stops passing the server's bytes to the
 * client, blackhole() stops passing anything (a silent dead peer). New connections always pass.
 */
export class Proxy {
  static async start(port) {
    const p = new Proxy();
    p.pairs = new Set();
    p.accepted = 0;
    p.server = net.createServer((client) => {
      p.accepted += 1;
      const up = net.connect(port, '127.0.0.1');
      const pair = { client, up };
      p.pairs.add(pair);
      client.pipe(up);
      up.pipe(client);
      const end = () => {
        p.pairs.delete(pair);
        client.destroy();
        up.destroy();
      };
      client.on('error', end).on('close', end);
      up.on('error', end).on('close', end);
    });
    await new Promise((r) => p.server.listen(0, '127.0.0.1', r));
    p.port = p.server.address().port;
    p.url = `ws://127.0.0.1:${p.port}/ws`;
    return p;
  }

  /** Resets every open connection (RST to the client, close to the server). */
  cut() {
    for (const { client, up } of this.pairs) {
      client.resetAndDestroy();
      up.destroy();
    }
    this.pairs.clear();
  }

  /** Stops passing the server's bytes to the client on the open connections. */
  hold() {
    for (const { client, up } of this.pairs) {
      up.unpipe(client);
      up.pause();
    }
  }

  /** Stops passing bytes both ways on the open connections, without closing them. */
  blackhole() {
    for (const { client, up } of this.pairs) {
      up.unpipe(client);
      client.unpipe(up);
      up.pause();
      client.pause();
    }
  }

  async close() {
    this.cut();
    await new Promise((r) => this.server.close(r));
  }
}

/** A localStorage-like object over a Map (getItem/setItem), for page-reload tests. */
export class MemoryStorage {
  constructor() {
    this.map = new Map();
  }

  getItem(k) {
    return this.map.has(k) ? this.map.get(k) : null;
  }

  setItem(k, v) {
    this.map.set(k, String(v));
  }
}

/** Percentile `p` (0–100) of sorted numbers, nearest rank. */
export function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

/**
 * A tether server (config `toml`), a Proxy in front of it and a Tether client (options `opts`)
 * connected through the proxy; all closed and stopped when test `t` ends.
 */
export async function proxiedClient(t, Tether, toml, opts) {
  const server = await startTether({ toml });
  const proxy = await Proxy.start(server.port);
  const client = new Tether(proxy.url, opts);
  t.after(async () => {
    client.close();
    await proxy.close();
    await server.stop();
  });
  return { server, proxy, client };
}
