// Writes the binary fuzz seeds from weft's own encoders: every wire-message kind, every endpoint kind,
// bootstrap frames and every FIFO op (run: fuzz_make_seeds tests/fuzz/corpus; the output is committed).
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap/blob.h"
#include "transport/fifo_command.h"
#include "transport/net_backend.h"
#include "transport/socket_wire.h"

using namespace weft;
using namespace weft::transport;

namespace {

std::string g_root;

void put(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  mkdir((g_root + "/" + dir).c_str(), 0755);
  const std::string path = g_root + "/" + dir + "/" + name;
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) return perror(path.c_str());
  fwrite(bytes.data(), 1, bytes.size(), f);
  fclose(f);
}

template <typename T>
void append(std::vector<uint8_t>* out, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof v);
}

void wire_seeds() {
  constexpr uint64_t kSecret = 0x5eed5eed5eed5eedull;  // fuzz_socket_wire.cpp expects it
  auto hdr = [&](WireKind k, uint64_t off, uint64_t len) { return make_wire_header(k, 1, 0, kSecret, off, len); };
  std::vector<uint8_t> hello;
  append(&hello, hdr(WireKind::kHello, 0, 0));
  put("socket_wire", "hello", hello);
  std::vector<uint8_t> s = hello;
  append(&s, hdr(WireKind::kPut, 64, 16));
  s.insert(s.end(), 16, 0xab);
  put("socket_wire", "hello_put", s);
  s = hello;
  append(&s, hdr(WireKind::kSignal, 128, 7));
  put("socket_wire", "hello_signal", s);
  s = hello;
  append(&s, hdr(WireKind::kPut, 0, 8));
  s.insert(s.end(), 8, 1);
  append(&s, hdr(WireKind::kSignal, 8, 1));
  append(&s, hdr(WireKind::kBye, 0, 0));
  put("socket_wire", "hello_put_signal_bye", s);
  s = hello;
  const std::string why = "rank 1: it failed";
  append(&s, hdr(WireKind::kAbort, 0, why.size()));
  s.insert(s.end(), why.begin(), why.end());
  put("socket_wire", "hello_abort", s);
  s = hello;
  append(&s, hdr(WireKind::kPut, (1 << 16) - 8, 16));  // one past the region's end
  s.insert(s.end(), 16, 0xcd);
  put("socket_wire", "hello_put_out_of_region", s);
  s.clear();
  append(&s, hdr(WireKind::kPut, 0, 8));  // no hello first
  put("socket_wire", "put_without_hello", s);
}

void peer_info_seeds() {
  SocketPeerInfo sock;
  sock.ipv4 = {htobe32(0xc6120001), htobe32(0x7f000001)};
  sock.port = 40000;
  put("peer_info", "socket", encode_peer_info(1, 0, sock));
  IbvPeerInfo ib;
  ib.lid = 7;
  ib.mtu = 5;
  ib.gid[15] = 1;
  ib.heap_addr = 0x7f0000000000ull;
  ib.rkey = 0x1234;
  ib.qps = {{0, 11, 1}, {2, 13, 3}, {3, 14, 4}};
  put("peer_info", "ibverbs", encode_peer_info(1, 1, ib));
  ib.flags = IbvPeerInfo::kIbvSignalsBySend;  // a GPU heap below owner RDMA write ordering
  put("peer_info", "ibverbs_signals_by_send", encode_peer_info(1, 1, ib));
  put("peer_info", "loopback", encode_peer_info(1, 0, LoopbackPeerInfo{99, 4242}));
  OfiPeerInfo ofi;  // a tcp endpoint (a sockaddr_in), offsets, and a device heap's staging ring
  ofi.addr = {2, 0, 0x9c, 0x40, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  ofi.provider = "tcp;ofi_rxm";
  ofi.stage_slots = 8;
  ofi.stage_slot_bytes = 256 << 10;
  ofi.heap_memory = OfiPeerInfo::kDeviceHeapStaged;
  put("peer_info", "ofi", encode_peer_info(1, 1, ofi));
  bootstrap::BlobWriter w;  // a bootstrap put entry: rank, then the bytes
  w.u32(1);
  w.bytes({1, 2, 3});
  put("peer_info", "put_entry", bootstrap::seal_blob(1, 1, w.blob()));
  bootstrap::BlobWriter r;  // a check report: strings and numbers
  r.u32(3);
  r.str("node0");
  r.str("0000:00:06.0");
  r.u64(12345);
  put("peer_info", "report", bootstrap::seal_blob(0x4348, 1, r.blob()));
}

void fifo_seeds() {
  for (uint8_t mode = 0; mode < 3; ++mode) {
    std::vector<uint8_t> s = {mode};
    auto add = [&](const FifoCommand& c) { append(&s, c); };
    add(make_fifo_command(FifoOp::kPut, 0, 0, 4096, 256, 0, 0));
    add(make_fifo_command(FifoOp::kSignal, 2, 0, 0, 0, 64, 1));
    add(make_fifo_command(FifoOp::kPutSignal, 3, 128, 128, 64, 72, 2));
    add(make_fifo_command(FifoOp::kFlush, 0, 0, 0, 0, 0, 0));
    add(make_fifo_command(FifoOp::kPut, 2, 0, 0, 0, 0, 0));  // empty put: dropped
    put("fifo_command", "all_ops_mode" + std::to_string(mode), s);
  }
  std::vector<uint8_t> bad = {2};
  append(&bad, make_fifo_command(FifoOp::kPut, 1, 0, 0, 8, 0, 0));  // to itself
  put("fifo_command", "put_to_self", bad);
  bad = {1};
  FifoCommand unknown = make_fifo_command(FifoOp::kSignal, 0, 0, 0, 0, 8, 1);
  unknown.word = make_command_word(static_cast<FifoOp>(9), 0);
  append(&bad, unknown);
  put("fifo_command", "unknown_op", bad);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_make_seeds CORPUS_DIR\n");
    return 2;
  }
  g_root = argv[1];
  wire_seeds();
  peer_info_seeds();
  fifo_seeds();
  return 0;
}
