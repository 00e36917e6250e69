import Table from "cli-table3";

/** A text table through cli-table3 (box lines on a UTF-8 terminal, ASCII otherwise; ANSI colours don't count toward widths). */
export interface TableOptions {
  /** Column indexes aligned right (numbers). */
  right?: number[];
  ascii?: boolean;
}

const ASCII = {
  top: "-", "top-mid": "+", "top-left": "+", "top-right": "+",
  bottom: "-", "bottom-mid": "+", "bottom-left": "+", "bottom-right": "+",
  left: "|", "left-mid": "+", mid: "-", "mid-mid": "+", right: "|", "right-mid": "+", middle: "|",
};

export function renderTable(head: string[], rows: string[][], opts: TableOptions = {}): string {
  const right = new Set(opts.right ?? []);
  const table = new Table({
    head,
    style: { head: [], border: [], compact: true },
    colAligns: head.map((_, c) => (right.has(c) ? "right" : "left")),
    ...(opts.ascii ? { chars: ASCII } : {}),
  });
  table.push(...rows);
  return table.toString();
}
