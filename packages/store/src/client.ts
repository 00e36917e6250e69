import type { Cluster, Redis } from "ioredis";

/**
 * A single Redis or a Redis Cluster: every key family works on both (see keys.ts for the hash tags).
 * The one declaration of the type: the queue package's connections (createRedis) are of it too.
 */
export type RedisClient = Redis | Cluster;
