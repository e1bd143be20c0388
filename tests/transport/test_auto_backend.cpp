// What `inter_node: auto` picks on a rank: ibverbs where a verbs device is present, else ofi where the
// libfabric provider it would open is RDMA-capable, else socket -- as a pure function, and on this machine.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "local_bootstrap.h"
#include "transport/net_backend.h"
#include "transport/transport.h"

using weft::Status;
namespace tr = weft::transport;

TEST_CASE("RDMA-capable libfabric providers: efa, verbs, cxi, psm3, also under a utility provider") {
  for (const char* p : {"efa", "verbs", "verbs;ofi_rxm", "verbs;ofi_rxd", "cxi", "psm3", "ofi_rxm;verbs"}) {
    CAPTURE(p);
    CHECK(tr::ofi_provider_is_rdma(p));
  }
  for (const char* p : {"tcp", "tcp;ofi_rxm", "udp;ofi_rxd", "sockets", "shm", "ofi_rxm", "", ";", "verbsx", "efa2"}) {
    CAPTURE(p);
    CHECK_FALSE(tr::ofi_provider_is_rdma(p));
  }
}

TEST_CASE("auto_backend_choice: ibverbs, then an RDMA-capable ofi provider, then socket, each saying why") {
  std::string why;
  const std::vector<std::string> efa = {"efa", "tcp;ofi_rxm", "shm"};
  const std::vector<std::string> debian = {"tcp;ofi_rxm", "udp;ofi_rxd", "shm", "sockets", "tcp"};
  CHECK(tr::auto_backend_choice(true, "", efa, "", &why) == "ibverbs");
  CHECK(why.find("RDMA device") != std::string::npos);

  CHECK(tr::auto_backend_choice(false, "no RDMA device", efa, "", &why) == "ofi");
  CHECK(why.find("no RDMA device") != std::string::npos);
  CHECK(why.find("provider efa is RDMA-capable (libfabric's first choice)") != std::string::npos);

  CHECK(tr::auto_backend_choice(false, "no RDMA device", debian, "", &why) == "socket");
  CHECK(why.find("libfabric offers tcp;ofi_rxm, udp;ofi_rxd, shm, sockets, tcp: none RDMA-capable") !=
        std::string::npos);

  // An RDMA-capable provider that is not libfabric's first choice: the ofi backend would open tcp.
  const std::vector<std::string> second = {"tcp;ofi_rxm", "verbs;ofi_rxm"};
  CHECK(tr::auto_backend_choice(false, "no RDMA device", second, "", &why) == "socket");
  CHECK(why.find("the ofi backend would open tcp;ofi_rxm, which is not RDMA-capable") != std::string::npos);
  CHECK(why.find("WEFT_OFI_PROVIDER=verbs;ofi_rxm") != std::string::npos);
  // ... unless WEFT_OFI_PROVIDER names it.
  CHECK(tr::auto_backend_choice(false, "no RDMA device", second, "verbs;ofi_rxm", &why) == "ofi");
  CHECK(why.find("(WEFT_OFI_PROVIDER)") != std::string::npos);
  // WEFT_OFI_PROVIDER naming a provider that is not here, or a non-RDMA one.
  CHECK(tr::auto_backend_choice(false, "no RDMA device", efa, "cxi", &why) == "socket");
  CHECK(why.find("libfabric offers efa, tcp;ofi_rxm, shm: not WEFT_OFI_PROVIDER=cxi") != std::string::npos);
  CHECK(tr::auto_backend_choice(false, "no RDMA device", efa, "shm", &why) == "socket");
  // Nothing from libfabric (not built, or no provider).
  CHECK(tr::auto_backend_choice(false, "ibv_get_device_list: Function not implemented", {}, "", &why) == "socket");
  CHECK(why.find("ibv_get_device_list: Function not implemented") != std::string::npos);
  CHECK(why.find("libfabric offers no provider") != std::string::npos);
}

TEST_CASE("on this machine (no RDMA device, libfabric with tcp/udp/shm-like providers only): auto stays socket") {
  std::string why;
  const std::string mine = tr::auto_backend_here(&why);
  if (mine != "socket") {
    MESSAGE("SKIPPED: this machine has RDMA (" << mine << ": " << why << ")");
    return;
  }
  INFO(why);
  CHECK(why.find("libfabric") != std::string::npos);
  for (const auto& p : tr::ofi_provider_list()) {
    CAPTURE(p);
    CHECK_FALSE(tr::ofi_provider_is_rdma(p));  // why socket: none of them moves data by RDMA
  }
  // The same decision through Transport, collectively, with the reason every rank reports.
  std::vector<std::string> backend(2), reason(2);
  auto st = weft::testing::run_threads(2, 1, [&](weft::bootstrap::Bootstrap& boot) -> Status {
    const int me = boot.info().rank;
    std::vector<uint64_t> mem(512, 0);
    tr::TransportOptions o;
    o.backend = "auto";
    o.timeout_s = 10;
    o.use_topology = false;
    std::unique_ptr<tr::Transport> t;
    WEFT_CHECK(tr::Transport::create(boot, tr::Region{mem.data(), mem.size() * 8, tr::MemKind::kHost}, o, &t));
    backend[me] = t->backend_name();
    reason[me] = t->backend_reason();
    WEFT_CHECK(boot.barrier("done"));
    return t->stop();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(st[r] == Status::kOk);
    CHECK(backend[r] == "socket");
    CHECK(reason[r].find("auto chose socket: rank 0 has no usable RDMA device (") != std::string::npos);
    CHECK(reason[r].find("libfabric") != std::string::npos);
    CHECK(reason[r].find("none RDMA-capable") != std::string::npos);
  }
}
