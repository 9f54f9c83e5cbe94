// Types of figtank.js, the WebSocket client of figtank's HTTP listener (served at
// /figtank.d.ts). The module form: import {Figtank} from "/figtank.mjs"; the classic
// script (/figtank.js) defines the same class as window.Figtank.

/** Where a client is. Stopped for good: "revoked", "refused", "unauthorized", "closed"
 * after close(). Going on: "open", "closed" (lost; it reconnects), "expired" (its token
 * is refreshed through getToken), "unavailable"/"available" (a subscription's upstream),
 * "rewound" (a subscription resumed before its last offset: the server's log is shorter
 * than it was, e.g. a re-created topic; delivery goes on from where the server starts). */
export type FigtankState =
  | "open" | "closed" | "expired" | "revoked" | "refused" | "unauthorized"
  | "unavailable" | "available" | "rewound";

export interface FigtankOptions {
  /** Bearer token (sent as access_token=, as a browser WebSocket can set no header). */
  token?: string;
  /** Called for a fresh token when the server says the one in use expired (close 4001)
   * or is not accepted (401); without it the client stops ("unauthorized"). */
  getToken?: () => string | Promise<string>;
  /** Reconnection backoff: first delay and the most (ms; 250 and 5000, with jitter). */
  minDelay?: number;
  maxDelay?: number;
  /** Publishes kept waiting beyond the server's publish window (10000); more reject. */
  maxQueued?: number;
  /** Every change of state, with the close code (or HTTP status) and reason. */
  onstate?: (state: FigtankState, code?: number, reason?: string) => void;
}

export interface SubscribeOptions {
  partition?: number;
  /** Where to start when no offset is given (default "latest"). */
  from?: "earliest" | "latest";
  /** Start after this offset. */
  offset?: number;
}

export interface PublishOptions {
  partition?: number;
  key?: string;
}

/** A message delivered to a subscription. */
export interface FigtankMessage {
  op: "data";
  topic: string;
  partition: number;
  offset: number;
  timestamp: number;
  key?: string | null;
  key_base64?: string;
  value?: string;
  value_base64?: string;
}

/** Where a publish was appended, once durable. */
export interface PublishAck {
  partition: number;
  offset: number | null;
}

export declare class Figtank {
  constructor(url: string, options?: FigtankOptions);
  /** The server's publish window (0 until its hello). */
  readonly window: number;
  /** Publishes sent and not acknowledged yet (at most window). */
  readonly inFlight: number;
  /** Deliver the partition's messages to handler, each once and in order, across
   * reconnections; returns a function that unsubscribes. */
  subscribe(topic: string, handler: (message: FigtankMessage) => void,
            options?: SubscribeOptions): () => void;
  unsubscribe(topic: string, partition?: number): void;
  /** Resolves once the message is durable; rejects when the client stops first or
   * maxQueued publishes already wait. */
  publish(topic: string, value: string, options?: PublishOptions): Promise<PublishAck>;
  /** Stop: no reconnection; the publishes not acknowledged are rejected. */
  close(): void;
}
