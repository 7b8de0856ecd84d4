// tether's JavaScript client: see README.md and index.d.ts.
export { Tether } from './src/tether.js';
export { Subscription } from './src/subscription.js';
export { TetherError, validChannel } from './src/wire.js';
export { Backoff, Rotation, classifyClose, retryHint } from './src/backoff.js';
