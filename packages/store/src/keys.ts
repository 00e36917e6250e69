/**
 * Every Redis key rollgate writes outside BullMQ, in one place. Braces are Redis Cluster hash
 * tags: what must live together (one session's state and records; one task) shares a slot.
 */
export function keys(prefix: string) {
  return {
    task: (id: string) => `${prefix}:{t:${id}}:task`,
    taskIndex: () => `${prefix}:{tasks}:index`,
    session: (id: string) => `${prefix}:{s:${id}}:session`,
    records: (id: string) => `${prefix}:{s:${id}}:records`,
    rankLoad: () => `${prefix}:{routing}:load`,
    affinity: (key: string) => `${prefix}:{routing}:affinity:${key}`,
    weightVersion: () => `${prefix}:{admin}:weight_version`,
  };
}
export type Keys = ReturnType<typeof keys>;
