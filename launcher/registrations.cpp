// The one list of op runners and transport checks linked into weftrun. Registration is explicit
// (no static initialisers) so that nothing is silently dropped by the linker from a static library.
#include "launcher/check_hooks.h"
#include "launcher/op_registry.h"
#include "transport/transport_check.h"
#if WEFT_HAVE_OPS
#include "runtime/ops/ops.h"
#endif

namespace weft::launcher {

void register_builtin_ops() {
  // Fused kernels add one line each.
#if WEFT_HAVE_OPS
  register_op("ag_gemm", runtime::ops::run_ag_gemm);
  register_op("gemm_rs", runtime::ops::run_gemm_rs);
  register_op("gemm_ar", runtime::ops::run_gemm_ar);
  register_op("moe", runtime::ops::run_moe);
#endif
}

void set_bench_seed(uint64_t seed) {
#if WEFT_HAVE_OPS
  runtime::ops::set_bench_seed(seed);
#else
  (void)seed;  // no runner in this build to draw inputs
#endif
}

void register_builtin_check_transports() {
  // Transports add one line each, e.g.: register_check_transport("socket", transport::check_socket);
  register_check_transport("socket",
                           [](const RankContext&, bootstrap::Bootstrap& boot, int iters, CheckTransportReport* r) {
                             return transport::run_transport_check_report("socket", boot, iters, &r->summary, &r->json);
                           });
  register_check_transport(
      "ibverbs", [](const RankContext&, bootstrap::Bootstrap& boot, int iters, CheckTransportReport* r) {
        return transport::run_transport_check_report("ibverbs", boot, iters, &r->summary, &r->json);
      });
  register_check_transport("ofi",
                           [](const RankContext&, bootstrap::Bootstrap& boot, int iters, CheckTransportReport* r) {
                             return transport::run_transport_check_report("ofi", boot, iters, &r->summary, &r->json);
                           });
  register_check_transport("auto",
                           [](const RankContext&, bootstrap::Bootstrap& boot, int iters, CheckTransportReport* r) {
                             return transport::run_transport_check_report("auto", boot, iters, &r->summary, &r->json);
                           });
}

}  // namespace weft::launcher
