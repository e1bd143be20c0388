// The ofi backend's decisions as pure functions (signal ordering from the provider's attributes, target addresses),
// and its test-only switches and wiring record.
#pragma once

#include <cstdint>
#include <string>

namespace weft::transport {

// How a fenced signal is kept behind the puts posted before it to the same peer.
enum class OfiOrdering : int {
  kFence = 0,   // the provider offers FI_FENCE: the signal carries it
  kWriteOrder,  // the provider orders write after write (FI_ORDER_WAW) up to max_order_waw_size
  kDelivery,    // neither: the puts complete with FI_DELIVERY_COMPLETE and the signal waits for them
};
const char* to_string(OfiOrdering o);

// What the provider said about ordering (fi_info caps, tx_attr->msg_order, ep_attr->max_order_waw_size).
struct OfiOrderTraits {
  bool fence = false;
  bool write_after_write = false;
  uint64_t max_order_waw_size = 0;
};

// FI_FENCE where offered, else the write-after-write order, else waiting for delivery.
OfiOrdering choose_ofi_ordering(const OfiOrderTraits& t);

// Whether the FI_FENCE that provider `prov_name` offers may be relied on (OfiOrderTraits::fence is
// its caps and this). Not the sockets provider's: its fenced write takes the connection to the
// peer, then waits until every earlier write has been acknowledged, and the acknowledgements of the
// peer's writes to this rank go out on that same connection where the two ranks share one. Two
// ranks fencing towards each other each hold back the acknowledgement the other waits for, and both
// hang (test_transport_ofi's 3-rank exchange, fenced or batched: about 1 run in 12). Its
// write-after-write order orders the signals instead.
bool ofi_fence_usable(const std::string& prov_name);

// A put of `bytes` must complete with FI_DELIVERY_COMPLETE (and fenced signals behind it wait for
// that completion) unless the provider's write order covers its size, or a fence will order it and
// the proxy does not rely on its completion (`proxy_waits`: serial mode posts unfenced signals
// after the put's completion, so that completion must mean the data is in place).
bool ofi_put_needs_delivery(OfiOrdering o, const OfiOrderTraits& t, uint64_t bytes, bool proxy_waits);

// The target address of heap offset `offset`: the peer's heap base plus the offset where the
// provider uses virtual addresses (FI_MR_VIRT_ADDR), else the offset into the registration.
inline uint64_t ofi_target_addr(bool virt_addr, uint64_t heap_base, uint64_t offset) {
  return virt_addr ? heap_base + offset : offset;
}

// Test-only switches (never an environment parameter): they let the tests drive the paths a
// provider here does not choose by itself. Set them before creating a backend.
struct OfiTestSwitches {
  int virt_addr = -1;       // -1: as the provider says; 0: hints without FI_MR_VIRT_ADDR (offsets);
                            // 1: the domain opened with FI_MR_VIRT_ADDR (virtual addresses)
  int force_ordering = -1;  // -1: choose_ofi_ordering; else an OfiOrdering the provider supports
  int idle_progress = 1;    // 0: the completion queue is read only while this rank has operations of
                            // its own (a receiver is then never progressed: the test that it is)
  // The other mr_mode bits weft honours, forced on (-1: as the provider says; 1: the domain opened
  // with the bit, so weft takes that path whether or not the provider needs it). No provider here
  // can be asked to require them through hints.
  int prov_key = -1;     // FI_MR_PROV_KEY: request no key, publish the key fi_mr_reg returned
  int mr_local = -1;     // FI_MR_LOCAL: pass each local buffer's registration descriptor
  int mr_endpoint = -1;  // FI_MR_ENDPOINT: bind each registration to the endpoint and enable it
  // A mistake made on purpose (the test that the FI_MR_PROV_KEY path matters): publish the key weft
  // requests where the provider does not choose (ofi::kHeapKey, ...) instead of the registration's.
  int publish_requested_key = 0;
  // Wrap each endpoint in the descriptor-checking shim (transport/ofi_desc_check.h), and a mistake
  // made on purpose for it to find: puts from the heap without the heap's descriptor.
  int check_descriptors = 0;
  int drop_heap_descriptor = 0;
  // With mr_endpoint = 1: the shim answers each registration's fi_mr_bind and fi_mr_enable (which
  // no provider here implements for registrations) and checks that every buffer and remote key a
  // call names belongs to a registration bound to the endpoint and enabled first; and a mistake made
  // on purpose for it to find: registrations bound but never enabled.
  int emulate_mr_binding = 0;
  int skip_mr_enable = 0;
  // Rank whose first put (the preflight's) is posted first_put_delay_s late, its endpoint progressed
  // meanwhile: its peers have finished their own preflight writes by then and wait for the ranks'
  // agreement; -1: none.
  int delay_first_put_rank = -1;
  double first_put_delay_s = 0;
  // A device heap: -1 registered with the provider where it takes device memory (FI_HMEM), else
  // staged through host memory; 0: staged even where FI_HMEM is offered.
  int hmem = -1;
};
void set_ofi_test_switches(const OfiTestSwitches& s);
OfiTestSwitches ofi_test_switches();

// What the ofi backends of one rank asked libfabric for, summed over its channels: recorded by the
// backend as it opens (test-only reading: lets a test hold the resource report, peer_set.h, against
// the wiring). Cumulative until reset_ofi_wiring(); closing a backend takes nothing off.
struct OfiWiring {
  uint64_t endpoints = 0;
  uint64_t completion_queues = 0, completion_entries = 0;  // fi_cq_attr.size asked
  uint64_t address_entries = 0;                            // fi_av_attr.count asked
  uint64_t registrations = 0, registered_bytes = 0;        // fi_mr_reg calls and their lengths
  uint64_t staging_bytes = 0;                              // of those, host staging rings (device heaps)
  uint64_t receives_posted = 0, receive_bytes = 0;         // control receives kept posted, their buffers
};
void add_ofi_wiring(int rank, const OfiWiring& more);
OfiWiring ofi_wiring(int rank);
void reset_ofi_wiring();

}  // namespace weft::transport
