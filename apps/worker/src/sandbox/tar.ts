/**
 * A minimal tar writer and reader (POSIX ustar with PAX headers for long names) for copying
 * files into and out of container sandboxes: the Docker Engine API's archive endpoints and
 * `tar -x` over a Kubernetes exec both speak it. Regular files and directories only.
 */

export interface TarEntry {
  /** Relative path inside the archive (no leading "/"); a directory ends without "/". */
  path: string;
  type: "file" | "dir";
  /** File content (utf8 when a string). */
  content?: string | Buffer;
  mode?: number;
}

const BLOCK = 512;

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function header(name: string, size: number, mode: number, typeflag: string, prefix = ""): Buffer {
  const h = Buffer.alloc(BLOCK, 0);
  h.write(name, 0, 100, "utf8");
  h.write(octal(mode, 8), 100, 8, "ascii");
  h.write(octal(0, 8), 108, 8, "ascii"); // uid
  h.write(octal(0, 8), 116, 8, "ascii"); // gid
  h.write(octal(size, 12), 124, 12, "ascii");
  h.write(octal(Math.floor(Date.now() / 1000), 12), 136, 12, "ascii");
  h.write("        ", 148, 8, "ascii"); // checksum placeholder
  h.write(typeflag, 156, 1, "ascii");
  h.write("ustar\0", 257, 6, "ascii");
  h.write("00", 263, 2, "ascii");
  h.write(prefix, 345, 155, "utf8");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + " ", 148, 8, "ascii");
  return h;
}

function pad(n: number): Buffer {
  const rest = n % BLOCK;
  return Buffer.alloc(rest === 0 ? 0 : BLOCK - rest, 0);
}

/** One PAX record: "<len> path=<value>\n" where len counts the whole record. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return `${len}${body}`;
}

/** Builds a tar archive of `entries`, padded to a whole 10 KiB record like tar(1) writes. */
export function buildTar(entries: TarEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const name = e.type === "dir" ? `${e.path.replace(/\/+$/, "")}/` : e.path;
    const body = e.type === "file" ? (Buffer.isBuffer(e.content) ? e.content : Buffer.from(e.content ?? "", "utf8")) : Buffer.alloc(0);
    const mode = e.mode ?? (e.type === "dir" ? 0o777 : 0o666);
    const flag = e.type === "dir" ? "5" : "0";
    if (Buffer.byteLength(name) > 100) {
      const pax = Buffer.from(paxRecord("path", name), "utf8");
      parts.push(header("PaxHeader", pax.length, 0o644, "x"), pax, pad(pax.length));
      parts.push(header(name.slice(0, 99), body.length, mode, flag));
    } else {
      parts.push(header(name, body.length, mode, flag));
    }
    parts.push(body, pad(body.length));
  }
  parts.push(Buffer.alloc(BLOCK * 2, 0));
  const all = Buffer.concat(parts);
  const record = BLOCK * 20;
  return Buffer.concat([all, Buffer.alloc((record - (all.length % record)) % record, 0)]);
}

function cstr(b: Buffer, start: number, len: number): string {
  const s = b.subarray(start, start + len);
  const end = s.indexOf(0);
  return s.subarray(0, end === -1 ? s.length : end).toString("utf8");
}

/** Reads the entries of a tar archive (regular files and directories; PAX/GNU long names honoured). */
export function readTar(buf: Buffer): TarEntry[] {
  const out: TarEntry[] = [];
  let off = 0;
  let longName: string | null = null;
  while (off + BLOCK <= buf.length) {
    const h = buf.subarray(off, off + BLOCK);
    if (h.every((b) => b === 0)) break;
    const size = parseInt(cstr(h, 124, 12).trim() || "0", 8);
    const flag = String.fromCharCode(h[156] ?? 48);
    const prefix = cstr(h, 345, 155);
    let name = cstr(h, 0, 100);
    if (prefix) name = `${prefix}/${name}`;
    const body = buf.subarray(off + BLOCK, off + BLOCK + size);
    off += BLOCK + size + pad(size).length;
    if (flag === "x") {
      const m = /(?:^|\n)\d+ path=([^\n]*)\n/.exec(body.toString("utf8"));
      if (m) longName = m[1]!;
      continue;
    }
    if (flag === "L") {
      longName = cstr(body, 0, body.length);
      continue;
    }
    if (flag === "g") continue;
    if (longName !== null) {
      name = longName;
      longName = null;
    }
    const mode = parseInt(cstr(h, 100, 8).trim() || "0", 8);
    if (flag === "0" || flag === "\0" || flag === "7") out.push({ path: name, type: "file", content: Buffer.from(body), mode });
    else if (flag === "5") out.push({ path: name.replace(/\/+$/, ""), type: "dir", mode });
  }
  return out;
}
