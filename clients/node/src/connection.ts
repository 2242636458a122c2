// The connection: the adapter of node-redis (4 to 6, a client or a cluster) and ioredis (5 and 6,
// Redis or Cluster), told apart by what they have, used through their public API (`sendCommand`,
// `call`, a cluster's primaries), never patched; and which of their errors say that Redis is
// unavailable.

import { RateLimitError } from './types.js';

/** Sends one command; `key` routes it in a cluster, `readonly` lets a cluster send it to a replica
 * where the client is configured to. */
export type Send = (args: string[], key?: string, readonly?: boolean) => Promise<unknown>;

export interface Transport {
  /** `'node-redis'` or `'ioredis'`. */
  readonly kind: 'node-redis' | 'ioredis';
  readonly cluster: boolean;
  readonly send: Send;
  /** A sender per primary (a cluster's masters; the client itself otherwise): functions and
   * policies live on each. */
  primaries(): Promise<Array<(args: string[]) => Promise<unknown>>>;
}

type AnyFn = (...args: unknown[]) => unknown;
/** One of an ioredis Cluster's nodes: a Redis client with its address. */
type IoNode = { call: AnyFn; options: { host: string; port: number } };
type Nodes = (role: 'master') => IoNode[];
const isFn = (value: unknown): value is AnyFn => typeof value === 'function';

/** The client's adapter; a TypeError for anything that is neither client. */
export function transport(client: unknown): Transport {
  const c = client as Record<string, unknown> | null;
  if (typeof c !== 'object' || c === null) {
    throw new TypeError('RateLimiter needs a node-redis client (createClient, createCluster) or an ioredis client (new Redis, new Cluster)');
  }
  // ioredis: `call` on Redis and Cluster; a Cluster has `nodes` and `isCluster`.
  if (isFn(c.call) && isFn(c.sendCommand) && !isFn(c.nodeClient)) {
    const ioredis = c as { call: AnyFn; isCluster?: boolean; nodes?: Nodes; slots?: string[][] };
    const cluster = ioredis.isCluster === true || isFn(ioredis.nodes);
    const call = (target: { call: AnyFn }) => (args: string[]) => target.call(args[0], ...args.slice(1)) as Promise<unknown>;
    const viaCluster = call(ioredis);
    // ioredis's Cluster routes the commands it knows by their keys, and sends the others (the
    // module's) to any master, following MOVED. Sent to the master of the key's slot instead,
    // from the slot table the Cluster keeps; MOVED or ASK (a slot moving) goes the Cluster's way.
    const send: Send = !cluster
      ? viaCluster
      : async (args, key) => {
          const owner = key === undefined ? undefined : ioredis.slots?.[slot(key)]?.[0];
          const node = owner && (ioredis.nodes as Nodes)('master').find((n) => `${n.options.host}:${n.options.port}` === owner);
          if (!node) return viaCluster(args);
          try {
            return await call(node)(args);
          } catch (error) {
            if (isReplyError(error) && /^(MOVED|ASK) /.test(error.message)) return viaCluster(args);
            throw error;
          }
        };
    return {
      kind: 'ioredis',
      cluster,
      send,
      // eslint-disable-next-line @typescript-eslint/require-await -- async: a throw of nodes() rejects, as every call's does
      async primaries() {
        if (!cluster) return [call(ioredis)];
        return (ioredis.nodes as Nodes)('master').map((node) => call(node));
      },
    };
  }
  // node-redis cluster: `sendCommand(firstKey, isReadonly, args)`, `masters` and `nodeClient`.
  if (isFn(c.sendCommand) && isFn(c.nodeClient)) {
    const cluster = c as { sendCommand: AnyFn; nodeClient: (master: unknown) => unknown; masters?: unknown[]; getMasters?: () => unknown[] };
    return {
      kind: 'node-redis',
      cluster: true,
      send: (args, key, readonly) => cluster.sendCommand(key, readonly ?? false, args) as Promise<unknown>,
      async primaries() {
        const masters = cluster.masters ?? (cluster.getMasters as () => unknown[])();
        const clients = (await Promise.all(masters.map((m) => cluster.nodeClient(m)))) as Array<{ sendCommand: AnyFn }>;
        return clients.map((node) => (args: string[]) => node.sendCommand(args) as Promise<unknown>);
      },
    };
  }
  // node-redis client: `sendCommand(args)`.
  if (isFn(c.sendCommand)) {
    const redis = c as { sendCommand: AnyFn };
    const send = (args: string[]) => redis.sendCommand(args) as Promise<unknown>;
    return { kind: 'node-redis', cluster: false, send, primaries: () => Promise.resolve([send]) };
  }
  throw new TypeError('RateLimiter needs a node-redis client (createClient, createCluster) or an ioredis client (new Redis, new Cluster)');
}

/** The transport with every command counted (`rl.stats.commands`). */
export function counting(inner: Transport, count: () => void): Transport {
  return {
    kind: inner.kind,
    cluster: inner.cluster,
    send: (args, key, readonly) => {
      count();
      return inner.send(args, key, readonly);
    },
    primaries: async () =>
      (await inner.primaries()).map((send) => (args: string[]) => {
        count();
        return send(args);
      }),
  };
}

const REPLY_ERRORS = new Set(['ErrorReply', 'ReplyError', 'SimpleError', 'BlobError']);
// Error replies that say the server cannot serve now, not that the call is wrong.
const UNAVAILABLE_REPLY = /^(LOADING|BUSY|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|READONLY|OOM|NOREPLICAS|MISCONF)\b/;

/** An error reply of the server (node-redis `ErrorReply`, ioredis `ReplyError`). */
export function isReplyError(error: unknown): error is Error {
  for (let p = error; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p as { constructor?: { name?: string } }).constructor?.name;
    if (name && REPLY_ERRORS.has(name)) return true;
  }
  return false;
}

/** Redis is down, refuses, does not answer, or answers that it cannot serve now: what `onError`
 * applies to. A reply that says the call is wrong (bad arguments, wrong type, no permission), and
 * errors of the program (TypeError...), are not. */
export function isUnavailable(error: unknown): boolean {
  if (isReplyError(error)) return UNAVAILABLE_REPLY.test(error.message);
  if (error instanceof RateLimitError || error instanceof TypeError || error instanceof RangeError || error instanceof SyntaxError || error instanceof ReferenceError) {
    return false;
  }
  return error instanceof Error;
}

export function replyMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The cluster slot of a key: CRC16 (XMODEM) of its hash tag (`{...}`) or of the whole key, mod 16384. */
export function slot(key: string): number {
  let bytes = new TextEncoder().encode(key);
  const open = bytes.indexOf(0x7b); // {
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i += 1) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}
