#!/usr/bin/env python3
"""The MoE layer against its bound, from two tables of one device call.

Usage: moe_bound.py WEFT_LAYER.md SEQUENTIAL.md
  WEFT_LAYER.md  bench_moe_layer's table (weft's layer and its phases, slowest rank)
  SEQUENTIAL.md  bench/peers/moe_sequential.py's table (the PyTorch layer, its expert phase and
                 the NCCL all-to-all-v of its rows alone)

The bound of a shape is max(compute, communication):
  compute        the faster expert FFN on the realised counts: weft's grouped FFN phase or
                 PyTorch's expert phase;
  communication  the faster of NCCL all-to-all-v alone (rows out and back, once per (token,
                 destination rank) each way) and weft's exchange phases (dispatch + arrange +
                 combine, their waits included).
Goals (prefill rows): weft layer <= 1.15 x bound; speed-up over the sequential layer >=
0.8 x (sequential / bound). Decode rows: weft no slower than the sequential layer.
Prints a markdown table; exits 2 when a table is missing or has no matching rows.
"""
import sys


def rows_of(path):
    """Markdown table rows as {column name: cell} dicts, keyed by (shape, tokens)."""
    header, out = None, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("|") or line.startswith("|---"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
                continue
            row = dict(zip(header, cells))
            try:
                out[(row[header[0]], int(row[header[1]]))] = row
            except (KeyError, ValueError):
                continue
    return out


def num(row, *names):
    for n in names:
        if n in row:
            return float(row[n])
    raise KeyError(names)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        weft, seq = rows_of(sys.argv[1]), rows_of(sys.argv[2])
    except OSError as err:
        print(f"moe_bound: {err}", file=sys.stderr)
        return 2
    keys = [k for k in weft if k in seq]
    if not keys:
        print("moe_bound: no shape is in both tables", file=sys.stderr)
        return 2
    print("| shape | T/rank | weft ms | sequential ms | compute (faster FFN) | communication (faster exchange) | "
          "bound ms | weft / bound | sequential / bound | speed-up | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, tokens in keys:
        w, s = weft[(name, tokens)], seq[(name, tokens)]
        layer, seq_ms = num(w, "weft layer ms"), num(s, "layer ms")
        ffn_w, ffn_t = num(w, "grouped FFN"), num(s, "experts ms")
        ex_w = num(w, "dispatch") + num(w, "arrange (+wait)") + num(w, "combine (+wait)")
        a2a = num(s, "NCCL a2a-v alone ms")
        compute = (ffn_w, "weft") if ffn_w <= ffn_t else (ffn_t, "PyTorch")
        comm = (a2a, "NCCL") if 0 < a2a <= ex_w else (ex_w, "weft")
        bound = max(compute[0], comm[0])
        speedup = seq_ms / layer
        if tokens >= 1024:
            need = 0.8 * seq_ms / bound
            met = layer <= 1.15 * bound and speedup >= need
            goal = f"{'met' if met else 'not met'} (<= 1.15x bound, speed-up >= {need:.2f}x)"
        else:
            goal = f"{'met' if layer <= seq_ms else 'not met'} (no slower than sequential)"
        print(f"| {name} | {tokens} | {layer:.3f} | {seq_ms:.3f} | {compute[0]:.3f} ({compute[1]}) | "
              f"{comm[0]:.3f} ({comm[1]}) | {bound:.3f} | {layer / bound:.2f}x | {seq_ms / bound:.2f}x | "
              f"{speedup:.2f}x | {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
