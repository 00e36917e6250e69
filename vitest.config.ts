import { defineConfig } from "vitest/config";

// Tests import workspace packages through their built dist (the README's test command builds first).
export default defineConfig({
  test: {
    include: ["packages/*/src/**/*.test.ts", "apps/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // test/e2e-agents: the real agent CLIs (test/agents), run by their own config in a separate CI step;
    // test/chaos: the chaos suite (kills, restarts, load), likewise (test/chaos/vitest.config.ts).
    exclude: ["**/node_modules/**", "**/dist/**", "test/e2e-agents/**", "test/chaos/**"],
    globalSetup: ["test/global-setup.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    // Two test files at a time even on 2 cores: most files wait on processes and sockets (engine-sim,
    // gateways, workers), so the second worker fills the idle time (vitest's default is cores - 1).
    maxWorkers: 2,
  },
});
