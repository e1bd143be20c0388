// The verbs calls the ibverbs backend makes, as one table of function pointers: libibverbs in a build
// with it, or a stand-in (the tests' fake verbs) installed with set_api_for_testing.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

namespace weft::transport::ibv {

// Every verbs entry point the backend uses; nothing in the backend calls libibverbs except through
// this table (the static inline verbs, ibv_post_send and ibv_poll_cq among them, are wrapped too).
struct Api {
  const char* name;  // "libibverbs", or the stand-in's name
  ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* dev);
  ibv_context* (*open_device)(ibv_device* dev);
  int (*close_device)(ibv_context* ctx);
  int (*query_device)(ibv_context* ctx, ibv_device_attr* attr);
  int (*query_port)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr);
  // One GID table entry with its type and netdev (rdma-core >= 32).
  int (*query_gid_ex)(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags);
  // Every valid GID entry of every port; returns the count or a negative errno.
  ssize_t (*query_gid_table)(ibv_context* ctx, ibv_gid_entry* entries, size_t max_entries, uint32_t flags);
  ibv_pd* (*alloc_pd)(ibv_context* ctx);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_cq* (*create_cq)(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector);
  int (*destroy_cq)(ibv_cq* cq);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(ibv_qp* qp);
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc);
  const char* (*wc_status_str)(ibv_wc_status status);
  // Receives for signals sent as SENDs (a device heap whose GPU needs a flush before the flag).
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
};

// libibverbs itself.
const Api& libibverbs_api();
// The table the backend uses now: the one installed for testing, else libibverbs_api().
const Api& api();
// Installs `table` for every backend created afterwards (and for ibverbs_device_present); nullptr
// restores libibverbs. Tests only: not thread-safe against backends being created at the same time.
void set_api_for_testing(const Api* table);

}  // namespace weft::transport::ibv
