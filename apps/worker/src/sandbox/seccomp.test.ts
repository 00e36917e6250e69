import { describe, expect, it } from "vitest";
import { seccompFilter } from "./seccomp.js";

/** Runs a classic BPF seccomp program (the four instructions seccomp.ts uses) on one call: the action it returns. */
function run(filter: Buffer, arch: number, nr: number): number {
  const data = { 0: nr, 4: arch } as Record<number, number>;
  let acc = 0;
  for (let pc = 0; pc * 8 < filter.length; pc++) {
    const code = filter.readUInt16LE(pc * 8);
    const jt = filter.readUInt8(pc * 8 + 2);
    const jf = filter.readUInt8(pc * 8 + 3);
    const k = filter.readUInt32LE(pc * 8 + 4);
    if (code === 0x20) acc = data[k]!;
    else if (code === 0x15) pc += acc === k ? jt : jf;
    else if (code === 0x35) pc += acc >= k ? jt : jf;
    else if (code === 0x06) return k;
    else throw new Error(`unexpected instruction ${code}`);
  }
  throw new Error("fell off the end");
}

const ALLOW = 0x7fff0000;
const ENOSYS = 0x00050000 | 38;

describe("the sandbox's seccomp filter", () => {
  it("x86_64: denies its calls and the other ABIs, allows the rest", () => {
    const f = seccompFilter("x64")!;
    const X64 = 0xc000003e;
    for (const nr of [425, 426, 427, 321, 298, 323, 248, 249, 250, 175, 313, 176, 246, 320, 304]) expect(run(f, X64, nr), `nr ${nr}`).toBe(ENOSYS);
    for (const nr of [0, 1, 39, 56, 57, 59, 435]) expect(run(f, X64, nr), `nr ${nr}`).toBe(ALLOW);
    // x32 (the same calls by other numbers) and i386 (int 0x80).
    expect(run(f, X64, 0x40000000 | 39)).toBe(ENOSYS);
    expect(run(f, 0x40000003, 20)).toBe(ENOSYS);
  });

  it("arm64: its own numbers", () => {
    const f = seccompFilter("arm64")!;
    const A64 = 0xc00000b7;
    for (const nr of [425, 280, 241, 282, 217, 218, 219, 105, 273, 106, 104, 294, 265]) expect(run(f, A64, nr), `nr ${nr}`).toBe(ENOSYS);
    for (const nr of [63, 64, 172, 220, 221]) expect(run(f, A64, nr), `nr ${nr}`).toBe(ALLOW);
    expect(run(f, 0xc000003e, 172)).toBe(ENOSYS);
  });

  it("an architecture without a table gets no filter (the worker says so), not a wrong one", () => {
    expect(seccompFilter("ia32")).toBeNull();
    expect(seccompFilter("riscv64")).toBeNull();
  });
});
