// The public API (runtime/weft.h) over the runtime: PMIx bootstrap, GPU binding, Context, Plan, ops.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "bootstrap/group_bootstrap.h"
#include "bootstrap/pmix_bootstrap.h"
#include "bootstrap/rank_group.h"
#include "runtime/exec/ag_gemm.h"
#include "runtime/exec/context.h"
#include "runtime/exec/gemm_reduce.h"
#include "runtime/exec/machine.h"
#include "runtime/exec/moe.h"
#include "runtime/exec/plan_exchange.h"
#include "runtime/exec/stream_ops.h"
#include "runtime/plan.h"
#include "runtime/tuner.h"
#include "runtime/weft.h"
#include "runtime/workload.h"

namespace weft {

Plan::Plan() : p_(new runtime::Plan()) {}
Plan::~Plan() = default;
Plan::Plan(const Plan& o) : p_(new runtime::Plan(*o.p_)) {}
Plan& Plan::operator=(const Plan& o) {
  *p_ = *o.p_;
  return *this;
}
Status Plan::from_json(const std::string& json, Plan* out, std::string* error) {
  return runtime::parse_executed_json(json, out->p_.get(), error);
}
std::string Plan::json() const { return runtime::format_plan_json(*p_); }
uint64_t Plan::hash() const { return runtime::plan_hash(*p_); }
bool Plan::runnable() const { return p_->exec.executable; }
std::string Plan::why_not() const { return p_->exec.not_executable; }

struct Context::Impl {
  std::unique_ptr<bootstrap::PmixBootstrap> boot;
  std::unique_ptr<bootstrap::GroupBootstrap> group;  // with Options' group: the ops' bootstrap
  std::unique_ptr<runtime::Context> ctx;             // destroyed before group and boot
  bootstrap::GroupShape shape;                       // the group's, where `group` is set
  int gpu = -1;
  bool shared_gpus = false;                        // some ranks of the job share a GPU (job_shares_gpus)
  std::vector<std::pair<void*, uint64_t>> allocs;  // alloc(): local pointer, heap offset
  bootstrap::Bootstrap& op_boot() { return group ? static_cast<bootstrap::Bootstrap&>(*group) : *boot; }
  const bootstrap::RankInfo& op_info() const { return group ? group->info() : boot->info(); }
};

namespace {

// One call in flight per context (runtime::Context::order_call): the call waits for the previous one
// when it is on another stream, and is recorded as the last once enqueued.
template <typename Call>
Status ordered(runtime::Context& ctx, Stream stream, Call call) {
  WEFT_CHECK(ctx.order_call(stream));
  WEFT_CHECK(call());
  const Status st = ctx.call_enqueued(stream);
  // The call was made (its peers count on it): a later call could no longer be ordered after it.
  if (st != Status::kOk) ctx.poison("a call's end could not be recorded on rank " + std::to_string(ctx.rank()));
  return st;
}

// One call made at creation, collective, on scratch buffers of the op's own (zeros) and a stream of its
// own, waited for (bounded): every kernel the op launches is then loaded (CUDA loads modules lazily,
// and a first launch may wait behind kernels already running on the GPU, such as a user kernel that
// holds SMs until the op is done), and its first-use setup is made. `sizes`: each buffer's bytes.
template <typename Call>
Status warm_up(runtime::Context& ctx, const char* what, std::initializer_list<uint64_t> sizes, Call call,
               const std::function<void()>& unstick) {
  std::vector<void*> bufs;
  cudaStream_t s = nullptr;
  bool ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess;
  for (uint64_t bytes : sizes) {
    void* p = nullptr;
    if (ok && (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemsetAsync(p, 0, bytes, s) != cudaSuccess)) ok = false;
    bufs.push_back(p);
  }
  if (!ok) cudaGetLastError();
  // Every rank makes the call or none does: a rank that could not set it up says so first.
  std::vector<bootstrap::Blob> all;
  Status st = ctx.boot().allgather("weft.warm_up." + std::to_string(ctx.boot().next_exchange_id()),
                                   bootstrap::Blob{uint8_t(ok ? 1 : 0)}, &all);
  for (const auto& b : all)
    if (st == Status::kOk && (b.size() != 1 || b[0] != 1)) st = Status::kCudaError;
  if (st == Status::kOk) st = call(bufs, s);
  if (st == Status::kOk)
    st = runtime::sync_bounded(s, param_double_or_default("WEFT_DEVICE_TIMEOUT") + 1, what, unstick);
  if (st != Status::kOk) {
    cudaGetLastError();
    WEFT_WARN(kInit, "rank %d: %s failed%s: %s", ctx.rank(), what, ok ? "" : " (scratch buffers or stream)",
              to_string(st));
  }
  // Freed only once nothing of the call can still use them (cudaFree would wait for the device).
  if (!s || cudaStreamQuery(s) == cudaSuccess) {
    for (void* p : bufs) cudaFree(p);
    if (s) cudaStreamDestroy(s);
  } else {
    cudaGetLastError();
    WEFT_WARN(kInit, "rank %d: %s: its stream is still busy; its scratch buffers are left allocated", ctx.rank(), what);
  }
  return st;
}

// Whether any two ranks of the whole job use one GPU (collective over `boot`; every rank gets the same
// answer): ranks of other rank groups are not in a group's own check (runtime::Context), yet their
// GEMMs share the SMs, and the plan rank 0 decides must hold for every rank.
Status job_shares_gpus(bootstrap::Bootstrap& boot, int device, bool* shared) {
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus - 1, device) != cudaSuccess) return Status::kCudaError;
  const std::string me = std::to_string(boot.info().node) + "/" + bus;
  std::vector<bootstrap::Blob> all;
  WEFT_CHECK(boot.allgather("weft.api.gpus", bootstrap::Blob(me.begin(), me.end()), &all));
  std::sort(all.begin(), all.end());
  *shared = std::adjacent_find(all.begin(), all.end()) != all.end();
  return Status::kOk;
}

}  // namespace

Context::Context() : impl_(new Impl()) {}
Context::~Context() {
  impl_->ctx.reset();
  impl_->group.reset();
  impl_->boot.reset();
}

Status Context::create(const Options& options, std::unique_ptr<Context>* out) {
  if (!bootstrap::started_under_pmix()) {
    WEFT_WARN(kInit,
              "weft::Context: this process was not started in a job (no PMIx server): launch it with `weftrun exec "
              "-n N -- PROGRAM`, `srun --mpi=pmix` or `mpirun`");
    return Status::kNotFound;
  }
  std::unique_ptr<Context> c(new Context());
  WEFT_CHECK(bootstrap::PmixBootstrap::connect(&c->impl_->boot));
  bootstrap::Bootstrap& boot = *c->impl_->boot;
  const int rank = boot.info().rank;
  if (options.group_nodes != 0 || options.group_gpus != 0) {
    // The job's shape as the launcher placed it: nodes x ranks per node (block placement is checked
    // by GroupBootstrap::create on every rank).
    bootstrap::GroupShape& g = c->impl_->shape;
    g.nodes = boot.info().num_nodes;
    g.gpus_per_node = boot.info().local_size;
    g.group_nodes = options.group_nodes;
    g.group_gpus = options.group_gpus;
    std::string why;
    if (options.group_nodes < 1 || options.group_gpus < 1 ||
        bootstrap::GroupBootstrap::create(&boot, g, &c->impl_->group, &why) != Status::kOk) {
      WEFT_WARN(kInit, "rank %d: weft::Context: rank group %d x %d: %s", rank, options.group_nodes, options.group_gpus,
                why.empty() ? "both sides must be at least 1 (0 x 0: no groups)" : why.c_str());
      boot.abort("rank group refused");
      return Status::kInvalidArgument;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    WEFT_WARN(kInit, "rank %d: weft::Context needs a GPU and this rank sees none", rank);
    boot.abort("no GPU");
    return Status::kUnsupported;
  }
  c->impl_->gpu = boot.info().local_rank % count;
  if (cudaSetDevice(c->impl_->gpu) != cudaSuccess) {
    WEFT_WARN(kInit, "rank %d: cannot bind CUDA device %d", rank, c->impl_->gpu);
    boot.abort("cannot bind its GPU");
    return Status::kCudaError;
  }
  uint64_t heap = options.heap_bytes;
  if (heap == 0) {
    int64_t env = 0;
    WEFT_CHECK(get_param("WEFT_HEAP_BYTES", &env));
    heap = env > 0 ? uint64_t(env) : (uint64_t(1) << 30);
  }
  WEFT_CHECK(runtime::Context::create(c->impl_->op_boot(), heap, &c->impl_->ctx));
  WEFT_CHECK(job_shares_gpus(boot, c->impl_->gpu, &c->impl_->shared_gpus));
  if (c->impl_->shared_gpus) c->impl_->ctx->note_shared_gpu();
  *out = std::move(c);
  return Status::kOk;
}

int Context::rank() const { return impl_->op_info().rank; }
int Context::size() const { return impl_->op_info().size; }
int Context::local_rank() const { return impl_->op_info().local_rank; }
int Context::gpu() const { return impl_->gpu; }
int Context::job_rank() const { return impl_->boot->info().rank; }
int Context::group() const {
  return impl_->group ? bootstrap::group_position(impl_->shape, impl_->boot->info().rank).group : 0;
}
int Context::groups() const { return impl_->group ? impl_->shape.num_groups() : 1; }
bool Context::failed() const { return impl_->ctx->poisoned(); }
std::string Context::failure() const { return impl_->ctx->poison_reason(); }
void Context::abort(const std::string& why) { impl_->ctx->abort(why); }
runtime::Context& Context::get() { return *impl_->ctx; }

Status Context::alloc(uint64_t bytes, void** out, std::string* error) {
  *out = nullptr;
  WEFT_CHECK(impl_->ctx->check_usable("alloc"));
  if (bytes == 0 || bytes > impl_->ctx->heap_bytes()) {
    *error = "alloc of " + std::to_string(bytes) + " bytes: must be 1 to the heap's " +
             std::to_string(impl_->ctx->heap_bytes()) + " bytes";
    return Status::kInvalidArgument;
  }
  uint64_t offset = 0;
  const Status st = impl_->ctx->reserve(bytes, "weft::Context::alloc", &offset);
  if (st != Status::kOk) {
    *error = "alloc of " + std::to_string(bytes) + " bytes: the symmetric heap (" +
             std::to_string(impl_->ctx->heap_bytes()) + " bytes, " + std::to_string(impl_->ctx->reserved_bytes()) +
             " reserved) has no room, or the ranks asked for different sizes (see the log)";
    return st;
  }
  *out = impl_->ctx->local(offset);
  impl_->allocs.emplace_back(*out, offset);
  return Status::kOk;
}

Status Context::free(void* p) {
  for (size_t i = 0; i < impl_->allocs.size(); ++i)
    if (impl_->allocs[i].first == p) {
      impl_->ctx->release(impl_->allocs[i].second);
      impl_->allocs.erase(impl_->allocs.begin() + long(i));
      return Status::kOk;
    }
  WEFT_WARN(kInit, "rank %d: weft::Context::free: %p is not an allocation of this context", rank(), p);
  return Status::kInvalidArgument;
}

void* Context::peer(int q, const void* p) const {
  const auto* c = static_cast<const char*>(p);
  const auto* base = static_cast<const char*>(impl_->ctx->local(0));
  if (q < 0 || q >= size() || c < base || c >= base + impl_->ctx->heap_bytes()) return nullptr;
  return impl_->ctx->peer(q, uint64_t(c - base));
}

Status Context::register_buffer(const void* p, uint64_t bytes, std::string* error) {
  return impl_->ctx->register_buffer(p, bytes, error);
}

void Context::unregister_buffer(const void* p) { impl_->ctx->unregister_buffer(p); }

Status Context::plan(const std::string& workload_yaml, Plan* out, std::string* error) {
  WEFT_CHECK(impl_->ctx->check_usable("plan"));
  runtime::Plan decided;
  std::string why;
  bool have = false;
  if (job_rank() == 0) {
    runtime::Workload w;
    if (runtime::load_workload(workload_yaml, &w, &why) == Status::kOk) {
      runtime::DecideOptions d;
      d.share_gpus = impl_->shared_gpus;
      d.heap_budget = impl_->ctx->heap_bytes() - std::min(impl_->ctx->heap_bytes(), impl_->ctx->reserved_bytes());
      runtime::TuneMachine machine;
      if (runtime::this_machine(&machine)) d.machine = &machine;
      bool bad_input = true;
      have = runtime::decide_plan(w, d, &decided, &why, &bad_input) == Status::kOk;
    }
  }
  WEFT_CHECK(runtime::share_plan(*impl_->boot, have ? &decided : nullptr, why, out->p_.get(), error));
  return runtime::check_plan_group(*out->p_, impl_->group ? &impl_->shape : nullptr, impl_->boot->info().size, error)
             ? Status::kOk
             : Status::kInvalidArgument;
}

Status Context::share(const Plan& plan, Plan* out, std::string* error) {
  WEFT_CHECK(impl_->ctx->check_usable("share"));
  WEFT_CHECK(runtime::share_plan(*impl_->boot, job_rank() == 0 ? &plan.get() : nullptr, "", out->p_.get(), error));
  return runtime::check_plan_group(*out->p_, impl_->group ? &impl_->shape : nullptr, impl_->boot->info().size, error)
             ? Status::kOk
             : Status::kInvalidArgument;
}

AgGemm::AgGemm() = default;
AgGemm::~AgGemm() = default;

Status AgGemm::create(Context& ctx, const Plan& plan, std::unique_ptr<AgGemm>* out) {
  std::unique_ptr<AgGemm> op(new AgGemm());
  op->ctx_ = &ctx.get();
  WEFT_CHECK(runtime::AgGemmOp::create(ctx.get(), plan.get(), &op->op_));
  op->m_ = plan.get().gemm.m;
  op->n_ = plan.get().gemm.n / plan.get().world_size;
  op->k_ = plan.get().gemm.k;
  runtime::AgGemmOp* raw = op->op_.get();
  const uint64_t n = uint64_t(op->n_), k = uint64_t(op->k_), m = uint64_t(op->m_);
  WEFT_CHECK(warm_up(
      ctx.get(), "AgGemm's call at creation", {n * k * 2, m * n * 2},
      [&](const std::vector<void*>& b, cudaStream_t s) {
        return raw->run(static_cast<const __nv_bfloat16*>(raw->shard()), static_cast<const __nv_bfloat16*>(b[0]),
                        static_cast<__nv_bfloat16*>(b[1]), s);
      },
      [raw] { raw->unstick(); }));
  *out = std::move(op);
  return Status::kOk;
}

Status AgGemm::run(const void* a, const void* b, void* c, Stream stream) {
  const uint64_t w = uint64_t(ctx_->size());
  WEFT_CHECK(ctx_->check_buffer(a, uint64_t(m_) / w * uint64_t(k_) * 2, "AgGemm::run's a"));
  WEFT_CHECK(ctx_->check_buffer(b, uint64_t(n_) * uint64_t(k_) * 2, "AgGemm::run's b"));
  WEFT_CHECK(ctx_->check_buffer(c, uint64_t(m_) * uint64_t(n_) * 2, "AgGemm::run's c"));
  return ordered(*ctx_, stream, [&] {
    return op_->run(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b),
                    static_cast<__nv_bfloat16*>(c), stream);
  });
}
void* AgGemm::a_shard() const { return op_->shard(); }
int64_t AgGemm::m() const { return m_; }
int64_t AgGemm::n_local() const { return n_; }
int64_t AgGemm::k() const { return k_; }

GemmReduce::GemmReduce() = default;
GemmReduce::~GemmReduce() = default;

Status GemmReduce::create(Context& ctx, const Plan& plan, std::unique_ptr<GemmReduce>* out) {
  std::unique_ptr<GemmReduce> op(new GemmReduce());
  op->ctx_ = &ctx.get();
  WEFT_CHECK(runtime::GemmReduceOp::create(ctx.get(), plan.get(), &op->op_));
  const runtime::Plan& p = plan.get();
  op->m_ = p.gemm.m;
  op->n_ = p.gemm.n;
  op->k_ = p.gemm.k / p.world_size;
  op->rows_ = op->op_->all_reduce() ? p.gemm.m : p.gemm.m / p.world_size;
  runtime::GemmReduceOp* raw = op->op_.get();
  const uint64_t m = uint64_t(op->m_), n = uint64_t(op->n_), k = uint64_t(op->k_), rows = uint64_t(op->rows_);
  WEFT_CHECK(warm_up(
      ctx.get(), "GemmReduce's call at creation", {m * k * 2, n * k * 2, rows * n * 2},
      [&](const std::vector<void*>& b, cudaStream_t s) {
        return raw->run(static_cast<const __nv_bfloat16*>(b[0]), static_cast<const __nv_bfloat16*>(b[1]),
                        static_cast<__nv_bfloat16*>(b[2]), s);
      },
      [raw] { raw->unstick(); }));
  *out = std::move(op);
  return Status::kOk;
}

Status GemmReduce::run(const void* a, const void* b, void* c, Stream stream) {
  WEFT_CHECK(ctx_->check_buffer(a, uint64_t(m_) * uint64_t(k_) * 2, "GemmReduce::run's a"));
  WEFT_CHECK(ctx_->check_buffer(b, uint64_t(n_) * uint64_t(k_) * 2, "GemmReduce::run's b"));
  WEFT_CHECK(ctx_->check_buffer(c, uint64_t(rows_) * uint64_t(n_) * 2, "GemmReduce::run's c"));
  return ordered(*ctx_, stream, [&] {
    return op_->run(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b),
                    static_cast<__nv_bfloat16*>(c), stream);
  });
}
bool GemmReduce::all_reduce() const { return op_->all_reduce(); }
int64_t GemmReduce::m() const { return m_; }
int64_t GemmReduce::n() const { return n_; }
int64_t GemmReduce::k_local() const { return k_; }
int64_t GemmReduce::c_rows() const { return rows_; }
void* GemmReduce::heap_c() const { return op_->heap_c(); }

Moe::Moe() = default;
Moe::~Moe() = default;

Status Moe::create(Context& ctx, const Plan& plan, const Weights& w, std::unique_ptr<Moe>* out) {
  using bf16 = __nv_bfloat16;
  std::unique_ptr<Moe> op(new Moe());
  runtime::MoeWeights mw;
  mw.router = static_cast<const bf16*>(w.router);
  mw.gate = static_cast<const bf16*>(w.gate);
  mw.up = static_cast<const bf16*>(w.up);
  mw.down = static_cast<const bf16*>(w.down);
  op->ctx_ = &ctx.get();
  WEFT_CHECK(runtime::MoeOp::create(ctx.get(), plan.get(), mw, &op->op_));
  const runtime::Plan& p = plan.get();
  op->t_ = p.moe.tokens / p.world_size;
  op->h_ = p.moe.hidden;
  op->k_ = p.moe.topk;
  runtime::MoeOp* raw = op->op_.get();
  const uint64_t rows = uint64_t(op->t_) * uint64_t(op->h_) * 2;
  WEFT_CHECK(warm_up(
      ctx.get(), "Moe's call at creation", {rows, rows},
      [&](const std::vector<void*>& b, cudaStream_t s) {
        return raw->run(static_cast<const __nv_bfloat16*>(b[0]), static_cast<__nv_bfloat16*>(b[1]), s);
      },
      [raw] { raw->unstick(); }));
  *out = std::move(op);
  return Status::kOk;
}

Status Moe::run(const void* x, void* out, Stream stream) {
  WEFT_CHECK(ctx_->check_buffer(x, uint64_t(t_) * uint64_t(h_) * 2, "Moe::run's x"));
  WEFT_CHECK(ctx_->check_buffer(out, uint64_t(t_) * uint64_t(h_) * 2, "Moe::run's out"));
  return ordered(*ctx_, stream, [&] {
    return op_->run(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(out), stream);
  });
}
const int32_t* Moe::topk_ids() const { return op_->topk_ids(); }
const float* Moe::topk_weights() const { return op_->topk_weights(); }
int64_t Moe::tokens_local() const { return t_; }
int64_t Moe::hidden() const { return h_; }
int64_t Moe::topk() const { return k_; }

}  // namespace weft
