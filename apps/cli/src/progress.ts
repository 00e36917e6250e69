import cliProgress from "cli-progress";
import type { Style } from "./output.js";

export interface ProgressCounts {
  total: number;
  queued: number;
  running: number;
  /** Completed (scored, whatever the reward). */
  done: number;
  /** Failed, timed out or cancelled. */
  failed: number;
  completionTokens: number;
  rewardSum: number;
  rewardCount: number;
}

export function emptyCounts(total: number): ProgressCounts {
  return { total, queued: total, running: 0, done: 0, failed: 0, completionTokens: 0, rewardSum: 0, rewardCount: 0 };
}

function clock(ms: number): string {
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  const mm = String(Math.floor((s % 3600) / 60)).padStart(h ? 2 : 1, "0");
  const ss = String(s % 60).padStart(2, "0");
  return h ? `${h}:${mm}:${ss}` : `${mm}:${ss}`;
}

export interface ProgressOptions {
  /** A terminal: redraw one line in place. Otherwise: a plain line every `everyMs`. */
  tty: boolean;
  everyMs: number;
  style: Style;
  /** Terminal width (for the bar). */
  columns?: number;
  now?: () => number;
}

/**
 * The live progress of a batch: a bar redrawn in place on a terminal, or — in a pipe, a log file,
 * CI — a plain line every few seconds (no control characters at all).
 */
export class ProgressView {
  private readonly startedAt: number;
  private lastPlain = -Infinity;
  private lastPlainLine = "";
  private readonly now: () => number;
  /** On a terminal, cli-progress draws the bar (redrawn in place, sized to the terminal). */
  private bar: cliProgress.SingleBar | null = null;

  constructor(
    private readonly write: (s: string) => void,
    private readonly opts: ProgressOptions,
  ) {
    this.now = opts.now ?? Date.now;
    this.startedAt = this.now();
  }

  private payload(c: ProgressCounts) {
    const s = this.opts.style;
    const { ended, tokensPerS, meanReward } = ProgressView.stats(c, this.elapsedMs());
    return {
      ended,
      queued: s.yellow(`queued ${c.queued}`),
      running: s.cyan(`running ${c.running}`),
      done: s.green(`done ${c.done}`),
      failed: c.failed ? s.red(`failed ${c.failed}`) : "failed 0",
      tps: tokensPerS.toFixed(0),
      reward: meanReward === null ? "–" : meanReward.toFixed(3),
      clock: clock(this.elapsedMs()),
    };
  }

  private terminalBar(c: ProgressCounts): cliProgress.SingleBar {
    if (this.bar) return this.bar;
    const write = this.write;
    // cli-progress writes through a stream; this one hands its output to our writer.
    const stream = {
      isTTY: true,
      columns: this.opts.columns ?? 100,
      write: (s: string) => {
        write(s);
        return true;
      },
      cursorTo: (x: number) => (write(`\x1b[${x + 1}G`), true),
      clearLine: () => (write("\x1b[2K"), true),
      moveCursor: () => true,
      on: () => stream,
      removeListener: () => stream,
    };
    this.bar = new cliProgress.SingleBar(
      {
        stream: stream as unknown as NodeJS.WritableStream,
        format: "{bar} {ended}/{total} │ {queued}  {running}  {done}  {failed} │ {tps} tok/s │ reward {reward} │ {clock}",
        barsize: Math.max(10, Math.min(30, (this.opts.columns ?? 100) - 90)),
        hideCursor: false,
        clearOnComplete: false,
        linewrap: false,
        fps: 10,
        forceRedraw: true,
        noTTYOutput: false,
      },
      cliProgress.Presets.shades_classic,
    );
    this.bar.start(c.total, c.done + c.failed, this.payload(c));
    return this.bar;
  }

  elapsedMs(): number {
    return this.now() - this.startedAt;
  }

  static stats(c: ProgressCounts, elapsedMs: number) {
    return {
      ended: c.done + c.failed,
      tokensPerS: elapsedMs > 0 ? (c.completionTokens * 1000) / elapsedMs : 0,
      meanReward: c.rewardCount ? c.rewardSum / c.rewardCount : null,
    };
  }

  /** A plain progress line (also what the terminal view degrades to). */
  plainLine(c: ProgressCounts): string {
    const { ended, tokensPerS, meanReward } = ProgressView.stats(c, this.elapsedMs());
    return (
      `[${clock(this.elapsedMs())}] ${ended}/${c.total} ended · queued ${c.queued} · running ${c.running} · done ${c.done} · failed ${c.failed}` +
      ` · ${tokensPerS.toFixed(1)} tok/s · mean reward ${meanReward === null ? "–" : meanReward.toFixed(3)}`
    );
  }

  update(c: ProgressCounts, force = false): void {
    const now = this.now();
    if (this.opts.tty) {
      const bar = this.terminalBar(c);
      bar.update(c.done + c.failed, this.payload(c));
      if (force) bar.render();
    } else if (force || now - this.lastPlain >= this.opts.everyMs) {
      this.lastPlain = now;
      this.lastPlainLine = this.plainLine(c);
      this.write(`${this.lastPlainLine}\n`);
    }
  }

  /** Writes a message above the bar (the bar is redrawn on the next update). */
  log(line: string): void {
    if (this.bar) this.write("\r\x1b[2K");
    this.write(`${line}\n`);
    this.bar?.render();
  }

  finish(c: ProgressCounts): void {
    if (this.opts.tty) {
      const bar = this.terminalBar(c);
      bar.update(c.done + c.failed, this.payload(c));
      bar.stop();
    } else {
      // The clock moves, so compare without it: a repeat of the last line adds nothing.
      const line = this.plainLine(c);
      if (line.replace(/^\[[^\]]*\]/, "") !== this.lastPlainLine.replace(/^\[[^\]]*\]/, "")) this.write(`${line}\n`);
    }
  }
}
