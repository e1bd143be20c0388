// The verbs function table filled from libibverbs, and the switch tests use to put a fake in its place.
#include "transport/ibverbs_api.h"

#include <atomic>

namespace weft::transport::ibv {
namespace {

std::atomic<const Api*> g_installed{nullptr};

}  // namespace

const Api& libibverbs_api() {
  // Lambdas wrap the entries libibverbs defines as macros or static inline functions.
  static const Api table = {
      "libibverbs",
      [](int* n) { return ibv_get_device_list(n); },
      [](ibv_device** l) { ibv_free_device_list(l); },
      [](ibv_device* d) { return ibv_get_device_name(d); },
      [](ibv_device* d) { return ibv_open_device(d); },
      [](ibv_context* c) { return ibv_close_device(c); },
      [](ibv_context* c, ibv_device_attr* a) { return ibv_query_device(c, a); },
      [](ibv_context* c, uint8_t p, ibv_port_attr* a) { return ibv_query_port(c, p, a); },
      [](ibv_context* c, uint32_t p, uint32_t i, ibv_gid_entry* e, uint32_t f) {
        return ibv_query_gid_ex(c, p, i, e, f);
      },
      [](ibv_context* c, ibv_gid_entry* e, size_t n, uint32_t f) { return ibv_query_gid_table(c, e, n, f); },
      [](ibv_context* c) { return ibv_alloc_pd(c); },
      [](ibv_pd* p) { return ibv_dealloc_pd(p); },
      [](ibv_context* c, int n, void* x, ibv_comp_channel* ch, int v) { return ibv_create_cq(c, n, x, ch, v); },
      [](ibv_cq* q) { return ibv_destroy_cq(q); },
      [](ibv_pd* p, void* a, size_t n, int acc) { return ibv_reg_mr(p, a, n, acc); },
      [](ibv_pd* p, uint64_t o, size_t n, uint64_t iova, int fd, int acc) {
        return ibv_reg_dmabuf_mr(p, o, n, iova, fd, acc);
      },
      [](ibv_mr* m) { return ibv_dereg_mr(m); },
      [](ibv_pd* p, ibv_qp_init_attr* a) { return ibv_create_qp(p, a); },
      [](ibv_qp* q, ibv_qp_attr* a, int m) { return ibv_modify_qp(q, a, m); },
      [](ibv_qp* q) { return ibv_destroy_qp(q); },
      [](ibv_qp* q, ibv_send_wr* w, ibv_send_wr** bad) { return ibv_post_send(q, w, bad); },
      [](ibv_cq* q, int n, ibv_wc* wc) { return ibv_poll_cq(q, n, wc); },
      [](ibv_wc_status s) { return ibv_wc_status_str(s); },
      [](ibv_qp* q, ibv_recv_wr* w, ibv_recv_wr** bad) { return ibv_post_recv(q, w, bad); },
  };
  return table;
}

const Api& api() {
  const Api* t = g_installed.load(std::memory_order_acquire);
  return t ? *t : libibverbs_api();
}

void set_api_for_testing(const Api* table) { g_installed.store(table, std::memory_order_release); }

}  // namespace weft::transport::ibv
