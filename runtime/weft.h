// weft's public C++ API: join the job, plan a workload, create an op from the plan once, run it many
// times on your own buffers and CUDA stream. Installed as <weft/weft.h>; link weft::weft.
//
//   std::unique_ptr<weft::Context> ctx;
//   weft::Context::create({}, &ctx);                   // inside a rank: weftrun exec, srun --mpi=pmix, mpirun
//   weft::Plan plan;
//   ctx->plan("ag_gemm.yaml", &plan);                  // rank 0 decides, every rank checks the hash
//   std::unique_ptr<weft::AgGemm> op;
//   weft::AgGemm::create(*ctx, plan, &op);             // heap arena, flags, kernels: once
//   for (...) op->run(my_a, my_b, my_c, my_stream);    // no allocation, no host synchronisation
//
// Every call is collective (every rank makes the same calls in the same order), from one host thread
// at a time. One op call is in flight per context: a call on a stream other than the previous call's
// waits on the device for that call (no host synchronisation), so calls of different ops never run
// at once. Inside a stream capture the graph orders its calls; order a graph's launches against
// direct calls on other streams yourself. After a device timeout, a CUDA error or a peer's failure
// (ctx.abort() on another rank, a crash) the context is poisoned: every later call fails fast with
// that reason.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

struct CUstream_st;

namespace weft {

namespace runtime {
struct Plan;
class Context;
class AgGemmOp;
class GemmReduceOp;
class MoeOp;
}  // namespace runtime

using Stream = CUstream_st*;  // a cudaStream_t

// What an op will do: every choice (variant, SM roles, heap layout), as `weftrun plan --json` prints it.
class Plan {
 public:
  Plan();
  ~Plan();
  Plan(const Plan&);
  Plan& operator=(const Plan&);
  // Reads a plan in `weftrun plan --json`'s form (e.g. one tuned and stored earlier).
  static Status from_json(const std::string& json, Plan* out, std::string* error);
  std::string json() const;  // `weftrun plan --json`'s form
  uint64_t hash() const;     // of what runs: equal on every rank before the first launch
  bool runnable() const;     // false: why_not() says why (a dtype or op this build does not run)
  std::string why_not() const;
  const runtime::Plan& get() const { return *p_; }

 private:
  friend class Context;
  std::unique_ptr<runtime::Plan> p_;
};

class Context {
 public:
  struct Options {
    uint64_t heap_bytes = 0;  // symmetric heap per rank; 0: WEFT_HEAP_BYTES, else 1 GiB
    // A rank group: group_nodes x group_gpus ranks (a workload's `group:`) that tile the job's nodes x
    // ranks per node in block placement. The context's ops then run on this rank's group only, with
    // the group's own heap and exchanges, every group at once. 0 x 0: the whole job.
    int group_nodes = 0, group_gpus = 0;
  };
  // Collective: joins the job this process was started in (PMIx: weftrun exec, srun --mpi=pmix,
  // mpirun), binds the GPU of its local rank, creates the symmetric heap (the group's, with a group).
  // The process stays connected to the job's PMIx server from its first context until it exits
  // (contexts made one after another then never meet a peer's disconnect); a process that leaves
  // with _exit() skips that last goodbye, and its launcher may report it as not finalized.
  static Status create(const Options& options, std::unique_ptr<Context>* out);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // This rank among the ranks its ops run on: the group's (with a group), else the job's.
  int rank() const;
  int size() const;
  int local_rank() const;
  int gpu() const;       // the CUDA device this rank bound
  int job_rank() const;  // this rank in the whole job
  int group() const;     // which group (0 without groups)
  int groups() const;    // how many (1 without groups)

  // Collective over the job: the plan for a workload file on this machine (the job's rank 0 decides,
  // every rank checks). A workload with `group:` needs a context of that group, and one without needs
  // a context without groups (refused otherwise, naming both).
  Status plan(const std::string& workload_yaml, Plan* out, std::string* error);
  // Collective over the job: rank 0's `plan` on every rank, checked by hash (for plans read with
  // Plan::from_json); its group must be this context's, as for plan().
  Status share(const Plan& plan, Plan* out, std::string* error);

  // Tensors on the symmetric heap. Collective: every rank allocates the same `bytes` in the same order
  // (checked), so an allocation has the same offset everywhere; free() them in the same order too.
  // The memory stays this rank's own (pass it to any op or kernel); peer() is where the same
  // allocation of rank q is mapped on this GPU (same node; nullptr for ranks on other nodes), for
  // kernels of your own that read or write peers over NVLink. Ops reserve from the same heap: leave
  // room (Options::heap_bytes).
  Status alloc(uint64_t bytes, void** out, std::string* error);
  Status free(void* p);
  void* peer(int rank, const void* p) const;
  // Buffers from elsewhere (cudaMalloc, a framework's allocator): every op's run() checks its buffers
  // before enqueuing anything (address lookups in the driver, no synchronisation) and refuses
  // (kInvalidArgument, the reason logged) host memory, memory of another GPU, and a buffer shorter than
  // the call needs. register_buffer() makes the same check up front, with the reason in *error, and
  // remembers the buffer until unregister_buffer(): calls on ranges inside it are then not looked up
  // again, and a buffer mapped in pieces (a virtual-memory allocator's, such as PyTorch's expandable
  // segments, which the per-call check sees as short) is accepted when its first and last bytes are this
  // GPU's memory. Unregister a buffer before you free it. A refused call is one this rank did not make:
  // its peers wait for it (and time out), as for any failed call.
  Status register_buffer(const void* p, uint64_t bytes, std::string* error);
  void unregister_buffer(const void* p);

  bool failed() const;
  std::string failure() const;
  // Poisons this context and tells every peer (the job is aborted), so no peer waits on this rank.
  void abort(const std::string& why);
  runtime::Context& get();

 private:
  Context();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// AllGather+GEMM on one node: C_r = gather(A) · B_rᵀ. Rank r holds A_r (m/W x k), B_r (n/W x k) and
// gets C_r (m x n/W); bf16, row-major, device memory.
class AgGemm {
 public:
  // Collective: reserves the plan's arena of the heap and clears its flags.
  static Status create(Context& ctx, const Plan& plan, std::unique_ptr<AgGemm>* out);
  ~AgGemm();  // waits for this op's work; destroy ops in the same order on every rank
  AgGemm(const AgGemm&) = delete;
  AgGemm& operator=(const AgGemm&) = delete;

  // Enqueues one call on `stream`. Once the stream has passed the call, a may be overwritten.
  // kUnsupported while the stream is being captured when the plan is not capturable (Plan::json's
  // execution.capturable).
  Status run(const void* a, const void* b, void* c, Stream stream);
  // This rank's rows of A inside the heap: write A there and pass it as `a` to skip a copy.
  void* a_shard() const;
  int64_t m() const;        // all rows (m/W per rank)
  int64_t n_local() const;  // this rank's columns of C
  int64_t k() const;

 private:
  AgGemm();
  std::unique_ptr<runtime::AgGemmOp> op_;
  runtime::Context* ctx_ = nullptr;
  int64_t m_ = 0, n_ = 0, k_ = 0;
};

// GEMM+ReduceScatter or GEMM+AllReduce on one node (the plan's op): C = Σ_r A_r · B_rᵀ. Rank r holds
// A_r (m x k/W) and B_r (n x k/W) and gets rows [r m/W, (r+1) m/W) of C (ReduceScatter, m/W x n) or
// all of C (AllReduce, m x n); bf16, row-major, device memory. The plan's variant runs: "peer" (the
// GEMM into the heap, then one kernel reduces over NVLink) or "overlap" (pieces move and are reduced
// while the GEMM runs); neither is capturable.
class GemmReduce {
 public:
  static Status create(Context& ctx, const Plan& plan, std::unique_ptr<GemmReduce>* out);  // collective
  ~GemmReduce();
  GemmReduce(const GemmReduce&) = delete;
  GemmReduce& operator=(const GemmReduce&) = delete;

  Status run(const void* a, const void* b, void* c, Stream stream);
  bool all_reduce() const;
  int64_t m() const;  // rows of C
  int64_t n() const;
  int64_t k_local() const;  // k / W: this rank's columns of A and B
  int64_t c_rows() const;   // rows of this rank's C: m / W, or m for AllReduce
  // AllReduce: C inside the heap, where the op gathers it: pass it as `c` to skip the copy out. It
  // holds the last call's C until this rank's next run(): read it on the call's stream, or order
  // the reads before the next call. nullptr for ReduceScatter.
  void* heap_c() const;

 private:
  GemmReduce();
  std::unique_ptr<runtime::GemmReduceOp> op_;
  runtime::Context* ctx_ = nullptr;
  int64_t m_ = 0, n_ = 0, k_ = 0, rows_ = 0;
};

// The MoE layer on one node (the plan's op, `moe`): rank r holds T = tokens / W tokens and experts
// [r L, (r + 1) L) of E, L = E / W, each a SwiGLU FFN. One call: routing on the GPU (logits, softmax,
// top-k, weights renormalised over the k), each token sent once to every rank that owns one of its
// experts, the grouped expert GEMMs, and one pre-reduced row per (token, rank) sent back:
// out[t] = Σ over t's top-k experts of weight · expert(x[t]). bf16, row-major, device memory; no
// token is ever dropped; the same input gives the same bits. A call may be captured in a CUDA graph and
// replayed (every rank replays alike).
class Moe {
 public:
  struct Weights {
    const void* router = nullptr;  // hidden x experts (every rank: all of it); copied at create
    const void* gate = nullptr;    // L x ffn x hidden (this rank's experts, nn.Linear layout); copied
    const void* up = nullptr;      // L x ffn x hidden; copied
    const void* down = nullptr;    // L x hidden x ffn; used in place: keep it alive while the op lives
  };
  static Status create(Context& ctx, const Plan& plan, const Weights& weights,
                       std::unique_ptr<Moe>* out);  // collective
  ~Moe();
  Moe(const Moe&) = delete;
  Moe& operator=(const Moe&) = delete;

  // x: T x hidden, out: T x hidden.
  Status run(const void* x, void* out, Stream stream);
  // The last call's routing (device memory, valid until the next call): T x topk expert ids (int32)
  // and their weights (float).
  const int32_t* topk_ids() const;
  const float* topk_weights() const;
  int64_t tokens_local() const;  // T
  int64_t hidden() const;
  int64_t topk() const;

 private:
  Moe();
  std::unique_ptr<runtime::MoeOp> op_;
  runtime::Context* ctx_ = nullptr;
  int64_t t_ = 0, h_ = 0, k_ = 0;
};

}  // namespace weft
