import type { Session } from "@rollgate/protocol";
import { parseRankMember, rankMember, type RankRouter, type SessionStore } from "@rollgate/store";
import type { EngineRegistry } from "../engines/registry.js";
import type { EngineHealth } from "./engine-health.js";
import type { GatewayEnv } from "../env.js";

/**
 * Moves a session off a drained rank on its next call: to the least-loaded healthy rank (or its
 * group's rank, by the routing policy). The record of that call says where it came from, because
 * the old rank's prefix cache is lost.
 */
export class Rerouter {
  constructor(
    private readonly registry: EngineRegistry,
    private readonly router: RankRouter,
    private readonly sessions: SessionStore,
    private readonly health: EngineHealth,
    private readonly policy: GatewayEnv["ROLLGATE_ROUTING"],
  ) {}

  healthyMembers(): string[] {
    return this.registry.members().filter((m) => !this.health.isDown(m));
  }

  async ensureHealthy(session: Session): Promise<{ session: Session; reroutedFrom: { engine: number; dp_rank: number } | null }> {
    const a = session.assignment;
    if (!a || !this.health.isDown(rankMember(a.engine, a.dp_rank))) return { session, reroutedFrom: null };
    return this.moveOff(session);
  }

  /**
   * Moves a session off its rank now (its rank failed a call the health probes have not caught
   * yet): to another healthy rank by the routing policy; unchanged when there is none.
   */
  async moveOff(session: Session): Promise<{ session: Session; reroutedFrom: { engine: number; dp_rank: number } | null }> {
    const a = session.assignment;
    if (!a) return { session, reroutedFrom: null };
    const current = rankMember(a.engine, a.dp_rank);
    const healthy = this.healthyMembers().filter((m) => m !== current);
    if (healthy.length === 0) return { session, reroutedFrom: null }; // nowhere better: let the call fail clearly
    const next = await this.router.assign(healthy, session.affinity_key ?? undefined, this.policy);
    if (!next) return { session, reroutedFrom: null };
    const { engine, dpRank } = parseRankMember(next);
    const target = this.registry.target(engine, dpRank);
    const served = await this.registry.servedModel(engine).catch(() => a.served_model);
    const assignment = { engine, engine_url: target.engine.url, dp_rank: dpRank, served_model: served };
    const reroutedFrom = { engine: a.engine, dp_rank: a.dp_rank };
    if (!(await this.sessions.reassign(session.id, current, assignment, next))) {
      // Another call of the session moved it first (or it closed): the slot assign() took is given
      // back, and this call goes where the session is now.
      await this.router.release(next);
      const now = await this.sessions.get(session.id);
      const moved = now?.assignment && rankMember(now.assignment.engine, now.assignment.dp_rank) !== current;
      return moved ? { session: now, reroutedFrom } : { session, reroutedFrom: null };
    }
    // assign() counted the session on its new rank; take it off the old one.
    await this.router.release(current);
    return { session: { ...session, assignment }, reroutedFrom };
  }
}
