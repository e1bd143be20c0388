#!/usr/bin/env python3
"""The sequential MoE layer in PyTorch: the baseline weft's fused MoE op is measured against.

Per rank (tokens per rank T, experts/W local experts, SwiGLU experts):
  routing      logits = x @ Wr (fp32), softmax fp32, top-k, weights renormalised over the k
  dispatch     NCCL all-to-all-v, each token once per destination rank (with its ids and weights)
  experts      grouped GEMMs: the faster of torch._grouped_mm and a per-expert matmul loop
  combine      each owner weights and pre-sums its experts' rows per (token, home rank), NCCL
               all-to-all-v back, the home sums in rank order
At world 1 (one GPU, no torch.distributed) dispatch and combine are local gathers/scatters.
Run: python3 moe_sequential.py [--iters N]   or   torchrun --nproc-per-node 4 moe_sequential.py
Prints one markdown row per shape (median ms of each phase and of the whole layer, rank 0), and the
NCCL all-to-all-v of the rows alone (dispatch rows out and combine rows back on the sizes the layer
sent, nothing else; median, slowest rank): the communication term of the bound.
"""
import argparse
import os
import statistics

import torch
import torch.nn.functional as F

SHAPES = [  # name, hidden, ffn, experts, topk (public model configs)
    ("Mixtral-8x7B", 4096, 14336, 8, 2),
    ("Qwen3-30B-A3B", 2048, 768, 128, 8),
    ("DeepSeek-V3", 7168, 2048, 256, 8),
]


def grouped_mm(x, w, offs):
    """x: rows x K grouped by expert, w: E x N x K, offs: int32 group ends."""
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


def loop_mm(x, w, counts):
    out = x.new_empty(x.shape[0], w.shape[1])
    start = 0
    for e, c in enumerate(counts):
        if c:
            torch.matmul(x[start:start + c], w[e].t(), out=out[start:start + c])
        start += c
    return out


class Layer:
    def __init__(self, hidden, ffn, experts, topk, tokens, world, rank, dev):
        self.h, self.f, self.e, self.k, self.t, self.w, self.r = hidden, ffn, experts, topk, tokens, world, rank
        self.l = experts // world
        g = torch.Generator(device=dev)
        g.seed()  # fresh inputs every run
        rnd = lambda *s, scale=1.0: torch.empty(*s, device=dev, dtype=torch.bfloat16).uniform_(-scale, scale,
                                                                                              generator=g)
        self.x = rnd(tokens, hidden)
        self.wr = rnd(hidden, experts, scale=0.05)
        self.w13 = rnd(self.l, 2 * ffn, hidden, scale=0.05)  # gate rows, then up rows
        self.w2 = rnd(self.l, hidden, ffn, scale=0.05)
        self.use_grouped = True

    def route(self):
        logits = self.x.float() @ self.wr.float()
        probs = torch.softmax(logits, dim=-1)
        w, ids = torch.topk(probs, self.k, dim=-1)
        return ids.to(torch.int32), w / w.sum(dim=-1, keepdim=True)

    def experts(self, xg, counts_list, offs):
        if self.use_grouped:
            gu = grouped_mm(xg, self.w13, offs)
        else:
            gu = loop_mm(xg, self.w13, counts_list)
        h = F.silu(gu[:, :self.f]) * gu[:, self.f:]
        return grouped_mm(h, self.w2, offs) if self.use_grouped else loop_mm(h, self.w2, counts_list)

    def forward(self, ev):
        """One layer; ev: 5 CUDA events marking route | dispatch | experts | combine."""
        import torch.distributed as dist
        ev[0].record()
        ids, wts = self.route()
        owner = ids // self.l  # T x k
        ev[1].record()
        # Dispatch: token t to rank r once if any of its k experts lives on r.
        dest = torch.zeros(self.t, self.w, dtype=torch.bool, device=ids.device)
        dest.scatter_(1, owner.long(), True)
        send_tok = [torch.nonzero(dest[:, r]).squeeze(1) for r in range(self.w)]
        send_counts = torch.tensor([len(s) for s in send_tok], device=ids.device)
        order = torch.cat(send_tok)
        meta = torch.cat([ids.float(), wts], dim=1)[order]  # ids travel exactly as floats (< 2^24)
        rows = self.x[order]
        if self.w > 1:
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts)
            sc, rc = send_counts.tolist(), recv_counts.tolist()
            recv = rows.new_empty(sum(rc), self.h)
            dist.all_to_all_single(recv, rows, rc, sc)
            rmeta = meta.new_empty(sum(rc), 2 * self.k)
            dist.all_to_all_single(rmeta, meta, rc, sc)
        else:
            sc = rc = send_counts.tolist()
            recv, rmeta = rows, meta
        # Pairs of the received rows that belong to this rank's experts, grouped by expert.
        rid = rmeta[:, :self.k].to(torch.int64) - self.r * self.l
        mine = (rid >= 0) & (rid < self.l)
        row_idx, slot = torch.nonzero(mine, as_tuple=True)
        exp_idx = rid[row_idx, slot]
        perm = torch.argsort(exp_idx, stable=True)
        row_idx, slot, exp_idx = row_idx[perm], slot[perm], exp_idx[perm]
        counts = torch.bincount(exp_idx, minlength=self.l)
        counts_list = counts.tolist()
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xg = recv[row_idx]
        ev[2].record()
        y = self.experts(xg, counts_list, offs)
        ev[3].record()
        # Combine: weight, pre-sum per received row (one row per (token, home rank)), send back.
        y = y.float() * rmeta[row_idx, self.k + slot].unsqueeze(1)
        part = torch.zeros(recv.shape[0], self.h, dtype=torch.float32, device=y.device)
        part.index_add_(0, row_idx, y)
        part = part.to(torch.bfloat16)
        if self.w > 1:
            back = part.new_empty(sum(sc), self.h)
            dist.all_to_all_single(back, part, sc, rc)
        else:
            back = part
        self.sent = (rows, sc, rc, part)  # the payloads of the last call, for a2a_alone
        out = torch.zeros(self.t, self.h, dtype=torch.float32, device=y.device)
        out.index_add_(0, order, back.float())  # rows arrive in rank order
        ev[4].record()
        return out.to(torch.bfloat16)


def median_phases(layer, iters):
    evs = [[torch.cuda.Event(enable_timing=True) for _ in range(5)] for _ in range(iters)]
    for _ in range(3):
        layer.forward([torch.cuda.Event(enable_timing=True) for _ in range(5)])
    torch.cuda.synchronize()
    for i in range(iters):
        layer.forward(evs[i])
    torch.cuda.synchronize()
    ph = [[evs[i][j].elapsed_time(evs[i][j + 1]) for i in range(iters)] for j in range(4)]
    total = [evs[i][0].elapsed_time(evs[i][4]) for i in range(iters)]
    return [statistics.median(p) for p in ph], statistics.median(total)


def a2a_alone(layer, iters):
    """The last call's two all-to-all-v of rows alone: median ms, the slowest rank's (0 on one rank)."""
    if layer.w == 1:
        return 0.0
    import torch.distributed as dist
    rows, sc, rc, part = layer.sent
    recv = rows.new_empty(sum(rc), layer.h)
    back = part.new_empty(sum(sc), layer.h)
    times = []
    for i in range(iters + 3):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dist.all_to_all_single(recv, rows, rc, sc)
        dist.all_to_all_single(back, part, sc, rc)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b))
    worst = torch.tensor([statistics.median(times)], device=rows.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--tokens", type=int, nargs="*", default=[4096, 256])
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl", device_id=dev)
    if rank == 0:
        print(f"# {torch.cuda.get_device_name(dev)}, world {world}, torch {torch.__version__}")
        print("| shape | T/rank | experts | route ms | dispatch ms | experts ms | combine ms | layer ms | "
              "NCCL a2a-v alone ms |")
        print("|---|---|---|---|---|---|---|---|---|")
    for tokens in args.tokens:
        for name, hidden, ffn, experts, topk in SHAPES:
            layer = Layer(hidden, ffn, experts, topk, tokens, world, rank, dev)
            # The faster expert path on this shape: torch._grouped_mm or the per-expert loop.
            best = None
            for grouped in (True, False):
                layer.use_grouped = grouped
                try:
                    ph, tot = median_phases(layer, max(3, args.iters // 2))
                except (RuntimeError, AttributeError) as err:  # _grouped_mm missing or refusing the shape
                    if rank == 0:
                        print(f"# {name}: torch._grouped_mm unavailable ({str(err).splitlines()[0][:80]})")
                    continue
                if best is None or ph[2] < best[1]:
                    best = (grouped, ph[2])
            layer.use_grouped = best[0]
            ph, tot = median_phases(layer, args.iters)
            a2a = a2a_alone(layer, args.iters)
            if rank == 0:
                how = "_grouped_mm" if best[0] else "per-expert matmul"
                print(f"| {name} | {tokens} | {how} | {ph[0]:.3f} | {ph[1]:.3f} | {ph[2]:.3f} | {ph[3]:.3f} | "
                      f"{tot:.3f} | {a2a:.3f} |", flush=True)
            del layer
            torch.cuda.empty_cache()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
