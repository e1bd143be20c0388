"""Times PyTorch's symmetric-memory fused ops next to weft, on the same shapes, in the same run.

AllGather+GEMM: torch.ops.symm_mem.fused_all_gather_matmul; GEMM+ReduceScatter:
torch.ops.symm_mem.fused_matmul_reduce_scatter; and the plain sequences (NCCL collective + cuBLAS
through PyTorch) as a cross-check of weft's own baselines. Median of --iters after --warmup, timed
with CUDA events, max over ranks.

Run with one process per GPU:
  python3 -m torch.distributed.run --nproc_per_node=4 bench/peers/torch_fused.py --op ag_gemm \
      --gemm-m 8192 --gemm-k 8192 --gemm-n 7168 [--json out.json]
(torchrun would take --m for its own options, hence --gemm-*.) For ag_gemm, m and k are global and n is one rank's column block; for gemm_rs, m and n are global and
k is split across ranks (k is the global K), as in the workload files.
NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0).
"""
import argparse
import json
import os
import statistics

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory as symm_mem  # noqa: E402,F401  (registers the ops)


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    med = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return med.item()


def ag_gemm(args, rank, world, group):
    m_local = args.m // world
    a_shard = torch.randn(m_local, args.k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16).t()  # k x n, K-major like weft
    gathered = torch.empty(args.m, args.k, device="cuda", dtype=torch.bfloat16)

    def seq():
        dist.all_gather_into_tensor(gathered, a_shard, group=group)
        return torch.mm(gathered, b)

    def fused():
        return torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], gather_dim=0, group_name=group.group_name)

    ref = seq()
    _, outs = fused()
    err = ((outs[0].float() - ref.float()).norm() / ref.float().norm()).item()
    res = {
        "gemm_ms": time_ms(lambda: torch.mm(gathered, b), args.warmup, args.iters),
        "comm_ms": time_ms(lambda: dist.all_gather_into_tensor(gathered, a_shard, group=group), args.warmup, args.iters),
        "seq_ms": time_ms(seq, args.warmup, args.iters),
        "torch_fused_ms": time_ms(fused, args.warmup, args.iters),
        "torch_fused_rel_err": err,
    }
    return res


def gemm_rs(args, rank, world, group):
    k_local = args.k // world
    a = torch.randn(args.m, k_local, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, k_local, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(args.m // world, args.n, device="cuda", dtype=torch.bfloat16)
    partial = torch.mm(a, b)

    def seq():
        c = torch.mm(a, b)
        dist.reduce_scatter_tensor(out, c, group=group)
        return out

    def fused():
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0, group_name=group.group_name)

    ref = seq().clone()
    got = fused()
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    return {
        "gemm_ms": time_ms(lambda: torch.mm(a, b), args.warmup, args.iters),
        "comm_ms": time_ms(lambda: dist.reduce_scatter_tensor(out, partial, group=group), args.warmup, args.iters),
        "seq_ms": time_ms(seq, args.warmup, args.iters),
        "torch_fused_ms": time_ms(fused, args.warmup, args.iters),
        "torch_fused_rel_err": err,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=["ag_gemm", "gemm_rs"], required=True)
    p.add_argument("--gemm-m", dest="m", type=int, required=True)
    p.add_argument("--gemm-n", dest="n", type=int, required=True)
    p.add_argument("--gemm-k", dest="k", type=int, required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", help="append one JSON line with the results (rank 0)")
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    symm_mem.enable_symm_mem_for_group(group.group_name)
    torch.manual_seed(1234 + rank)

    res = (ag_gemm if args.op == "ag_gemm" else gemm_rs)(args, rank, world, group)
    res.update({"op": args.op, "m": args.m, "n": args.n, "k": args.k, "world": world,
                "device": torch.cuda.get_device_name()})
    if rank == 0:
        line = json.dumps(res)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
