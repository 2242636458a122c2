// The denial cache: a bounded LRU of refusals, each answered again locally until its
// retry_after_ms has passed on the limiter's monotonic clock. It only ever refuses: admissions are
// never cached, and a refusal is reused only for a request that asks at least as much.

import type { Decision } from './core.js';

interface Entry {
  key: string;
  /** The cost refused (take: the MAX granted nothing). */
  cost: number;
  decision: Decision;
  /** When it was refused, on the monotonic clock. */
  since: number;
}

export class DenialCache {
  private readonly entries = new Map<string, Entry>();
  /** The entries of each key, for reset and refund. */
  private readonly byKey = new Map<string, Set<string>>();

  constructor(
    readonly size: number,
    private readonly now: () => number,
  ) {}

  /** A cached refusal for a request of `cost` (at least the one refused), counted down to now:
   * `retryAfterMs` and `resetAfterMs` are what remains of them; null when there is none.
   * `bounded`: a cost above the decision's `limit` is never admitted (a check, not a take);
   * `asked`, the request's own cost, where `cost` is compared to a take's MAX (Infinity: any). */
  get(id: string, cost: number, bounded: boolean, asked = cost): Decision | null {
    const entry = this.entries.get(id);
    if (!entry) return null;
    const elapsed = this.now() - entry.since;
    if (!(elapsed < entry.decision.retryAfterMs)) {
      this.remove(id, entry);
      return null;
    }
    // A smaller cost may pass; a cost above the limit never can (Redis says so: -1, not kept).
    if (cost < entry.cost || (bounded && asked > entry.decision.limit)) return null;
    // Most recently used last.
    this.entries.delete(id);
    this.entries.set(id, entry);
    return {
      ...entry.decision,
      granted: 0,
      retryAfterMs: Math.ceil(entry.decision.retryAfterMs - elapsed),
      resetAfterMs: Math.max(0, Math.ceil(entry.decision.resetAfterMs - elapsed)),
      delayMs: 0,
      source: 'cache',
    };
  }

  /** Keeps a refusal of `cost` with a wait. Not kept: retry_after_ms -1 (never: the caller's
   * mistake, and a limit can change), and a refusal of cost 0 (it started no block where one of
   * cost 1 or more would: answering that one here would skip the block). */
  put(id: string, key: string, cost: number, decision: Decision): void {
    if (decision.allowed || decision.granted > 0 || !(decision.retryAfterMs > 0) || cost === 0) return;
    const old = this.entries.get(id);
    if (old) this.remove(id, old);
    this.entries.set(id, { key, cost, decision, since: this.now() });
    let ids = this.byKey.get(key);
    if (!ids) this.byKey.set(key, (ids = new Set()));
    ids.add(id);
    if (this.entries.size > this.size) {
      const [oldest, entry] = this.entries.entries().next().value as [string, Entry];
      this.remove(oldest, entry);
    }
  }

  /** Drops every refusal of `key` (reset, refund, a batch's refund through this limiter). */
  dropKey(key: string): void {
    const ids = this.byKey.get(key);
    if (!ids) return;
    for (const id of ids) this.entries.delete(id);
    this.byKey.delete(key);
  }

  /** Drops every refusal whose entry id mentions `part` (a policy set or deleted here). */
  dropMatching(part: string): void {
    for (const [id, entry] of [...this.entries]) if (id.includes(part)) this.remove(id, entry);
  }

  get length(): number {
    return this.entries.size;
  }

  private remove(id: string, entry: Entry): void {
    this.entries.delete(id);
    const ids = this.byKey.get(entry.key);
    ids?.delete(id);
    if (ids && ids.size === 0) this.byKey.delete(entry.key);
  }
}
