// Headless Chromium for the browser tests: the client's directory served on 127.0.0.1:0, a
// tether server, and a page, all stopped when the test ends.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import puppeteer from 'puppeteer-core';

import { startTether } from './helpers.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const TYPES = { '.js': 'text/javascript', '.html': 'text/html' };

/**
 * Serves clients/js/ (and the test page at /page.html, an empty one at /blank.html) on
 * 127.0.0.1:0. In example.html the README's server address (ws://127.0.0.1:8080/ws) becomes
 * `wsUrl`, the test's server.
 */
async function serveStatic(wsUrl) {
  const server = http.createServer((req, res) => {
    const p = new URL(req.url, 'http://x').pathname;
    if (p === '/blank.html') {
      // A page of this origin with nothing on it, for tests that script it themselves.
      res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>blank</title>');
      return;
    }
    const file = p === '/page.html' ? path.join(ROOT, 'test/browser/page.html') : path.join(ROOT, path.normalize(p));
    if (!file.startsWith(ROOT) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      res.writeHead(404).end('not found');
      return;
    }
    let body = fs.readFileSync(file, 'utf8');
    if (p === '/example.html') body = body.replace('ws://127.0.0.1:8080/ws', wsUrl);
    res.writeHead(200, { 'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
    res.end(body);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return server;
}

/**
 * A tether server (config `toml`), the static server and a headless Chromium page, all stopped
 * when test `t` ends (the server in `ctx.server` then, which a test may replace).
 */
export async function launch(t, toml = '') {
  assert.ok(fs.existsSync(CHROMIUM), `chromium not found at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`);
  const ctx = { server: await startTether({ toml }), errors: [] };
  ctx.web = await serveStatic(ctx.server.url);
  ctx.browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-quic', '--disable-background-networking', '--disable-component-update'] });
  t.after(async () => {
    await ctx.browser.close();
    ctx.web.close();
    await ctx.server.stop();
  });
  ctx.page = await ctx.browser.newPage();
  ctx.page.on('pageerror', (e) => ctx.errors.push(String(e)));
  ctx.base = `http://127.0.0.1:${ctx.web.address().port}`;
  return ctx;
}

