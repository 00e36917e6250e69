/**
 * Every Redis key rollgate writes outside BullMQ, in one place. Braces are Redis Cluster hash
 * tags: what must live together (one session's state and records; one task) shares a slot.
 */
export function keys(prefix: string) {
  return {
    task: (id: string) => `${prefix}:{t:${id}}:task`,
    taskEvents: (id: string) => `${prefix}:{t:${id}}:events`,
    taskIndex: () => `${prefix}:{tasks}:index`,
    /** Task ids whose submission began and has not been seen through to a queued job (by submit time). */
    submitting: () => `${prefix}:{tasks}:submitting`,
    submitSweep: () => `${prefix}:{tasks}:submit-sweep`,
    group: (id: string) => `${prefix}:{g:${id}}:group`,
    groupTasks: (id: string) => `${prefix}:{g:${id}}:tasks`,
    groupFinished: (id: string) => `${prefix}:{g:${id}}:finished`,
    session: (id: string) => `${prefix}:{s:${id}}:session`,
    /** Set when a session id is closed before any session was opened under it: it can no longer be opened. */
    sessionClosedUnopened: (id: string) => `${prefix}:{s:${id}}:closed-unopened`,
    records: (id: string) => `${prefix}:{s:${id}}:records`,
    recordHeads: (id: string) => `${prefix}:{s:${id}}:heads`,
    failures: (id: string) => `${prefix}:{s:${id}}:failures`,
    pendingCalls: (id: string) => `${prefix}:{s:${id}}:pending`,
    tokenHolds: (id: string) => `${prefix}:{s:${id}}:holds`,
    sessionRate: (id: string) => `${prefix}:{s:${id}}:rate`,
    rankLoad: () => `${prefix}:{routing}:load`,
    affinity: (key: string) => `${prefix}:{routing}:affinity:${key}`,
    roundRobin: () => `${prefix}:{routing}:rr`,
    weightVersion: () => `${prefix}:{admin}:weight_version`,
    pause: () => `${prefix}:{admin}:pause`,
    mixedWeights: () => `${prefix}:{admin}:mixed_weights`,
    weightLoad: () => `${prefix}:{admin}:weight_load`,
    loadedEngines: () => `${prefix}:{admin}:loaded_engines`,
    replicas: () => `${prefix}:{admin}:replicas`,
    replicaInflight: (replica: string) => `${prefix}:{admin}:inflight:${replica}`,
    adminChannel: () => `${prefix}:admin`,
    downRanks: () => `${prefix}:{routing}:down`,
    cancelChannel: () => `${prefix}:cancel`,
  };
}
export type Keys = ReturnType<typeof keys>;
