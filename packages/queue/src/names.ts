/**
 * Queue names and their BullMQ prefixes. Each queue gets its own hash-tagged prefix so that, on a
 * Redis Cluster, one queue's keys share a slot while different queues spread across slots.
 */
export const QueueName = {
  rollouts: "rollouts",
  callbacks: "callbacks",
} as const;
export type QueueName = (typeof QueueName)[keyof typeof QueueName];

export function queuePrefix(keyPrefix: string, queue: QueueName): string {
  return `{${keyPrefix}:q:${queue}}`;
}
