import { lstatSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { OWNER_FILE, markOwner, ownerDead } from "./owner.js";

/**
 * A seccomp filter for bubblewrap sandboxes (`bwrap --seccomp FD`): a short deny list of system
 * calls an agent has no use for and whose kernel code has been the way out of sandboxes before,
 * reachable without capabilities (io_uring, bpf, perf_event_open, userfaultfd, the key
 * management calls), plus a few that need capabilities the sandbox does not have anyway (kernel
 * modules, kexec, open_by_handle_at). Each answers ENOSYS, as on a kernel without it: programs
 * that probe for io_uring or userfaultfd fall back as they do there. Everything else is allowed
 * (an allow list would break agents' tools in ways a deny list does not).
 *
 * Only the machine's native system-call ABI passes: on x86_64 the 32-bit (int 0x80) and x32 calls
 * answer ENOSYS too (they would reach the same code by other numbers), so 32-bit programs do not run.
 *
 * The program is classic BPF, built here (eight bytes an instruction: code, jt, jf, k): no
 * libseccomp, no compiler.
 */

/** The denied calls' numbers per architecture (the kernel's own tables). */
const DENIED: Record<string, { audit: number; x32Bit?: number; calls: Record<string, number> }> = {
  x64: {
    audit: 0xc000003e, // AUDIT_ARCH_X86_64
    x32Bit: 0x40000000, // __X32_SYSCALL_BIT
    calls: {
      io_uring_setup: 425,
      io_uring_enter: 426,
      io_uring_register: 427,
      bpf: 321,
      perf_event_open: 298,
      userfaultfd: 323,
      add_key: 248,
      request_key: 249,
      keyctl: 250,
      init_module: 175,
      finit_module: 313,
      delete_module: 176,
      kexec_load: 246,
      kexec_file_load: 320,
      open_by_handle_at: 304,
    },
  },
  arm64: {
    audit: 0xc00000b7, // AUDIT_ARCH_AARCH64
    calls: {
      io_uring_setup: 425,
      io_uring_enter: 426,
      io_uring_register: 427,
      bpf: 280,
      perf_event_open: 241,
      userfaultfd: 282,
      add_key: 217,
      request_key: 218,
      keyctl: 219,
      init_module: 105,
      finit_module: 273,
      delete_module: 106,
      kexec_load: 104,
      kexec_file_load: 294,
      open_by_handle_at: 265,
    },
  },
};

/** The names of the calls a sandbox is denied (for the docs and the tests). */
export const DENIED_SYSCALLS = Object.keys(DENIED.x64!.calls);

const BPF_LD_W_ABS = 0x20;
const BPF_JEQ_K = 0x15;
const BPF_JGE_K = 0x35;
const BPF_RET_K = 0x06;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const SECCOMP_RET_ERRNO = 0x00050000;
const ENOSYS = 38;
/** struct seccomp_data: the call's number at 0, the ABI (AUDIT_ARCH_*) at 4. */
const NR_OFFSET = 0;
const ARCH_OFFSET = 4;

type Insn = [code: number, jt: number, jf: number, k: number];

/** The filter for `arch` (node's process.arch), or null when there is no table for it. */
export function seccompFilter(arch: string = process.arch): Buffer | null {
  const table = DENIED[arch];
  if (!table) return null;
  const nrs = Object.values(table.calls);
  // Laid out: check the ABI, load the number, the checks, ALLOW, then DENY last; jumps are
  // relative to the next instruction.
  const body: ((at: number, deny: number) => Insn)[] = [
    () => [BPF_LD_W_ABS, 0, 0, ARCH_OFFSET],
    (at, deny) => [BPF_JEQ_K, 0, deny - at - 1, table.audit],
    () => [BPF_LD_W_ABS, 0, 0, NR_OFFSET],
    ...(table.x32Bit ? [(at: number, deny: number): Insn => [BPF_JGE_K, deny - at - 1, 0, table.x32Bit!]] : []),
    ...nrs.map((nr) => (at: number, deny: number): Insn => [BPF_JEQ_K, deny - at - 1, 0, nr]),
    () => [BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW],
    () => [BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS],
  ];
  const deny = body.length - 1;
  const out = Buffer.alloc(body.length * 8);
  body.forEach((make, at) => {
    const [code, jt, jf, k] = make(at, deny);
    out.writeUInt16LE(code, at * 8);
    out.writeUInt8(jt, at * 8 + 2);
    out.writeUInt8(jf, at * 8 + 3);
    out.writeUInt32LE(k >>> 0, at * 8 + 4);
  });
  return out;
}

let written: string | null | undefined;

/**
 * The filter folders in `tmp` of this user's workers that are gone (killed before they could
 * remove theirs), told by the same owner marker as the sandbox folders (owner.ts: pid and start
 * time, host, pid namespace), so a live worker of another container sharing the folder keeps its own.
 */
export function removeDeadWorkersFilters(tmp = os.tmpdir()): void {
  const uid = process.getuid?.();
  let names: string[];
  try {
    names = readdirSync(tmp);
  } catch {
    return;
  }
  for (const name of names) {
    if (!name.startsWith(FOLDER_PREFIX)) continue;
    const dir = path.join(tmp, name);
    try {
      if (lstatSync(dir).uid !== uid) continue;
      if (ownerDead(readFileSync(path.join(dir, OWNER_FILE), "utf8"))) rmSync(dir, { recursive: true, force: true });
    } catch {
      // Gone meanwhile, or unmarked: not ours to judge.
    }
  }
}

const FOLDER_PREFIX = "rollgate-seccomp-";

/**
 * The filter as a file the worker opens for each bubblewrap step (bwrap reads it from a
 * descriptor), written once per worker process into a folder of its own (not a name in the shared
 * temp folder another user could have made first); null when this architecture has no table.
 */
export function seccompFilterFile(): string | null {
  if (written !== undefined) return written;
  const filter = seccompFilter();
  if (!filter) return (written = null);
  removeDeadWorkersFilters();
  const dir = mkdtempSync(path.join(os.tmpdir(), `${FOLDER_PREFIX}${process.pid}-`));
  markOwner(dir);
  const file = path.join(dir, "filter.bpf");
  writeFileSync(file, filter, { mode: 0o444 });
  process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
  return (written = file);
}
