import type { Cluster, Redis } from "ioredis";

/** A single Redis or a Redis Cluster: every key family works on both (see keys.ts for the hash tags). */
export type RedisClient = Redis | Cluster;
